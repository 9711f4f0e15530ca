"""The daemon: one buffer pool, one store, listeners for clients and peers.

`stats()` is the one snapshot of everything the daemon counts: `shuffled stats`
prints it and the metrics endpoint turns it into Prometheus metrics.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from typing import Any

from ..buffers import GlobalPool
from ..config import DaemonConfig
from ..logs import event
from ..ops.http import OpsServer
from ..ops.metrics import DaemonMetrics
from ..protocol.errors import InvalidRequest, ShuffledError
from .connection import DaemonConnection
from .counters import Counters, micros
from .peers import PeerManager
from .store import Store

log = logging.getLogger("shuffled.daemon")


class Daemon:
    def __init__(self, config: DaemonConfig) -> None:
        config.validate()
        self.config = config
        segments = config.pool_size // config.segment_size
        # At least one read from three daemons must always fit in the reserve.
        reserve = max(int(segments * config.read_reserve), 3 * config.exclusive + config.floating)
        self.pool = GlobalPool(config.pool_size, config.segment_size, reserve=min(reserve, segments // 2))
        self.store = Store()
        self.peers = PeerManager(self)
        self.connections: set[DaemonConnection] = set()
        self.background: set[asyncio.Task[Any]] = set()
        self.node = config.advertise or ""
        self._servers: list[asyncio.AbstractServer] = []
        self.counters = Counters()
        self.metrics = DaemonMetrics()
        self.started = False
        #: set on SIGTERM/SIGINT: new pushes are refused, readiness is false
        self.draining = False
        self.start_time = time.time()
        self.ops: OpsServer | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        server = await loop.create_server(lambda: DaemonConnection(self), cfg.host, cfg.port, reuse_address=True)
        self._servers.append(server)
        port = server.sockets[0].getsockname()[1]
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        self.node = cfg.advertise or f"{host}:{port}"
        if cfg.unix_socket:
            if os.path.exists(cfg.unix_socket):
                os.unlink(cfg.unix_socket)
            self._servers.append(await loop.create_unix_server(lambda: DaemonConnection(self), cfg.unix_socket))
            os.chmod(cfg.unix_socket, cfg.unix_socket_mode)
        if cfg.data_dir:
            os.makedirs(cfg.data_dir, exist_ok=True)
        if cfg.metrics_port >= 0:
            self.ops = OpsServer(self, cfg.metrics_host or cfg.host, cfg.metrics_port, cfg.stall_timeout)
            self.ops.start()
        self.started = True
        event(
            log,
            "ready",
            node=self.node,
            unix=cfg.unix_socket,
            pool_bytes=self.pool.total * cfg.segment_size,
            segments=self.pool.total,
            segment_size=cfg.segment_size,
            read_reserve=self.pool.reserve,
            http=self.ops.address if self.ops else None,
        )

    def busy(self) -> dict[str, int]:
        """Work a drain waits for: open pushes and reads served or relayed."""
        conns = list(self.connections)
        return {
            "pushes": sum(len(c.pushes) for c in conns),
            "reads": sum(len(c.served) for c in conns),
        }

    async def drain(self, timeout: float) -> bool:
        """Refuse new pushes, let open pushes and reads finish; True if they did within `timeout`.

        Waiting polls a few times a second: a drain runs once per process life and
        polling needs no hook in every place a push or read can end.
        """
        self.draining = True
        busy = self.busy()
        event(log, "draining", timeout_s=timeout, **busy)
        deadline = time.monotonic() + timeout
        while any(busy.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            busy = self.busy()
        done = not any(busy.values())
        event(log, "drained" if done else "drain timed out", logging.INFO if done else logging.WARNING, **busy)
        return done

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
            reasons.append(f"disk nearly full: {disk[1]} of {disk[0]} bytes free in {self.config.data_dir}")
        return reasons

    def disk_space(self) -> tuple[int, int] | None:
        """(capacity, free bytes) of the data directory's file system, if there is one."""
        if not self.config.data_dir:
            return None
        try:
            usage = shutil.disk_usage(self.config.data_dir)
        except OSError:
            return None
        return usage.total, usage.free

    async def stop(self) -> None:
        if self.ops is not None:
            self.ops.stop()
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.close("daemon stopping")
        for server in self._servers:
            await server.wait_closed()
        if self.config.unix_socket and os.path.exists(self.config.unix_socket):
            os.unlink(self.config.unix_socket)

    # -- admin operations (clients, peers, CLI)

    def stats(self) -> dict[str, Any]:
        conns = [c for c in self.connections if c.is_open]
        pushes = [p for c in conns for p in c.pushes.values()]
        disk = self.disk_space()
        counters = self.counters
        return {
            "node": self.node,
            "start_time": int(self.start_time),
            "draining": self.draining,
            "ready": not self.readiness(),
            "pool": {
                "segment_size": self.pool.segment_size,
                "total": self.pool.total,
                "free": self.pool.free,
                "used": self.pool.used,
                "reserve": self.pool.reserve,
                "local_pools": self.pool.local_pools,
                "waiting": self.pool.waiting,
            },
            "store": self.store.stats(),
            "connections": {
                "clients": sum(1 for c in conns if c.role_label == "client"),
                "peers": sum(1 for c in conns if c.role_label == "peer"),
                "opened": dict(counters.opened),
            },
            "streams": {
                "served": sum(len(c.served) for c in conns),
                "pushing": len(pushes),
                "remote_channels": sum(len(c.channels) for c in conns),
                "inflight_buffers": sum(c.sender.inflight for c in conns),
                "backlog_buffers": sum(s.backlog for c in conns for s in c.served.values()),
            },
            "traffic": {
                "pushed_bytes": counters.pushed_bytes,
                "pushed_buffers": counters.pushed_buffers,
                "served_local_bytes": counters.served_local_bytes,
                "served_local_buffers": counters.served_local_buffers,
                "relayed_bytes": counters.relayed_bytes,
                "relayed_buffers": counters.relayed_buffers,
                # every connection not yet folded in, open or failing, so totals never go backwards
                **counters.totals(list(self.connections), asyncio.get_running_loop().time()),
            },
            "credit": {
                "push_granted": counters.push_credit_granted,
                "push_outstanding": sum(p.pool.promised for p in pushes if p.pool is not None),
                "read_granted": counters.read_credit_granted,
                "read_outstanding": sum(ch.credit.sender_credit for c in conns for ch in c.channels.values()),
                "push_wait_us": micros(
                    counters.push_wait_seconds + sum(p.waiting_for(time.monotonic()) for p in pushes)
                ),
            },
            "errors": dict(counters.errors),
            "filesystem": {"capacity_bytes": disk[0], "free_bytes": disk[1]} if disk else {},
        }

    async def admin(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        result = await self._admin(op, args)
        self.metrics.observe_admin(op, time.monotonic() - started)
        return result

    async def _admin(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "stats":
            return self.stats()
        if op not in ("unregister_shuffle", "remove_application"):
            raise InvalidRequest(f"unknown admin operation {op!r}")
        app = args.get("app")
        if not isinstance(app, str) or not app:
            raise InvalidRequest(f"{op} needs 'app'")
        if op == "unregister_shuffle":
            shuffle = args.get("shuffle")
            if not isinstance(shuffle, int) or isinstance(shuffle, bool):
                raise InvalidRequest("unregister_shuffle needs an integer 'shuffle'")
            freed = self.store.unregister_shuffle(app, shuffle)
        else:
            freed = self.store.remove_application(app)
        result: dict[str, Any] = {"freed_segments": freed}
        if args.get("propagate"):
            result["peers"] = await self._propagate(op, {**args, "propagate": False})
        return result

    async def _propagate(self, op: str, args: dict[str, Any]) -> dict[str, str]:
        """Tell every known daemon; a daemon that cannot be reached is reported, not fatal."""
        targets = (set(self.config.peers) | set(self.peers.conns)) - {self.node}

        async def one(addr: str) -> str:
            try:
                conn = await self.peers.get(addr)
                await conn.request_admin(op, args, self.config.admin_timeout)
                return "ok"
            except ShuffledError as exc:
                return f"{exc.code.name}: {exc.message}"
            except (TimeoutError, ConnectionError) as exc:
                return f"unreachable: {exc or 'timed out'}"

        addrs = sorted(targets)
        results = await asyncio.gather(*(one(a) for a in addrs))
        return dict(zip(addrs, results, strict=True))
