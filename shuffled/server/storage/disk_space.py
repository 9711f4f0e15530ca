"""Giving the disk back: the blocks of spilled pieces no read will want again, and the files of dropped
shuffles. The spiller fills the disk (spill.py); the lifecycle (lifecycle.py) calls these as data goes."""

from __future__ import annotations

import logging

from ...logs import event
from .disk import Disk
from .placement import Placement
from .shuffles import Garbage, ShuffleData

log = logging.getLogger(__name__)


async def reclaim(placement: Placement, disk: Disk | None) -> None:
    """Free the disk blocks of aborted attempts' spilled pieces (a writer that vanished mid-push left them;
    they would stay until the shuffle goes, and one client could fill the disk that way) and of pieces that
    moved to the object store. A shuffle with a load under way keeps its garbage until the next call: the
    load may be reading a moved piece where it was."""
    garbage, placement.garbage = placement.garbage, []
    if disk is None or not garbage:
        return
    files: dict[str, list[Garbage]] = {}
    for g in garbage:
        if g.shuffle.loading:
            placement.garbage.append(g)
        elif not g.shuffle.removed:  # a removed shuffle's directory goes as a whole
            files.setdefault(g.path, []).append(g)
    for path, pieces in files.items():
        try:
            await disk.punch(path, [(g.offset, g.length) for g in pieces])
        except OSError as exc:
            event(log, "reclaiming disk failed", logging.WARNING, path=path, reason=exc)
            continue
        for g in pieces:
            if not g.shuffle.removed:  # removed meanwhile: `removed` settled the shuffle's accounting
                g.shuffle.disk_bytes -= g.length
                g.shuffle.usage.disk_bytes -= g.length
                disk.stats.used_bytes -= g.length
            disk.stats.reclaimed_bytes += g.length


async def removed(disk: Disk | None, shuffles: list[ShuffleData]) -> None:
    """Delete the files of dropped shuffles (after any spill of theirs still being written)."""
    if disk is None:
        return
    for data in shuffles:
        if data.directory is not None:
            await disk.remove(data.directory)
            disk.stats.used_bytes -= data.disk_bytes
            disk.stats.files -= data.file is not None
