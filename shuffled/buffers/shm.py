"""Shared memory between a daemon and one local client connection (PROTOCOL.md §6.3).

A local writer's bytes need not cross a socket: the daemon gives each connection that asks for it a region
of its own, a file on tmpfs the client maps, and names in its push credit the slots (segment-sized places)
of that region the writer may fill. A group the writer put in a slot becomes stored data without a copy:
the daemon points the pool segment that backs the credit at the slot (`SharedRegion.lend`), checks the
writer's CRC32C in place, and points it home again when the stored data is freed (`restore`). While a
segment's data lives in a region its own memory is idle, and is given back to the kernel
(`GlobalPool.idle`): the daemon's memory stays the pool's size.

Isolation: a region holds only what its own connection pushed, so a client can see no other client's data.
Its file is made with mode 0600 (owned by the client's user when the daemon may give it away) in a
directory others may pass through but not list, under a random name, and unlinked as soon as the client
sent its first frame after the handshake, and otherwise when the connection ends: no name is left on the
host for another process to open. The pages live on while either side maps them (stored data the
connection pushed outlives it, until it is read, spilled or dropped).

Slots freed beyond `keep` lose their pages (`MADV_REMOVE`): a connection that once pushed a burst does not
hold its peak in memory.
"""

from __future__ import annotations

import mmap
import os
import secrets
import shutil
from collections.abc import Iterable

from .pool import Buffer, Recycler

#: the name of a daemon's directory of regions: this prefix, its process id and a random part
DIR_PREFIX = "shuffled-"
_MAKE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW


class SharedRegion:
    """The daemon's side of one connection's region: `slots` places of `slot_size` bytes."""

    def __init__(
        self, directory: str, slots: int, slot_size: int, keep: int, home: Recycler, owner: int | None = None
    ) -> None:
        self.slot_size = slot_size
        #: where a segment goes once its stored data in a slot is freed (the global pool)
        self.home = home
        self.slots = slots
        self.keep = keep
        self.path: str | None = os.path.join(directory, secrets.token_hex(16))
        fd = os.open(self.path, _MAKE, 0o600)
        try:
            if owner is not None and owner != os.geteuid():
                os.fchown(fd, owner, -1)  # the client's user may open it; a daemon not root cannot, and the
            os.ftruncate(fd, slots * slot_size)  # client then asks again without shared memory (§6.3)
            self._map = mmap.mmap(fd, slots * slot_size, flags=mmap.MAP_SHARED)
        except BaseException:
            self.unlink()
            raise
        finally:
            os.close(fd)
        self._view = memoryview(self._map)
        #: free slots whose pages are resident (reused first, last freed first) and free slots without pages
        self._warm: list[int] = []
        self._cold: list[int] = list(range(slots - 1, -1, -1))
        #: buffers pointed at a slot -> (the slot, the buffer's own room and memory)
        self._lent: dict[Buffer, tuple[int, memoryview, memoryview]] = {}

    def unlink(self) -> None:
        """Take the region's name off the host (its pages stay while mapped)."""
        path, self.path = self.path, None
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    @property
    def free(self) -> int:
        return len(self._warm) + len(self._cold)

    @property
    def lent(self) -> int:
        return len(self._lent)

    def take(self, n: int) -> list[int]:
        """n free slots to name in push credit. There are always enough: every slot named or lent stands
        for a pool segment held as credit or as stored data, and the region has one slot per segment."""
        if n > self.free:
            raise RuntimeError(f"shared region: {n} slots wanted, {self.free} free")
        warm, cold = self._warm, self._cold
        return [warm.pop() if warm else cold.pop() for _ in range(n)]

    def give_back(self, slots: Iterable[int]) -> None:
        """Slots named in credit that was never used (the push ended) are free again."""
        for slot in slots:
            self._free(slot)

    def lend(self, buf: Buffer, slot: int, length: int) -> None:
        """Point `buf` at `slot`, whose first `length` bytes the writer filled: stored data from now."""
        self._lent[buf] = (slot, buf.room, buf.memory)
        start = slot * self.slot_size
        buf.room = buf.memory = self._view[start : start + self.slot_size]
        buf.length = length

    def recycle(self, buf: Buffer) -> None:
        """The recycler of a lent buffer: its memory is its own segment again, its slot is free, and it goes
        home."""
        slot, buf.room, buf.memory = self._lent.pop(buf)
        self._free(slot)
        self.home(buf)

    def _free(self, slot: int) -> None:
        if len(self._warm) < self.keep:
            self._warm.append(slot)
            return
        self._map.madvise(mmap.MADV_REMOVE, slot * self.slot_size, self.slot_size)
        self._cold.append(slot)


class RegionDirectory:
    """Where a daemon makes its regions: a directory of its own under `parent` (mode 0711: others may pass
    through it to a name they were given, but not list it), made at start and removed at stop. A daemon
    killed leaves its directory behind; the next one on the host removes it (`open`)."""

    def __init__(self, parent: str | None) -> None:
        self.parent = parent
        self.path: str | None = None

    def open(self) -> None:
        parent = self.parent
        if parent is None:
            return
        for name in os.listdir(parent):
            pid = name[len(DIR_PREFIX) :].split("-", 1)[0] if name.startswith(DIR_PREFIX) else ""
            if pid.isdigit() and not _running(int(pid)):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        path = os.path.join(parent, f"{DIR_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
        os.mkdir(path, 0o711)
        os.chmod(path, 0o711)  # whatever the umask
        self.path = path

    def region(self, slots: int, slot_size: int, keep: int, home: Recycler, owner: int | None) -> SharedRegion | None:
        """A new region, or None when this daemon offers none (no directory)."""
        return SharedRegion(self.path, slots, slot_size, keep, home, owner) if self.path is not None else None

    def close(self) -> None:
        path, self.path = self.path, None
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: its directory is not ours to judge
        return True
    return True


class MappedRegion:
    """A client's side of its connection's region: mapped read-write, its name unlinked by the daemon."""

    def __init__(self, path: str, size: int, slot_size: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            if os.fstat(fd).st_size != size:
                raise OSError(f"shared region {path} is not {size} bytes")
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.slot_size = slot_size
        self.view = memoryview(self._map)

    def slot(self, index: int) -> memoryview:
        start = index * self.slot_size
        return self.view[start : start + self.slot_size]
