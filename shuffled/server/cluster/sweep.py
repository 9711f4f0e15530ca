"""The sweep: objects that no daemon will delete are found and deleted (architecture.md, "Cleanup").

A daemon deletes the objects of a shuffle or an application when it is told to drop it, and the daemon
the driver told deletes every node's; what is left after that was written by daemons that crashed or
were lost before, for applications whose driver never cleaned up or whose daemons all went. Every
`object-store-sweep` each daemon lists the whole prefix and deletes the objects of applications that
it does not hold, that no other daemon it can reach holds (admin `applications`), and that are older
than `app-ttl`; and probe objects older than that (a probe cut short by a crash). A daemon that cannot
be reached counts as holding nothing: it cannot serve what it holds either, and an application idle
for the TTL would have expired on it. A live daemon's objects of an application it holds are never
deleted this way. Sweeps of several daemons may meet: deleting is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ...logs import event
from ...protocol.errors import ShuffledError, StorageError
from ..storage.disk import app_dir_name
from ..storage.object_format import parse_key
from ..storage.objects import PROBE_DIR, ObjectInfo
from ..storage.tier import ObjectTier
from .handover import HandOverHost

log = logging.getLogger(__name__)


class Sweeper:
    """The daemon's sweep: `start` it once the daemon listens (with an object store), `stop` at shutdown."""

    def __init__(self, host: HandOverHost, tier: ObjectTier, active: Callable[[], bool] = lambda: True) -> None:
        self.host = host
        self.tier = tier
        self.active = active
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        cfg = self.host.config
        if cfg.object_store_sweep > 0 and cfg.app_ttl > 0:
            self._task = asyncio.create_task(self._loop(cfg.object_store_sweep))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)  # the sweep's period, not a wait for an event
            if not self.active():
                continue
            try:
                await self.sweep()
            except StorageError as exc:
                event(log, "object store sweep failed", logging.WARNING, reason=exc.message)
            except Exception:  # a bug must not stop sweeping for good
                event(log, "object store sweep failed", logging.ERROR, exc_info=True)

    async def sweep(self) -> int:
        """One sweep (see the module); the objects deleted. Raises StorageError when listing fails."""
        age = self.host.config.app_ttl
        held = {app_dir_name(app) for app in self.host.store.apps}
        stale: dict[str, list[ObjectInfo]] = {}
        for info in await self.tier.objects.list_objects():
            if info.age <= age:
                continue
            parts = parse_key(info.key)
            if parts is not None and parts.app_dir not in held:
                stale.setdefault(parts.app_dir, []).append(info)
            elif parts is None and info.key.startswith(f"{PROBE_DIR}/"):
                stale.setdefault("", []).append(info)
        if not stale:
            return 0
        held_elsewhere = await self._held_elsewhere()
        doomed = [info for app_dir, infos in stale.items() if app_dir not in held_elsewhere for info in infos]
        if doomed:
            await self.tier.objects.delete([info.key for info in doomed])
            self.tier.stats.swept_objects += len(doomed)
            event(log, "object store swept", objects=len(doomed), bytes=sum(i.size for i in doomed))
        return len(doomed)

    async def _held_elsewhere(self) -> set[str]:
        """The application directories the other daemons that answer hold."""
        host = self.host
        timeout = host.config.admin_timeout

        async def ask(addr: str) -> Any:
            try:
                conn = await host.peers.get(addr)
                return await conn.admin.request("applications", {}, timeout)
            except (ShuffledError, TimeoutError, ConnectionError) as exc:
                event(log, "applications not answered", peer=addr, reason=str(exc) or "timed out")
                return None

        answers = await asyncio.gather(*(ask(a) for a in host.membership.others()))
        held: set[str] = set()
        for answer in answers:
            apps = answer.get("apps") if isinstance(answer, dict) else None
            if isinstance(apps, list):
                held.update(app_dir_name(a) for a in apps if isinstance(a, str))
        return held
