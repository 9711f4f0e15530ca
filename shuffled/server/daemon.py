"""The daemon: one buffer pool, one store, listeners for clients and peers."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from ..buffers import GlobalPool
from ..protocol.credit import DEFAULT_EXCLUSIVE, DEFAULT_FLOATING
from ..protocol.errors import InvalidRequest, ShuffledError
from .connection import DaemonConnection
from .peers import PeerManager
from .store import Store

log = logging.getLogger("shuffled.daemon")

MiB = 1 << 20


@dataclass
class DaemonConfig:
    host: str = "127.0.0.1"
    port: int = 7337
    unix_socket: str | None = None
    #: address other daemons and readers use for this one (default host:port)
    advertise: str | None = None
    pool_size: int = 256 * MiB
    segment_size: int = 32 << 10
    data_dir: str | None = None
    peers: list[str] = field(default_factory=list)
    exclusive: int = DEFAULT_EXCLUSIVE
    floating: int = DEFAULT_FLOATING
    #: push credit window per map output: guaranteed / at most
    push_min: int = 2
    push_max: int = 16
    #: share of the pool kept for reading so stored data can always be read back
    read_reserve: float = 0.125
    high_watermark: int = 1 * MiB
    low_watermark: int = 256 << 10
    connect_timeout: float = 10.0
    admin_timeout: float = 30.0

    def validate(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(what)

        need(0 <= self.port < 65536, f"port {self.port} is not in 0..65535")
        need(self.segment_size >= 4096 and self.segment_size % 4096 == 0, "segment-size must be a multiple of 4096")
        need(self.pool_size >= 16 * self.segment_size, "pool-size must hold at least 16 segments")
        need(self.exclusive >= 1, "exclusive-buffers must be >= 1")
        need(self.floating >= 0, "floating-buffers must be >= 0")
        need(1 <= self.push_min <= self.push_max, f"push-window must be >= {self.push_min}")
        need(0.0 < self.read_reserve < 0.5, "read-reserve must be in (0, 0.5)")
        need(0 <= self.low_watermark < self.high_watermark, "low watermark must be below the high watermark")


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
        if cfg.data_dir:
            os.makedirs(cfg.data_dir, exist_ok=True)
        log.info(
            "ready node=%s unix=%s pool_bytes=%d segments=%d segment_size=%d read_reserve=%d",
            self.node,
            cfg.unix_socket or "-",
            self.pool.total * cfg.segment_size,
            self.pool.total,
            cfg.segment_size,
            self.pool.reserve,
        )

    async def stop(self) -> None:
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
        return {
            "node": self.node,
            "pool": {
                "segment_size": self.pool.segment_size,
                "total": self.pool.total,
                "free": self.pool.free,
                "used": self.pool.used,
                "reserve": self.pool.reserve,
                "local_pools": self.pool.local_pools,
            },
            "store": self.store.stats(),
            "connections": {
                "clients": sum(1 for c in conns if c.role is not None and c.role.name == "CLIENT"),
                "peers": sum(1 for c in conns if c.role is not None and c.role.name == "DAEMON"),
            },
            "streams": {
                "served": sum(len(c.served) for c in conns),
                "pushing": sum(len(c.pushes) for c in conns),
                "remote_channels": sum(len(c.channels) for c in conns),
                "inflight_buffers": sum(c.sender.inflight for c in conns),
            },
        }

    async def admin(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
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
