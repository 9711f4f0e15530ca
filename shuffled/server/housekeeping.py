"""The daemon's housekeeping, once a `HOUSEKEEPING_INTERVAL`: look up the peers again (`peers-dns`), let
storage do its chores (storage/lifecycle.py: expire applications whose driver vanished and drop those left
holding nothing, flush idle shuffles, spill what the pool or a quota asks for and retry a failed disk, move
spilled data over the disk quota to the object store, free the disk of aborted attempts' pieces; and check
the object store again), and look at push sessions waiting for memory.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..logs import event
from .cluster.membership import Membership
from .serving.connection import DaemonConnection
from .storage.manager import StorageManager

log = logging.getLogger(__name__)

#: seconds between checks of application TTLs, idle shuffles to flush and a disk to retry
HOUSEKEEPING_INTERVAL = 1.0


class Housekeeping:
    """The daemon's chores on a timer (see the module): `start` once it listens, `stop` when it stops."""

    def __init__(self, storage: StorageManager, membership: Membership, connections: set[DaemonConnection]) -> None:
        self.storage = storage
        self.membership = membership
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
        self.membership.refresh_soon()
        await self.storage.housekeeping(time.monotonic())
        for conn in list(self.connections):
            for session in list(conn.pushes.sessions.values()):
                session.window.check_wait()
