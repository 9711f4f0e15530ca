"""The daemon, the composition root: one buffer pool, storage (storage/manager.py: memory, the data dir
and the object store behind one door), the push shares, membership and peers, the drain, healing and
the sweep, and listeners for clients and peers; each part is given the parts it uses, and connections
the `ShuffleEnvironment` bundle of them. What each part does lives in its room: storage/, serving/,
cluster/ and accounting/.

`stats()` is the one snapshot of everything the daemon counts (a `DaemonStats`, see
accounting/stats.py): the metrics endpoint turns it into Prometheus metrics, and its wire form is
the admin `stats` answer `shuffled stats` prints.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from ..buffers import GlobalPool
from ..buffers.shm import RegionDirectory
from ..config import DATA_DIR_AUTO, ConfigError, DaemonConfig
from ..logs import event
from ..net.ports import Port
from ..ops.http import OpsServer
from ..ops.metrics import DaemonMetrics
from ..ops.stats import DaemonStats, DrainStats, HealStats, ObjectStoreStats
from .accounting.counters import Counters
from .accounting.shares import PushShares
from .accounting.stats import snapshot
from .cluster.drain import Drain
from .cluster.handover import HandOver
from .cluster.healing import Healing
from .cluster.membership import Membership
from .cluster.peers import PeerManager
from .cluster.sweep import Sweeper
from .housekeeping import Housekeeping
from .listeners import Listeners
from .serving.backlog import UnsentBudget
from .serving.connection import DaemonConnection
from .serving.environment import ShuffleEnvironment
from .serving.trust import Trust
from .serving.watchdog import watch
from .storage.at_rest import AtRestKeys
from .storage.disk import Disk
from .storage.manager import open_storage

log = logging.getLogger(__name__)

#: most seconds `stop` waits for the answers to `drain` requests with `wait` (they are due at once)
ANSWER_WAIT = 1.0


def _at_rest_keys(config: DaemonConfig, listener: socket.socket | None) -> AtRestKeys | None:
    """The keys that seal what is written to disk and objects (None: not sealed); ConfigError saying why not."""
    try:
        return AtRestKeys.load(config.at_rest_key_file) if config.at_rest_key_file else None
    except (OSError, ValueError) as exc:
        if listener is not None:
            listener.close()
        raise ConfigError(f"at-rest-key-file {config.at_rest_key_file}: {exc}") from None


def _open_disk(config: DaemonConfig, data_dir: str | None, listener: socket.socket | None) -> Disk | None:
    """The data dir's `Disk` (None: memory only); OSError saying which directory and why it is not usable."""
    try:
        return Disk(data_dir, fsync=config.fsync, fsync_interval=config.fsync_interval) if data_dir else None
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
        # The exclusive buffers of at least one read from three daemons must always fit in the three quarters
        # of the reserve they may hold (floating buffers come from memory outside it, while there is some).
        reserve = max(int(segments * config.read_reserve), 4 * config.exclusive_buffers)
        self.pool = GlobalPool(config.pool_size, config.segment_size, reserve=min(reserve, segments // 2))
        #: whom it trusts and how each side proves itself (serving/trust.py)
        self.trust = Trust.load(config)
        self.listeners = Listeners(
            config, self.trust.peer_tls[0] if self.trust.peer_tls is not None else None, self.trust.client_tls
        )
        #: where spill files live (None: memory only)
        self.data_dir = config.data_directory(self.listeners.early_port)
        self.metrics = DaemonMetrics()
        self.object_stats = ObjectStoreStats()
        #: everything stored: memory, the data dir, the object store (storage/manager.py)
        keys = _at_rest_keys(config, self.listeners.early)
        self.storage = open_storage(
            config,
            self.pool,
            _open_disk(config, self.data_dir, self.listeners.early),
            self.object_stats,
            self.metrics.observe_object_store,
            keys,
        )
        #: push memory's fair shares: floors per writer, caps per connection and application
        self.shares = PushShares(config, self.pool.total - self.pool.reserve)
        self.counters = Counters()
        #: what healing did (cluster/healing.py)
        self.heal_stats = HealStats()
        self.connections: set[DaemonConnection] = set()
        self.unsent = UnsentBudget(config, self.connections)  # answers queued unsent (serving/backlog.py)
        self.background: set[asyncio.Task[Any]] = set()
        #: every daemon this one knows of (`peers`, `peers-dns`), itself included
        self.membership = Membership(config, config.advertise or "")
        self.peers: PeerManager[DaemonConnection] = PeerManager(
            config, self.membership, self.trust.secret, self.dial_peer
        )
        self.started = False
        #: SIGTERM, SIGINT or the admin `drain`: new pushes, then new client reads are refused
        self.drain = Drain(self._work, self._open_reads, self._hand_over)
        #: copies of replicated attempts lost with a daemon made again (not while draining)
        self.healing = Healing(
            config, self.storage, self.membership, self.peers.get, self.heal_stats, lambda: not self.drain.draining
        )
        #: deletes what crashed daemons left in the object store
        self.sweeper = (
            Sweeper(config, self.storage, self.membership, self.peers.get, lambda: not self.drain.draining)
            if self.storage.has_object_store
            else None
        )
        self.start_time = time.time()
        self.ops: OpsServer | None = None
        self.housekeeping = Housekeeping(self.storage, self.membership, self.connections)
        self._watchdog: asyncio.Task[None] | None = None
        #: where the regions of local clients' shared memory are made (only for clients of the Unix socket)
        self.shm = RegionDirectory(config.shm_dir if config.unix_socket else None, config.unix_socket_mode)
        #: the daemon's parts as its connections see them
        self.env = ShuffleEnvironment(
            config,
            self.pool,
            self.storage,
            self.shares,
            self.counters,
            self.metrics,
            self.membership,
            self.peers,
            self.connections,
            self.drain,
            self.trust,
            self.unsent,
            self.background,
            self.start_time,
            self.stats,
            self.shm,
        )

    @property
    def node(self) -> str:
        """This daemon's advertised address: its name on the placement ring and in Spark's MapStatus."""
        return self.membership.node

    def _work(self) -> tuple[int, int]:
        """What a drain waits for: (map outputs being pushed, reads served or relayed)."""
        conns = list(self.connections)
        return sum(len(c.pushes.sessions) for c in conns), sum(len(c.reads.served) for c in conns)

    def _open_reads(self) -> Callable[[], bool]:
        """The reads served now, as a test of whether every one of them has ended since."""
        served = [c.reads.served for c in self.connections]
        now = [(reads, rid, s) for reads in served for rid, s in reads.items()]
        return lambda: all(reads.get(rid) is not s for reads, rid, s in now)

    async def _hand_over(self, progress: DrainStats, deadline: float) -> bool:
        """A drain's hand-over of what lacks copies elsewhere (cluster/handover.py)."""
        return await HandOver(self.config, self.storage, self.membership, self.peers.get, progress).run(deadline)

    async def dial_peer(self, addr: str, host: str, port: int) -> DaemonConnection:
        """A connection to daemon `addr` at `host`:`port` (its peer TLS port with peer TLS) once the
        handshake is done; the PeerManager decides when to dial and what a failure means."""
        cfg = self.config
        tls = self.trust.peer_tls[1] if self.trust.peer_tls is not None else None
        _, conn = await asyncio.wait_for(
            asyncio.get_running_loop().create_connection(
                lambda: DaemonConnection(self.env, dialed=addr, port=Port.TCP if tls is None else Port.PEER_TLS),
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
        cfg = self.config
        # Before listening: no request may see a half-restored store.
        restored = self.storage.restore()
        try:
            self.shm.open(self.pool.total * cfg.segment_size)
        except OSError as exc:  # said once: its clients push through the socket
            event(log, "no shared memory for local clients", logging.WARNING, dir=cfg.shm_dir, reason=str(exc))
        port = await self.listeners.open(lambda arrived: DaemonConnection(self.env, port=arrived))
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        self.membership.node = cfg.advertise or f"{host}:{port}"
        if cfg.metrics_port >= 0:
            self.ops = OpsServer(self, cfg.metrics_host or cfg.host, cfg.metrics_port, cfg.stall_timeout)
            self.ops.start()
        await self.membership.refresh()  # before pushes arrive, so the first ones find their replicas
        self.storage.start(self.node)
        self.healing.start()
        if self.sweeper is not None:
            self.sweeper.start()
        self.housekeeping.start()
        self._watchdog = asyncio.create_task(watch(self.connections, self.config, self.unsent.drained))
        self.started = True
        _say_ready(self, restored)

    def readiness(self) -> list[str]:
        """Why this daemon should not get new pushes now (empty: ready)."""
        reasons = []
        if not self.started:
            reasons.append("starting")
        if self.drain.draining:
            reasons.append("draining: shutting down")
        pool = self.pool
        if pool.push_room <= 0:
            reasons.append(f"pool exhausted: {pool.used} of {pool.total} segments used, the rest is the read reserve")
        return reasons + self.storage.readiness(self.config.ready_disk_free)

    async def stop(self) -> None:
        if self.ops is not None:
            self.ops.stop()
        if self._watchdog is not None:
            self._watchdog.cancel()
        self.listeners.close()
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
        self.shm.close()  # no client's region has a name any more (stored data in them lives on in memory)
        await self.listeners.closed()
        self.housekeeping.stop()
        self.healing.stop()
        if self.sweeper is not None:
            self.sweeper.stop()
        self.membership.stop()
        await self.storage.persist()  # what a restart can serve again: on disk, or durable in the object store
        await self.storage.close()

    def stats(self) -> DaemonStats:
        """One snapshot of everything this daemon counts (`to_wire()` is the admin `stats` answer)."""
        drain = self.drain
        return snapshot(self, time.monotonic(), len(self.membership.others()), drain.stats, drain.draining)


def _say_ready(d: Daemon, restored: int) -> None:
    """The ready line (where data goes, what was restored), after the warnings an operator should act on."""
    cfg = d.config
    if (mismatch := cfg.zone_mismatch(d.node)) is not None:
        event(
            log,
            "zones differ between daemons: replicas may be placed and looked for in different places",
            logging.WARNING,
            reason=mismatch,
            fix="give every daemon's zone in its peers entry (HOST:PORT@ZONE), the same list on every daemon",
        )
    if d.trust.secret is None:
        event(
            log,
            "authentication off",
            logging.WARNING,
            reason="no secret-file or SHUFFLED_SECRET: any process that can connect may push, read and delete data",
        )
    where = d.storage.describe()
    event(
        log,
        "ready",
        node=d.node,
        unix=cfg.unix_socket,
        pool_bytes=d.pool.total * cfg.segment_size,
        segments=d.pool.total,
        segment_size=cfg.segment_size,
        read_reserve=d.pool.reserve,
        peer_tls_port=cfg.peer_tls_port or None,
        client_tls_port=cfg.client_tls_port or None,
        restored_shuffles=restored,
        peers=len(d.membership.others()),
        http=d.ops.address if d.ops else None,
        data_dir=where["data_dir"],
        object_store=where["object_store"],
    )
