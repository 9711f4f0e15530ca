"""The daemon's housekeeping, once a `HOUSEKEEPING_INTERVAL`: expire applications whose driver vanished
(`app-ttl`) and drop those left holding nothing (every map output of theirs aborted), flush idle shuffles
(`flush-after`), spill what the pool or a quota asks for and retry a failed disk, move spilled data over
the disk quota to the object store, free the disk of aborted attempts' pieces, check the object store
again, and look at push sessions waiting for memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from ..config import DaemonConfig
from ..logs import event
from ..protocol.errors import StorageError
from .cluster.membership import Membership
from .serving.connection import DaemonConnection
from .storage.probe import ObjectStoreProbe
from .storage.spill import Spiller
from .storage.store import Store
from .storage.tier import ObjectTier

log = logging.getLogger(__name__)

#: seconds between checks of application TTLs, idle shuffles to flush and a disk to retry
HOUSEKEEPING_INTERVAL = 1.0


class Housekeeping:
    """The daemon's chores on a timer (see the module): `start` once it listens, `stop` when it stops."""

    def __init__(
        self,
        config: DaemonConfig,
        store: Store,
        spiller: Spiller,
        tier: ObjectTier | None,
        membership: Membership,
        object_probe: ObjectStoreProbe,
        connections: set[DaemonConnection],
    ) -> None:
        self.config = config
        self.store = store
        self.spiller = spiller
        self.tier = tier
        self.membership = membership
        self.object_probe = object_probe
        self.connections = connections
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            try:
                await self.once()
            except Exception:  # a bug here must not stop expiry and flushing for good
                event(log, "housekeeping failed", logging.ERROR, exc_info=True)

    async def once(self) -> None:
        """One round of the chores (see the module)."""
        cfg = self.config
        self.membership.refresh_soon()
        now = time.monotonic()
        expired = []
        if cfg.app_ttl:
            for app, usage in list(self.store.usage.items()):
                busy = any(d.open for d in self.store.apps.get(app, {}).values())
                if not busy and now - usage.last_active > cfg.app_ttl:
                    event(log, "application expired", app=app, idle_seconds=round(now - usage.last_active))
                    expired.append(app)
        for app in [*expired, *self.store.empty_applications()]:
            dropped = self.store.remove_application(app)[1]
            await self.spiller.removed(dropped)
            if self.tier is not None:  # other nodes' objects it adopted stay for their own cleanup
                await self.tier.removed(dropped, adopted=False)
        if cfg.flush_after and self.spiller.disk is not None:
            idle = [
                d
                for shuffles in self.store.apps.values()
                for d in shuffles.values()
                if d.segments and not d.open and now - d.last_commit > cfg.flush_after
            ]
            with contextlib.suppress(StorageError):  # the spiller logged it; the next round tries again
                await self.spiller.flush(idle)
        self.spiller.check()
        if self.tier is not None:
            self.tier.mover.relieve_disk()
        await self.spiller.reclaim()
        self.object_probe.check(now)
        for conn in list(self.connections):
            for session in list(conn.pushes.sessions.values()):
                session.check_wait()
