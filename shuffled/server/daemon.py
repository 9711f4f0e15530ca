"""The daemon, the composition root: one buffer pool, one store, the disk behind it, the spiller,
the push shares, membership and peers, the drain, and listeners for clients and peers. What each
part does lives in its room: storage/, serving/, cluster/ and accounting/.

`stats()` is the one snapshot of everything the daemon counts (a `DaemonStats`, see
accounting/stats.py): the metrics endpoint turns it into Prometheus metrics, and its wire form is
the admin `stats` answer `shuffled stats` prints.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any

from ..buffers import GlobalPool
from ..config import DATA_DIR_AUTO, DaemonConfig
from ..logs import event
from ..ops.http import OpsServer
from ..ops.metrics import DaemonMetrics
from ..ops.stats import DaemonStats, HealStats, ObjectStoreStats
from ..protocol.errors import StorageError
from .accounting.counters import Counters
from .accounting.shares import PushShares
from .accounting.stats import snapshot
from .accounting.watchdog import watch
from .cluster.drain import Drain
from .cluster.healing import Healing
from .cluster.membership import Membership
from .cluster.peers import PeerManager
from .cluster.sweep import Sweeper
from .housekeeping import Housekeeping
from .serving.admin_ops import Caller, Operation
from .serving.admission import Trust
from .serving.backlog import UnsentBudget
from .serving.connection import DaemonConnection
from .storage.disk import Disk
from .storage.object_config import ObjectStoreConfig
from .storage.objects import ObjectStore
from .storage.probe import ObjectStoreProbe
from .storage.spill import Spiller, restore
from .storage.spill_writes import SpillTarget
from .storage.store import Store
from .storage.tier import ObjectTier

log = logging.getLogger(__name__)

#: most seconds `stop` waits for the answers to `drain` requests with `wait` (they are due at once)
ANSWER_WAIT = 1.0


def _auto_listener(config: DaemonConfig) -> socket.socket | None:
    """With data-dir auto, port 0 and no advertised address, a socket bound now to a port the kernel picks,
    for `create_server(sock=...)`: the data dir is named after the address listened on, so the port must
    be known before the directory is."""
    if config.data_dir != DATA_DIR_AUTO or config.port != 0 or config.advertise:
        return None
    family, kind, proto, _, addr = socket.getaddrinfo(config.host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


def _open_disk(config: DaemonConfig, data_dir: str | None, listener: socket.socket | None) -> Disk | None:
    """The data dir's `Disk` (None: memory only); OSError saying which directory and why it is not usable."""
    try:
        return Disk(data_dir) if data_dir else None
    except OSError as exc:
        if listener is not None:
            listener.close()
        how = (
            " (data-dir auto: set --data-dir DIR, or none for memory only)" if config.data_dir == DATA_DIR_AUTO else ""
        )
        raise OSError(f"data dir {data_dir}{how} is not usable: {exc}") from exc


class Daemon:
    def __init__(self, config: DaemonConfig) -> None:
        config.validate()
        self.config = config
        segments = config.pool_size // config.segment_size
        # The exclusive buffers of at least one read from three daemons must always fit in the reserve
        # (floating buffers come from memory outside it, while there is some).
        reserve = max(int(segments * config.read_reserve), 3 * config.exclusive_buffers)
        self.pool = GlobalPool(config.pool_size, config.segment_size, reserve=min(reserve, segments // 2))
        self.store = Store(config.segment_size, config.app_memory_quota, config.app_disk_quota)
        self._listener = _auto_listener(config)
        #: where spill files live (None: memory only)
        self.data_dir = config.data_directory(self._listener.getsockname()[1] if self._listener else None)
        self.disk = _open_disk(config, self.data_dir, self._listener)
        self.store.max_partitions = config.max_partitions
        #: push memory's fair shares: floors per writer, caps per connection and application
        self.shares = PushShares(config, self.pool.total - self.pool.reserve)
        self.counters = Counters()
        self.metrics = DaemonMetrics()
        #: the object store (`object-store`), probed at start, and the tier that moves data into it
        self.objects: ObjectStore | None = None
        self.object_stats = ObjectStoreStats()
        self.tier: ObjectTier | None = None
        if config.object_store is not None:
            self.objects = ObjectStore(
                ObjectStoreConfig.of(config), self.object_stats, self.metrics.observe_object_store
            )
            self.tier = ObjectTier(self.store, self.objects, self.disk, config)
        self.object_probe = ObjectStoreProbe(self.objects, self.object_stats)
        #: what healing did (cluster/healing.py)
        self.heal_stats = HealStats()
        self.spiller = Spiller(
            self.store, self.pool, self.disk, config.spill_high, config.spill_low, self._object_target
        )
        self.store.can_spill = self.spiller.target is not None
        if self.tier is not None:
            self.tier.writer.journal = self.spiller.journals.append
            self.tier.writer.busy = self.spiller.writes.by_attempt
            self.store.moves_disk = self.disk is not None
        if self.spiller.target is not None:
            # Stored data normally sits between the spill watermarks; floating buffers may fill the pool up to
            # where background spilling starts (GlobalPool.set_floating_budget says why that is safe).
            self.pool.set_floating_budget(self.spiller.start - 1)
        self.peers: PeerManager[DaemonConnection] = PeerManager(self)
        self.connections: set[DaemonConnection] = set()
        self.unsent = UnsentBudget(config, self.connections)  # answers queued unsent (serving/backlog.py)
        self.background: set[asyncio.Task[Any]] = set()
        #: every daemon this one knows of (`peers`, `peers-dns`), itself included
        self.membership = Membership(config, config.advertise or "")
        #: whom it trusts and how each side proves itself (serving/admission.py)
        self.secret, self.peer_secret, self.drain_secret, self.peer_tls = Trust.load(config)
        self._servers: list[asyncio.AbstractServer] = []
        self.started = False
        #: SIGTERM, SIGINT or the admin `drain`: new pushes, then new client reads are refused
        self.drain = Drain(self)
        #: copies of replicated attempts lost with a daemon made again (not while draining)
        self.healing = Healing(self, self.heal_stats, lambda: not self.drain.draining)
        #: deletes what crashed daemons left in the object store
        self.sweeper = Sweeper(self, self.tier, lambda: not self.drain.draining) if self.tier is not None else None
        self.start_time = time.time()
        self.ops: OpsServer | None = None
        self.housekeeping = Housekeeping(
            config, self.store, self.spiller, self.tier, self.membership, self.object_probe, self.connections
        )
        self._watchdog: asyncio.Task[None] | None = None

    def _object_target(self, spiller: Spiller) -> SpillTarget | None:
        """Without a data dir, spills go to the object store: one object of at least a part per write (fewer
        segments only in pools too small to hold three such writes). A piece fills its segment only nearly
        (a group's header, a writer's last group), so a write takes a sixteenth more segments than a part
        holds: objects of whole parts keep spills within 64 PUTs per GiB."""
        if self.tier is None:
            return None
        usable = self.pool.total - self.pool.reserve
        part = self.tier.writer.part // self.config.segment_size
        return self.tier.spill_target(max(1, min(part + part // 16, usable // 3)))

    @property
    def node(self) -> str:
        """This daemon's advertised address: its name on the placement ring and in Spark's MapStatus."""
        return self.membership.node

    async def dial_peer(self, addr: str, host: str, port: int) -> DaemonConnection:
        """A connection to daemon `addr` at `host`:`port` (its peer TLS port with peer TLS) once the
        handshake is done; the PeerManager decides when to dial and what a failure means."""
        cfg = self.config
        tls = self.peer_tls[1] if self.peer_tls is not None else None
        _, conn = await asyncio.wait_for(
            asyncio.get_running_loop().create_connection(
                lambda: DaemonConnection(self, dialed=addr, tls=tls is not None),
                host,
                cfg.peer_tls_port if tls is not None else port,
                ssl=tls,
                server_hostname=host if tls is not None else None,
            ),
            cfg.connect_timeout,
        )
        try:
            await asyncio.wait_for(asyncio.shield(conn.ready), cfg.connect_timeout)
        except BaseException:
            conn.close("handshake did not complete")
            raise
        return conn

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        # Before listening: no request may see a half-restored store.
        restored = restore(self.store, self.disk) if self.disk else 0
        if self._listener is not None:
            server = await loop.create_server(lambda: DaemonConnection(self), sock=self._listener)
        else:
            server = await loop.create_server(lambda: DaemonConnection(self), cfg.host, cfg.port, reuse_address=True)
        self._servers.append(server)
        port = server.sockets[0].getsockname()[1]
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        self.membership.node = cfg.advertise or f"{host}:{port}"
        if self.peer_tls is not None:
            tls_server = await loop.create_server(
                lambda: DaemonConnection(self, tls=True),
                cfg.host,
                cfg.peer_tls_port,
                ssl=self.peer_tls[0],
                reuse_address=True,
            )
            self._servers.append(tls_server)
        if cfg.unix_socket:
            if os.path.exists(cfg.unix_socket):
                os.unlink(cfg.unix_socket)
            self._servers.append(await loop.create_unix_server(lambda: DaemonConnection(self), cfg.unix_socket))
            os.chmod(cfg.unix_socket, cfg.unix_socket_mode)
        if cfg.metrics_port >= 0:
            self.ops = OpsServer(self, cfg.metrics_host or cfg.host, cfg.metrics_port, cfg.stall_timeout)
            self.ops.start()
        await self.membership.refresh()  # before pushes arrive, so the first ones find their replicas
        self.object_probe.start()
        if self.tier is not None:
            self.tier.start(self.node)
        self.healing.start()
        if self.sweeper is not None:
            self.sweeper.start()
        self.housekeeping.start()
        self._watchdog = asyncio.create_task(watch(self.connections, self.config, self.unsent.drained))
        self.started = True
        if (mismatch := cfg.zone_mismatch(self.node)) is not None:
            event(
                log,
                "zones differ between daemons: replicas may be placed and looked for in different places",
                logging.WARNING,
                reason=mismatch,
                fix="give every daemon's zone in its peers entry (HOST:PORT@ZONE), the same list on every daemon",
            )
        if self.secret is None:
            event(
                log,
                "authentication off",
                logging.WARNING,
                reason="no secret-file or SHUFFLED_SECRET: any process that can connect may push, read and delete data",
            )
        event(
            log,
            "ready",
            node=self.node,
            unix=cfg.unix_socket,
            pool_bytes=self.pool.total * cfg.segment_size,
            segments=self.pool.total,
            segment_size=cfg.segment_size,
            read_reserve=self.pool.reserve,
            data_dir=self.disk.root if self.disk else self._without_data_dir(),
            peer_tls_port=cfg.peer_tls_port or None,
            restored_shuffles=restored,
            peers=len(self.membership.others()),
            http=self.ops.address if self.ops else None,
            object_store=repr(self.objects) if self.objects else None,
        )

    def _without_data_dir(self) -> str:
        """What `data-dir none` means for this daemon, for its ready line: an object store takes the spills."""
        if self.spiller.target is not None:
            return "none (spills go to the object store)"
        return "none (memory only: a full pool fails pushes)"

    def readiness(self) -> list[str]:
        """Why this daemon should not get new pushes now (empty: ready)."""
        reasons = []
        if not self.started:
            reasons.append("starting")
        if self.drain.draining:
            reasons.append("draining: shutting down")
        pool = self.pool
        if pool.free <= pool.reserve:
            reasons.append(f"pool exhausted: {pool.used} of {pool.total} segments used, the rest is the read reserve")
        disk = self.disk.space() if self.disk is not None else None
        if disk is not None and disk[1] < self.config.ready_disk_free * disk[0]:
            reasons.append(f"disk nearly full: {disk[1]} of {disk[0]} bytes free in {self.data_dir}")
        return reasons + self.object_probe.reasons()

    async def stop(self) -> None:
        if self.ops is not None:
            self.ops.stop()
        if self._watchdog is not None:
            self._watchdog.cancel()
        for server in self._servers:
            server.close()
        if self.drain.ended.is_set() and self.drain.answering:  # `shuffled drain --wait` hears how it ended
            await asyncio.wait(set(self.drain.answering), timeout=ANSWER_WAIT)
        conns = list(self.connections)
        for conn in conns:
            if conn.from_client:
                conn.stopping()
            else:
                conn.close("daemon stopping")
        if conns:  # their open map outputs are aborted when they are gone, before anything is persisted
            await asyncio.wait([c.lost for c in conns], timeout=5)
        for server in self._servers:
            await server.wait_closed()
        if self.config.unix_socket and os.path.exists(self.config.unix_socket):
            os.unlink(self.config.unix_socket)
        await self._persist()
        if self.tier is not None:
            await self.tier.close()
        await self.object_probe.close()

    async def _persist(self) -> None:
        """Write every committed byte still in memory to disk, so a restart serves it; without a data dir,
        make it durable in the object store (a restart serves what the objects prove)."""
        self.housekeeping.stop()
        self.healing.stop()
        if self.sweeper is not None:
            self.sweeper.stop()
        self.membership.stop()
        shuffles = [d for s in self.store.apps.values() for d in s.values()]
        if self.disk is None:
            if self.tier is not None and shuffles:
                try:
                    durable = await self.tier.uploads.persist(shuffles)
                except StorageError as exc:
                    event(log, "persisting to the object store failed", logging.WARNING, reason=exc.message)
                else:
                    event(log, "persisted", shuffles=len(shuffles), durable_attempts=durable)
            return
        try:
            written, complete = await self.spiller.flush(shuffles), True
        except StorageError:  # the spiller logged it; what was written before is still synced
            written, complete = 0, False
        await self.disk.sync()
        self.disk.close()
        event(log, "persisted", shuffles=len(shuffles), bytes_written=written, complete=complete)

    def stats(self) -> DaemonStats:
        """One snapshot of everything this daemon counts (`to_wire()` is the admin `stats` answer)."""
        return snapshot(self, time.monotonic())

    async def admin(self, op: Operation[Any], args: dict[str, Any], caller: Caller) -> dict[str, Any]:
        """An admin operation (clients, peers, the CLI) its connection let through; timed for the metrics."""
        started = time.monotonic()
        result = await op.call(self, args, caller)
        self.metrics.observe_admin(op.name, time.monotonic() - started)
        return result
