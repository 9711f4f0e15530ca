"""The daemon: one buffer pool, one store, the disk behind it, listeners for clients and peers."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ..buffers import GlobalPool
from ..protocol.credit import DEFAULT_EXCLUSIVE, DEFAULT_FLOATING
from ..protocol.errors import InvalidRequest, ShuffledError, StorageError
from .connection import DaemonConnection
from .disk import Disk, DiskStats, SpillFile
from .peers import PeerManager
from .spill import Spiller
from .store import ShuffleData, Store

log = logging.getLogger("shuffled.daemon")

MiB = 1 << 20

#: seconds between checks of application TTLs, idle shuffles to flush and a disk to retry
HOUSEKEEPING_INTERVAL = 1.0


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
    #: share of pool segments in use at which stored data starts to spill to --data-dir
    spill_high: float = 0.85
    #: share of pool segments in use at which spilling stops and pushes get memory again
    spill_low: float = 0.70
    #: bytes of pool memory one application's stored data may hold (0: no cap); spills, or refuses without disk
    app_memory_quota: int = 0
    #: bytes of spill files one application may hold on this daemon (0: no cap); further pushes are refused
    app_disk_quota: int = 0
    #: seconds without any push, commit or read after which an application's data is dropped (0: never)
    app_ttl: float = 24 * 3600.0
    #: seconds without a commit after which a shuffle's committed data is written to disk (0: only under pressure)
    flush_after: float = 0.0

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
        need(0.0 < self.spill_low < self.spill_high <= 1.0, "need 0 < spill-low < spill-high <= 1")
        need(
            self.spill_high <= 1.0 - self.read_reserve,
            f"spill-high must be at most {1.0 - self.read_reserve} (pushes never use the read reserve, "
            "so a higher watermark would never be reached)",
        )
        need(self.app_memory_quota >= 0, "app-memory-quota must be >= 0")
        need(self.app_disk_quota >= 0, "app-disk-quota must be >= 0")
        need(self.app_ttl >= 0, "app-ttl must be >= 0 seconds (0: never expire)")
        need(self.flush_after >= 0, "flush-after must be >= 0 seconds (0: off)")
        need(
            not self.app_memory_quota or self.app_memory_quota >= 2 * self.push_max * self.segment_size,
            "app-memory-quota must hold at least two push windows",
        )


class Daemon:
    def __init__(self, config: DaemonConfig) -> None:
        config.validate()
        self.config = config
        segments = config.pool_size // config.segment_size
        # At least one read from three daemons must always fit in the reserve.
        reserve = max(int(segments * config.read_reserve), 3 * config.exclusive + config.floating)
        self.pool = GlobalPool(config.pool_size, config.segment_size, reserve=min(reserve, segments // 2))
        self.store = Store(config.segment_size, config.app_memory_quota, config.app_disk_quota)
        try:
            self.disk = Disk(config.data_dir) if config.data_dir else None
        except OSError as exc:
            raise OSError(f"data dir {config.data_dir} is not usable: {exc}") from exc
        self.store.can_spill = self.disk is not None
        self.spiller = Spiller(self.store, self.pool, self.disk, config.spill_high, config.spill_low)
        self.peers = PeerManager(self)
        self.connections: set[DaemonConnection] = set()
        self.background: set[asyncio.Task[Any]] = set()
        self.node = config.advertise or ""
        self._servers: list[asyncio.AbstractServer] = []
        self._housekeeping: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        restored = self._restore()  # before listening: no request may see a half-restored store
        server = await loop.create_server(lambda: DaemonConnection(self), cfg.host, cfg.port, reuse_address=True)
        self._servers.append(server)
        port = server.sockets[0].getsockname()[1]
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        self.node = cfg.advertise or f"{host}:{port}"
        if cfg.unix_socket:
            if os.path.exists(cfg.unix_socket):
                os.unlink(cfg.unix_socket)
            self._servers.append(await loop.create_unix_server(lambda: DaemonConnection(self), cfg.unix_socket))
        self._housekeeping = asyncio.create_task(self._housekeep())
        log.info(
            "ready node=%s unix=%s pool_bytes=%d segments=%d segment_size=%d read_reserve=%d data_dir=%s "
            "restored_shuffles=%d",
            self.node,
            cfg.unix_socket or "-",
            self.pool.total * cfg.segment_size,
            self.pool.total,
            cfg.segment_size,
            self.pool.reserve,
            self.disk.root if self.disk else "-",
            restored,
        )

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
            log.info(
                "restored app=%s shuffle=%d attempts=%d bytes=%d",
                shuffle.app,
                shuffle.shuffle,
                len(shuffle.committed),
                sum(n for lengths in shuffle.committed.values() for n in lengths[1].values()),
            )
        return len(loaded)

    async def _housekeep(self) -> None:
        """Expire applications whose driver vanished, flush idle shuffles, retry a failed disk."""
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            try:
                await self._housekeep_once()
            except Exception:  # a bug here must not stop expiry and flushing for good
                log.exception("housekeeping failed")

    async def _housekeep_once(self) -> None:
        cfg = self.config
        now = time.monotonic()
        if cfg.app_ttl:
            for app, usage in list(self.store.usage.items()):
                busy = any(d.open for d in self.store.apps.get(app, {}).values())
                if not busy and now - usage.last_active > cfg.app_ttl:
                    log.info("application expired app=%s idle_seconds=%.0f", app, now - usage.last_active)
                    await self._drop(*self.store.remove_application(app))
        if cfg.flush_after and self.disk is not None:
            idle = [
                d
                for shuffles in self.store.apps.values()
                for d in shuffles.values()
                if d.segments and not d.open and now - d.last_commit > cfg.flush_after
            ]
            await self.spiller.flush(idle)
        self.spiller.check()

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        conns = list(self.connections)
        for conn in conns:
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
        if self.disk is None:
            return
        shuffles = [d for s in self.store.apps.values() for d in s.values()]
        written = await self.spiller.flush(shuffles)
        await self.disk.sync()
        self.disk.close()
        log.info("persisted shuffles=%d bytes_written=%d complete=%s", len(shuffles), max(written, 0), written >= 0)

    # -- admin operations (clients, peers, CLI)

    def stats(self) -> dict[str, Any]:
        conns = [c for c in self.connections if c.is_open]
        disk = self.disk.stats if self.disk is not None else DiskStats()
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
            "disk": {
                "spills": disk.spills,
                "spilled_bytes": disk.spilled_bytes,
                "used_bytes": disk.used_bytes,
                "files": disk.files,
            },
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

    async def _drop(self, freed: int, dropped: list[ShuffleData]) -> int:
        await self.spiller.removed(dropped)
        return freed

    async def _flush(self, app: str, shuffle: int | None) -> dict[str, Any]:
        """Write a finished map stage's data to disk so the next stage gets the memory (and a restart keeps it)."""
        if self.disk is None:
            raise InvalidRequest("this daemon has no --data-dir to flush to")
        shuffles = self.store.apps.get(app, {})
        chosen = [d for s, d in shuffles.items() if shuffle is None or s == shuffle]
        written = await self.spiller.flush(chosen)
        if written < 0:
            raise StorageError("writing to this daemon's --data-dir failed; the data stays in memory")
        return {"flushed_bytes": written}

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
