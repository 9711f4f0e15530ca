"""What one application may hold on this daemon: memory (`app-memory-quota`) and disk (`app-disk-quota`).

A quota refuses a push only where nothing else can make room: over its memory quota an application's data
is spilled instead when the daemon can spill (its pushes wait meanwhile, spill.py), and over its disk quota
its spill files move to the object store when they can.
"""

from __future__ import annotations

from ...protocol.errors import QuotaExceeded
from .shuffles import AppUsage


class Quotas:
    def __init__(
        self, segment_size: int, memory_quota: int, disk_quota: int, *, can_spill: bool, moves_disk: bool
    ) -> None:
        #: per application, in segments and bytes; 0 = no cap
        self.memory = memory_quota // segment_size
        self.disk = disk_quota
        #: spill is possible (a data dir or an object store is set): the memory quota spills instead of refusing
        self.can_spill = can_spill
        #: spill files can move to the object store: the disk quota moves them instead of refusing pushes
        self.moves_disk = moves_disk

    def check_disk(self, app: str, usage: AppUsage) -> None:
        if self.disk and not self.moves_disk and usage.disk_bytes >= self.disk:
            raise QuotaExceeded(
                f"application {app} holds {usage.disk_bytes} bytes on this daemon's disk, "
                f"its quota is {self.disk} (--app-disk-quota)"
            )

    def check_memory(self, app: str, usage: AppUsage) -> None:
        if self.memory and not self.can_spill and usage.segments >= self.memory:
            raise QuotaExceeded(
                f"application {app} holds {usage.segments} segments of this daemon's memory, its quota "
                f"is {self.memory} (--app-memory-quota; without --data-dir nothing can be spilled)"
            )

    def over_memory(self, usage: AppUsage | None) -> bool:
        """Over its memory quota: to be spilled below it."""
        return bool(self.memory) and usage is not None and usage.segments > self.memory
