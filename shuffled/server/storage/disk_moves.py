"""Moves from the data dir (tier.py): with the data dir over `disk-quota`, or an application over
`app-disk-quota`, the oldest pieces of the shuffle used longest ago (of an application over its quota
first) move to objects, until the disk is down to `DISK_LOW` of the quota; their blocks are punched once no
load of that shuffle is under way (`disk_space.reclaim`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

from ...config import DaemonConfig
from ...logs import event
from ...protocol.errors import CorruptData, StorageError
from .object_writer import ObjectWriter, Pieces
from .shuffles import ShuffleData

log = logging.getLogger(__name__)

#: a disk over its quota is brought down to this share of it, so moves do not start again at once
DISK_LOW = 0.9


class DiskMover:
    """Spilled pieces moved to objects when the data dir is over its quota (see the module)."""

    def __init__(self, writer: ObjectWriter, config: DaemonConfig) -> None:
        self.writer = writer
        self.store, self.disk = writer.store, writer.disk
        self.config = config
        self.stats = writer.stats
        self._mover: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self._mover is not None:
            self._mover.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._mover

    def relieve_disk(self) -> None:
        """With the data dir over `disk-quota` (or an application over `app-disk-quota`), start moving its
        oldest pieces to objects unless that is under way."""
        if self.disk is None or (self._mover is not None and not self._mover.done()):
            return
        if self._over_disk() > 0:
            self._mover = asyncio.create_task(self._move())

    def _over_disk(self) -> int:
        """Bytes to move: down to DISK_LOW of the daemon's quota, or of an application's."""
        assert self.disk is not None
        cfg = self.config
        over = 0
        live = self._live_disk_bytes()
        if cfg.disk_quota and live > cfg.disk_quota:
            over = live - int(cfg.disk_quota * DISK_LOW)
        if cfg.app_disk_quota:
            for held in self._app_disk_bytes().values():
                if held > cfg.app_disk_quota:
                    over = max(over, held - int(cfg.app_disk_quota * DISK_LOW))
        return over

    def _app_disk_bytes(self) -> dict[str, int]:
        """Each application's spill file bytes, less those moved already (punched soon), as the daemon's."""
        moved: Counter[str] = Counter()
        for g in self.store.placement.garbage:
            if not g.shuffle.removed:  # a removed shuffle's bytes left its application's count at once
                moved[g.shuffle.app] += g.length
        return {app: usage.disk_bytes - moved[app] for app, usage in self.store.usage.items()}

    def _choose(self) -> tuple[ShuffleData, list[Pieces]] | None:
        """The next pieces to move: of the applications still above DISK_LOW of their own quota first, of
        any application only while the daemon's own spill files are above DISK_LOW of theirs (moving another
        application's pieces brings no application under its quota)."""
        cfg = self.config
        quota = cfg.app_disk_quota
        first = {app for app, held in self._app_disk_bytes().items() if quota and held > quota * DISK_LOW}
        everyone = bool(cfg.disk_quota) and self._live_disk_bytes() > cfg.disk_quota * DISK_LOW
        return self.store.placement.coldest_on_disk(first, self.writer.claimed, self.writer.most, everyone)

    def _live_disk_bytes(self) -> int:
        """Spill file bytes not yet given back, less those moved already (punched soon)."""
        assert self.disk is not None
        return self.disk.stats.used_bytes - sum(g.length for g in self.store.placement.garbage)

    async def _move(self) -> None:
        try:
            over = self._over_disk()
            while over > 0:
                found = self._choose()
                if found is None:
                    return
                data, pieces = found
                outs = [out for out, _ in pieces]
                self.writer.claimed.update(outs)
                try:
                    written = await self.writer.write(data, pieces, [], "moved")
                finally:
                    self.writer.claimed.difference_update(outs)
                if written is not None:
                    self.writer.placed(pieces, written)
                over -= sum(out.sizes[i] for out, indices in pieces for i in indices)
        except (StorageError, CorruptData) as exc:
            self.stats.write_errors += 1
            event(log, "moving spilled data to the object store failed", logging.WARNING, reason=exc.message)
        except Exception:
            event(log, "moving spilled data to the object store failed", logging.ERROR, exc_info=True)
