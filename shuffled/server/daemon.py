"""The daemon: one buffer pool, one store, the disk behind it, listeners for clients and peers.

`stats()` is the one snapshot of everything the daemon counts (a `DaemonStats`, see
stats.py): the metrics endpoint turns it into Prometheus metrics, and its wire form is
the admin `stats` answer `shuffled stats` prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import ssl
import time
from collections.abc import Callable
from typing import Any

from ..buffers import GlobalPool
from ..config import DATA_DIR_AUTO, PEER_SECRET_ENV, SECRET_ENV, ConfigError, DaemonConfig
from ..logs import event
from ..net.tls import peer_contexts
from ..ops.http import OpsServer
from ..ops.metrics import DaemonMetrics
from ..protocol.auth import (
    check_nonce,
    drain_challenge_proof,
    drain_proof,
    new_nonce,
    proof_matches,
    read_secret_file,
    secret_bytes,
)
from ..protocol.errors import AuthFailed, InvalidRequest, ShuffledError, StorageError
from .admin_service import Caller
from .connection import DaemonConnection
from .counters import Counters, micros
from .disk import Disk, SpillFile
from .drain import Drainer
from .membership import Membership
from .peers import PeerManager
from .shares import PushShares
from .spill import Spiller
from .stats import (
    ConnectionCounts,
    ConnectionStats,
    CreditStats,
    DaemonStats,
    DiskStats,
    DrainStats,
    FailoverStats,
    FilesystemStats,
    PoolStats,
    ReplicationStats,
    StreamStats,
)
from .store import ShuffleData, Store
from .watchdog import watch

log = logging.getLogger(__name__)

#: seconds between checks of application TTLs, idle shuffles to flush and a disk to retry
HOUSEKEEPING_INTERVAL = 1.0
#: seconds between checks whether a drain phase's work is done
DRAIN_POLL = 0.05
#: most seconds `stop` waits for the answers to `drain` requests with `wait` (they are due at once)
ANSWER_WAIT = 1.0


def _secret(name: str, secret_file: str | None, env: str) -> bytes | None:
    """A secret from its file setting or its environment variable (one of them, not both)."""
    from_env = os.environ.get(env)
    if secret_file and from_env is not None:
        raise ConfigError(f"both {name} and {env} are set: use one")
    try:
        if secret_file:
            return read_secret_file(secret_file)
        return secret_bytes(from_env) if from_env is not None else None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{name} {secret_file}: {exc}" if secret_file else f"{env}: {exc}") from None


def connection_counts(conn: DaemonConnection, now: float) -> ConnectionCounts:
    """What one connection's reads and pushes are doing at monotonic time `now`."""
    pushes = conn.pushing.sessions.values()
    reads = conn.reads
    return ConnectionCounts(
        role=conn.role_label,
        served=len(reads.served),
        pushing=len(pushes),
        remote_channels=len(reads.channels),
        inflight_buffers=conn.sender.inflight,
        backlog_buffers=sum(s.backlog for s in reads.served.values()),
        push_outstanding=sum(p.pool.promised for p in pushes if p.pool is not None),
        read_outstanding=sum(ch.credit.sender_credit for ch in reads.channels.values()),
        push_wait_seconds=sum(p.waiting_for(now) for p in pushes),
    )


class Daemon:
    def __init__(self, config: DaemonConfig) -> None:
        config.validate()
        self.config = config
        segments = config.pool_size // config.segment_size
        # The exclusive buffers of at least one read from three daemons must always fit in the reserve
        # (floating buffers come from memory outside it, while there is some).
        reserve = max(int(segments * config.read_reserve), 3 * config.exclusive)
        self.pool = GlobalPool(config.pool_size, config.segment_size, reserve=min(reserve, segments // 2))
        self.store = Store(config.segment_size, config.app_memory_quota, config.app_disk_quota)
        #: where spill files live (None: memory only)
        self.data_dir = config.data_directory()
        try:
            self.disk = Disk(self.data_dir) if self.data_dir else None
        except OSError as exc:
            auto = config.data_dir == DATA_DIR_AUTO
            how = " (data-dir auto: set --data-dir DIR, or none for memory only)" if auto else ""
            raise OSError(f"data dir {self.data_dir}{how} is not usable: {exc}") from exc
        self.store.can_spill = self.disk is not None
        self.store.max_partitions = config.max_partitions
        #: push memory's fair shares: floors per writer, caps per connection and application
        self.shares = PushShares(config, self.pool.total - self.pool.reserve)
        self.spiller = Spiller(self.store, self.pool, self.disk, config.spill_high, config.spill_low)
        if self.disk is not None:
            # Stored data normally sits between the spill watermarks; floating buffers may fill the pool up to
            # where background spilling starts (GlobalPool.set_floating_budget says why that is safe).
            self.pool.set_floating_budget(self.spiller.start - 1)
        self.peers: PeerManager[DaemonConnection] = PeerManager(self)
        self.connections: set[DaemonConnection] = set()
        self.background: set[asyncio.Task[Any]] = set()
        #: every daemon this one knows of (`peers`, `peers-dns`), itself included
        self.membership = Membership(config, config.advertise or "")
        #: the cluster secret every client proves on connect; None: authentication is off
        self.secret = _secret("secret-file", config.secret_file, SECRET_ENV)
        #: what a peer daemon proves: a secret applications do not have (with peer TLS, whose certificates
        #: prove a daemon, the cluster secret will do); None: authentication is off
        self.peer_secret = _secret("peer-secret-file", config.peer_secret_file, PEER_SECRET_ENV)
        #: what the admin `drain` must be proved with: the peer secret as configured, never the cluster
        #: secret standing in for it (every application has that one)
        self.drain_secret = self.peer_secret
        if self.peer_secret is None and config.peer_tls_port:
            self.peer_secret = self.secret
        if self.secret is not None and self.peer_secret is None:
            raise ConfigError(
                "secret-file is set but peer daemons would prove only that secret, which every application "
                "has, so a client could pass for a daemon: set peer-secret-file (a secret only daemons have) "
                "or peer TLS"
            )
        #: TLS contexts for peer connections (accepting, dialling); None: peers use the plain port
        self.peer_tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None
        if config.peer_tls_port:
            assert config.peer_tls_cert and config.peer_tls_key and config.peer_tls_ca  # validate() checked
            try:
                self.peer_tls = peer_contexts(config.peer_tls_cert, config.peer_tls_key, config.peer_tls_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"peer TLS certificates: {exc}") from None
        self._servers: list[asyncio.AbstractServer] = []
        self.counters = Counters()
        self.metrics = DaemonMetrics()
        self.started = False
        #: set on SIGTERM/SIGINT or the admin `drain`: new pushes are refused, readiness is false
        self.draining = False
        #: the drain's last phase: new reads from clients are refused (SHUTTING_DOWN), open ones finish
        self.closing = False
        #: the drain's phase and what its hand-over did (stats `drain`)
        self.drain_stats = DrainStats()
        self.drain_task: asyncio.Task[bool] | None = None
        #: set when a drain starts, from a signal or the admin `drain`: the serve loop then waits for it
        self.stop_requested = asyncio.Event()
        #: set when the drain has ended: answers a `drain` with `wait`, whose tasks `stop` lets answer
        self.drained = asyncio.Event()
        self._result_waiters: set[asyncio.Task[Any]] = set()
        self.start_time = time.time()
        self.ops: OpsServer | None = None
        self._housekeeping: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None

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
        restored = self._restore()  # before listening: no request may see a half-restored store
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
        self._housekeeping = asyncio.create_task(self._housekeep())
        self._watchdog = asyncio.create_task(watch(self.connections, self.config))
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
            data_dir=self.disk.root if self.disk else "none (memory only: a full pool fails pushes)",
            peer_tls_port=cfg.peer_tls_port or None,
            restored_shuffles=restored,
            peers=len(self.membership.others()),
            http=self.ops.address if self.ops else None,
        )

    def busy(self) -> tuple[int, int]:
        """Work a drain waits for: (open pushes, reads served or relayed)."""
        conns = list(self.connections)
        return sum(len(c.pushing.sessions) for c in conns), sum(len(c.reads.served) for c in conns)

    def start_drain(self, timeout: float, handoff: bool) -> asyncio.Task[bool]:
        """Begin the drain once per process life (a second request gets the running one); readiness fails
        and new pushes are refused from now on, before the caller hears back."""
        if self.drain_task is None:
            self.draining = True
            self.drain_stats.state = "pushes"
            self.drain_task = asyncio.create_task(self.drain(timeout, handoff))
            self.stop_requested.set()
        return self.drain_task

    async def drain(self, timeout: float, handoff: bool = False) -> bool:
        """Refuse new pushes, let open pushes finish, hand committed data over (`handoff`), refuse new
        client reads and let open reads finish; True if all of it was done within `timeout`.

        The phases show in stats `drain.state`. A peer's reads are still served while
        closing: they are cut when the daemon stops, and the reader fails over to a copy.
        Waiting polls a few times a second: a drain runs once per process life and
        polling needs no hook in every place a push or read can end.
        """
        self.draining = True
        progress = self.drain_stats
        deadline = time.monotonic() + timeout
        pushes, reads = self.busy()
        event(log, "draining", timeout_s=timeout, handoff=handoff, pushes=pushes, reads=reads)
        progress.state = "pushes"
        done = await self._wait_until(lambda: self.busy()[0] == 0, deadline)
        if handoff:
            progress.state = "copying"
            done = await Drainer(self, progress).run(deadline) and done
        progress.state = "closing"
        self.closing = True
        open_reads = [(c.reads.served, rid, s) for c in self.connections for rid, s in c.reads.served.items()]
        done = await self._wait_until(lambda: all(d.get(r) is not s for d, r, s in open_reads), deadline) and done
        progress.state = "done"
        progress.timed_out = not done
        self.drained.set()
        pushes, reads = self.busy()
        event(
            log,
            "drained" if done else "drain timed out",
            logging.INFO if done else logging.WARNING,
            pushes=pushes,
            reads=reads,
            to_copy=progress.to_copy,
            copied=progress.copied,
            copied_bytes=progress.copied_bytes,
            copy_failed=progress.failed,
            copy_short=progress.short,
        )
        return done

    @staticmethod
    async def _wait_until(ready: Callable[[], bool], deadline: float) -> bool:
        while not ready():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(DRAIN_POLL)
        return True

    def readiness(self) -> list[str]:
        """Why this daemon should not get new pushes now (empty: ready)."""
        reasons = []
        if not self.started:
            reasons.append("starting")
        if self.draining:
            reasons.append("draining: shutting down")
        pool = self.pool
        if pool.free <= pool.reserve:
            reasons.append(f"pool exhausted: {pool.used} of {pool.total} segments used, the rest is the read reserve")
        disk = self.disk_space()
        if disk is not None and disk[1] < self.config.ready_disk_free * disk[0]:
            reasons.append(f"disk nearly full: {disk[1]} of {disk[0]} bytes free in {self.data_dir}")
        return reasons

    def disk_space(self) -> tuple[int, int] | None:
        """(capacity, free bytes) of the data directory's file system, if there is one."""
        if not self.data_dir:
            return None
        try:
            usage = shutil.disk_usage(self.data_dir)
        except OSError:
            return None
        return usage.total, usage.free

    def _restore(self) -> int:
        """Serve again what a previous run left on disk and can prove; everything else was deleted by `load`."""
        if self.disk is None:
            return 0
        loaded = self.disk.load()
        for shuffle in loaded:
            files = {
                p: SpillFile(self.disk.data_path(shuffle.directory, p), size) for p, size in shuffle.file_sizes.items()
            }
            self.store.restore(shuffle, files)
            event(
                log,
                "restored",
                app=shuffle.app,
                shuffle=shuffle.shuffle,
                attempts=len(shuffle.committed),
                bytes=sum(n for lengths in shuffle.committed.values() for n in lengths[1].values()),
            )
        return len(loaded)

    async def _housekeep(self) -> None:
        """Expire applications whose driver vanished, flush idle shuffles, retry a failed disk, free the
        disk of aborted attempts."""
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            try:
                await self._housekeep_once()
            except Exception:  # a bug here must not stop expiry and flushing for good
                event(log, "housekeeping failed", logging.ERROR, exc_info=True)

    async def _housekeep_once(self) -> None:
        cfg = self.config
        self.membership.refresh_soon()
        now = time.monotonic()
        if cfg.app_ttl:
            for app, usage in list(self.store.usage.items()):
                busy = any(d.open for d in self.store.apps.get(app, {}).values())
                if not busy and now - usage.last_active > cfg.app_ttl:
                    event(log, "application expired", app=app, idle_seconds=round(now - usage.last_active))
                    await self._drop(*self.store.remove_application(app))
        if cfg.flush_after and self.disk is not None:
            idle = [
                d
                for shuffles in self.store.apps.values()
                for d in shuffles.values()
                if d.segments and not d.open and now - d.last_commit > cfg.flush_after
            ]
            with contextlib.suppress(StorageError):  # the spiller logged it; the next round tries again
                await self.spiller.flush(idle)
        self.spiller.check()
        await self.spiller.reclaim()
        for conn in list(self.connections):
            for session in list(conn.pushing.sessions.values()):
                session.check_wait()

    async def stop(self) -> None:
        if self.ops is not None:
            self.ops.stop()
        if self._watchdog is not None:
            self._watchdog.cancel()
        for server in self._servers:
            server.close()
        if self.drained.is_set() and self._result_waiters:  # `shuffled drain --wait` hears how it ended
            await asyncio.wait(set(self._result_waiters), timeout=ANSWER_WAIT)
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

    async def _persist(self) -> None:
        """Write every committed byte still in memory to disk, so a restart serves it."""
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        self.membership.stop()
        if self.disk is None:
            return
        shuffles = [d for s in self.store.apps.values() for d in s.values()]
        try:
            written, complete = await self.spiller.flush(shuffles), True
        except StorageError:  # the spiller logged it; what was written before is still synced
            written, complete = 0, False
        await self.disk.sync()
        self.disk.close()
        event(log, "persisted", shuffles=len(shuffles), bytes_written=written, complete=complete)

    # -- admin operations (clients, peers, CLI)

    def stats(self) -> DaemonStats:
        """One snapshot of everything this daemon counts (`to_wire()` is the admin `stats` answer)."""
        now = time.monotonic()
        conns = [c for c in self.connections if c.is_open]
        counts = [connection_counts(c, now) for c in conns]
        fs = self.disk_space()
        counters = self.counters
        pool = self.pool
        return DaemonStats(
            node=self.node,
            start_time=int(self.start_time),
            draining=self.draining,
            ready=not self.readiness(),
            pool=PoolStats(
                segment_size=pool.segment_size,
                total=pool.total,
                free=pool.free,
                used=pool.used,
                reserve=pool.reserve,
                local_pools=pool.local_pools,
                waiting=pool.waiting,
                floating=pool.floating,
            ),
            store=self.store.stats(),
            disk=self.disk.stats.copy() if self.disk is not None else DiskStats(),
            connections=ConnectionStats(
                clients=sum(1 for n in counts if n.role == "client"),
                peers=sum(1 for n in counts if n.role == "peer"),
                opened=dict(counters.opened),
            ),
            streams=StreamStats(
                served=sum(n.served for n in counts),
                pushing=sum(n.pushing for n in counts),
                remote_channels=sum(n.remote_channels for n in counts),
                inflight_buffers=sum(n.inflight_buffers for n in counts),
                backlog_buffers=sum(n.backlog_buffers for n in counts),
            ),
            # every connection not yet folded in, open or failing, so totals never go backwards
            traffic=counters.traffic(list(self.connections), asyncio.get_running_loop().time()),
            credit=CreditStats(
                push_granted=counters.push_credit_granted,
                push_outstanding=sum(n.push_outstanding for n in counts),
                push_floor_segments=self.shares.all.floors,
                push_floor_limit=self.shares.floor_limit,
                push_extra_segments=self.shares.all.extras,
                push_extra_limit=self.shares.extra_limit,
                read_granted=counters.read_credit_granted,
                read_outstanding=sum(n.read_outstanding for n in counts),
                push_wait_us=micros(counters.push_wait_seconds + sum(n.push_wait_seconds for n in counts)),
            ),
            errors=dict(counters.errors),
            filesystem=FilesystemStats(capacity_bytes=fs[0], free_bytes=fs[1]) if fs else None,
            replication=ReplicationStats(
                forwarded_buffers=counters.replica_forwarded_buffers,
                forwarded_bytes=counters.replica_forwarded_bytes,
                degraded=counters.replication_degraded,
                failed=counters.replication_failed,
                held_back=sum(s.held_back for c in conns for s in c.pushing.sessions.values()),
                peers=len(self.membership.others()),
            ),
            drain=self.drain_stats.copy(),
            failover=FailoverStats(
                tries=dict(counters.failover_tries),
                recovered=counters.failover_recovered,
                exhausted=counters.failover_exhausted,
                resumed_reads=counters.resumed_reads,
            ),
        )

    async def admin(self, op: str, args: dict[str, Any], caller: Caller) -> dict[str, Any]:
        started = time.monotonic()
        result = await self._admin(op, args, caller)
        self.metrics.observe_admin(op, time.monotonic() - started)
        return result

    async def _admin(self, op: str, args: dict[str, Any], caller: Caller) -> dict[str, Any]:
        if op == "stats":
            return self.stats().to_wire()
        if op == "ping":  # a peer checking that this daemon still answers (see watchdog.py)
            return {}
        if op == "holds":
            return self._holds(args)
        if op == "drain_challenge":
            return self._drain_challenge(args, caller)
        if op == "drain":
            answer = self._drain_requested(args, caller)
            return await self._drain_result() if args.get("wait") else answer
        if op not in ("unregister_shuffle", "remove_application", "flush"):
            raise InvalidRequest(f"unknown admin operation {op!r}")
        app = args.get("app")
        if not isinstance(app, str) or not app:
            raise InvalidRequest(f"{op} needs 'app'")
        shuffle = args.get("shuffle")
        if (op == "unregister_shuffle" or shuffle is not None) and (
            not isinstance(shuffle, int) or isinstance(shuffle, bool)
        ):
            raise InvalidRequest(f"{op} needs an integer 'shuffle'")
        if op == "flush":
            return await self._flush(app, shuffle)
        if op == "unregister_shuffle":
            assert isinstance(shuffle, int)
            freed = await self._drop(*self.store.unregister_shuffle(app, shuffle))
        else:
            freed = await self._drop(*self.store.remove_application(app))
        result: dict[str, Any] = {"freed_segments": freed}
        if args.get("propagate"):
            result["peers"] = await self._propagate(op, {**args, "propagate": False})
        return result

    def _holds(self, args: dict[str, Any]) -> dict[str, Any]:
        """Which of these attempts are committed here, and their bytes: how a draining daemon counts the
        copies of its data on other daemons."""
        app, shuffle, attempts = args.get("app"), args.get("shuffle"), args.get("attempts")
        if not isinstance(app, str) or not isinstance(shuffle, int) or isinstance(shuffle, bool):
            raise InvalidRequest("holds needs 'app' and an integer 'shuffle'")
        if not isinstance(attempts, list) or not all(isinstance(a, int) and not isinstance(a, bool) for a in attempts):
            raise InvalidRequest("holds needs 'attempts', a list of attempt ids")
        held, sizes = self.store.holds(app, shuffle, attempts)
        return {"attempts": held, "bytes": sizes}

    def _drain_secret(self) -> bytes | None:
        """What `drain` is proved with: the peer secret; None with authentication off."""
        if self.drain_secret is None and self.secret is not None:
            raise AuthFailed(
                "drain needs a proof made with the peer secret, and this daemon has none of its own (peer TLS "
                "stands in for it): set peer-secret-file, or stop it with SIGTERM"
            )
        return self.drain_secret

    def _drain_challenge(self, args: dict[str, Any], caller: Caller) -> dict[str, Any]:
        """The admin `drain_challenge`: prove the peer secret over the caller's fresh nonce (and name the
        address the caller is seen at) before it sends a proof of its own, with a nonce of this daemon's
        that the next `drain` on this connection must be proved over (PROTOCOL.md §13)."""
        secret = self._drain_secret()
        if secret is None:
            raise InvalidRequest("this daemon has no peer secret: drain needs no proof here")
        theirs = check_nonce(args.get("nonce"), "drain_challenge")
        ours = new_nonce()
        caller.drain_challenge = (theirs, ours)
        proof = drain_challenge_proof(secret, theirs, ours, self.node, caller.peer)
        return {"nonce": ours, "node": self.node, "client": caller.peer, "proof": proof}

    def _drain_requested(self, args: dict[str, Any], caller: Caller) -> dict[str, Any]:
        """The admin `drain`: answered at once, the drain goes on after (stats `drain` shows it).

        With authentication on, only peer-secret holders may stop a daemon (applications have the
        cluster secret, not that one), with a proof over the last `drain_challenge` answered on this
        connection, good once: a proof captured anywhere else is worth nothing.
        """
        handoff, timeout = args.get("handoff", True), args.get("timeout")
        secret = self._drain_secret()
        challenge = None
        if secret is not None:
            challenge, caller.drain_challenge = caller.drain_challenge, None  # good for one try, whatever follows
        if not isinstance(handoff, bool) or not isinstance(args.get("wait", False), bool):
            raise InvalidRequest("drain 'handoff' and 'wait' must be booleans")
        if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0):
            raise InvalidRequest("drain 'timeout' must be whole seconds >= 0")
        if secret is not None:
            proof = args.get("proof")
            expected = drain_proof(secret, *challenge, handoff, timeout) if challenge is not None else ""
            if not expected or not isinstance(proof, str) or not proof_matches(expected, proof):
                raise AuthFailed(
                    "drain needs a proof made with the peer secret, for these arguments, over the drain_challenge "
                    "answered last on this connection (shuffled drain --peer-secret-file)"
                )
        seconds = self.config.drain_timeout if timeout is None else timeout
        if self.drain_task is None:
            event(log, "drain requested", timeout_s=seconds, handoff=handoff)
        self.start_drain(seconds, handoff)
        return {"state": self.drain_stats.state}

    async def _drain_result(self) -> dict[str, Any]:
        """The answer to a `drain` with `wait`, once the drain has ended (`stop` lets it go out before it
        closes the connection): its `drain` stats, how `shuffled drain --wait` learns whether the
        hand-over left anything only here."""
        task = asyncio.current_task()
        if task is not None:
            self._result_waiters.add(task)
            task.add_done_callback(self._result_waiters.discard)
        await self.drained.wait()
        return dataclasses.asdict(self.drain_stats)

    async def _drop(self, freed: int, dropped: list[ShuffleData]) -> int:
        await self.spiller.removed(dropped)
        return freed

    async def _flush(self, app: str, shuffle: int | None) -> dict[str, Any]:
        """Write a finished map stage's data to disk so the next stage gets the memory (and a restart keeps it)."""
        if self.disk is None:
            raise InvalidRequest("this daemon has no --data-dir to flush to")
        shuffles = self.store.apps.get(app, {})
        chosen = [d for s, d in shuffles.items() if shuffle is None or s == shuffle]
        try:
            written = await self.spiller.flush(chosen)
        except StorageError as exc:
            raise StorageError("writing to this daemon's --data-dir failed; the data stays in memory") from exc
        return {"flushed_bytes": written}

    async def _propagate(self, op: str, args: dict[str, Any]) -> dict[str, str]:
        """Tell every known daemon; a daemon that cannot be reached is reported, not fatal."""
        targets = (set(self.membership.others()) | set(self.peers.conns)) - {self.node}

        async def one(addr: str) -> str:
            try:
                conn = await self.peers.get(addr)
                await conn.admin.request(op, args, self.config.admin_timeout)
                return "ok"
            except ShuffledError as exc:
                return f"{exc.code.name}: {exc.message}"
            except (TimeoutError, ConnectionError) as exc:
                return f"unreachable: {exc or 'timed out'}"

        addrs = sorted(targets)
        results = await asyncio.gather(*(one(a) for a in addrs))
        return dict(zip(addrs, results, strict=True))
