"""One file of shared memory cut into slots of one size, as the daemon holds it (PROTOCOL.md §6.3): a
connection's push slots, or its read slots.

The daemon never loads or stores through a mapping of such a file: the client holds it open (the push slots'
read-write) and may shrink it (`ftruncate`), and a load from a mapped page past the end of a file is SIGBUS,
the death of the daemon and of everyone's shuffles. It copies with `preadv`/`pwritev` on its own descriptor
instead (the same one copy, and a system call), which past the end reads short or grows the file back: the
client who shrank it loses its own push or connection (`RegionLost`). Its mapping is only for giving pages
back (`MADV_REMOVE`, which touches no page), until the connection ends.
"""

from __future__ import annotations

import mmap
import os
import secrets

from ..protocol.errors import InvalidRequest

_MAKE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW


class RegionLost(InvalidRequest):
    """The client's region no longer holds a slot the daemon copies from or into: the client shrank the file
    (only its own connection's data is in it, so only its own push or connection fails)."""


class SlotFile:
    """`count` slots of `slot_size` bytes in a new file of `directory` under a random name, with `mode` and,
    when the daemon is root, the client's user (`owner`) as its owner."""

    def __init__(self, directory: str, count: int, slot_size: int, owner: int | None, mode: int) -> None:
        self.slot_size = slot_size
        self.count = count
        self.size = count * slot_size
        self._dir = directory
        self.path: str | None = os.path.join(directory, secrets.token_hex(16))
        #: what the daemon copies through, and where a slot's pages are allocated; open until the connection ends
        self._fd: int | None = os.open(self.path, _MAKE, 0o600)
        self._map: mmap.mmap | None = None
        try:
            os.fchmod(self._fd, mode)
            if owner is not None and os.geteuid() == 0:  # the client's own; else it is the socket's group's
                os.fchown(self._fd, owner, -1)
            os.ftruncate(self._fd, self.size)
            self._map = mmap.mmap(self._fd, self.size, flags=mmap.MAP_SHARED)
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return self._fd is None

    def _descriptor(self) -> int:
        """The file's descriptor; OSError once the connection ended."""
        if self._fd is None:
            raise OSError("the connection is closed")
        return self._fd

    def unlink(self) -> None:
        """Take the file's name off the host (its pages stay while mapped)."""
        path, self.path = self.path, None
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """The connection ended: pages not given back go when the client unmaps the file too."""
        self.unlink()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        region, self._map = self._map, None
        if region is not None:
            region.close()

    def allocate(self, index: int) -> str | None:
        """Slot `index` given its pages now; or why it cannot be: a full tmpfs is found here, where a store into
        a page that cannot be had would kill the process storing (SIGBUS)."""
        try:
            os.posix_fallocate(self._descriptor(), index * self.slot_size, self.slot_size)
        except OSError as exc:
            return f"no room for shared memory in {self._dir}: {exc}"
        return None

    def punch(self, index: int) -> None:
        """Slot `index` gives its pages back to the host (the next to use it allocates them again); once the
        connection ended, they go with the client's mapping."""
        if self._map is not None:
            self._map.madvise(mmap.MADV_REMOVE, index * self.slot_size, self.slot_size)

    def read(self, index: int, views: list[memoryview]) -> None:
        """`views` filled back to back from the start of slot `index`; RegionLost when the file no longer
        holds their bytes (the client shrank it)."""
        want = sum(map(len, views))
        try:
            got = os.preadv(self._descriptor(), views, index * self.slot_size)
        except OSError as exc:
            raise RegionLost(f"cannot read shared memory slot {index}: {exc}") from None
        if got != want:
            raise RegionLost(f"shared memory from slot {index} holds {got} of {want} bytes placed: it was shrunk")

    def write(self, index: int, views: list[memoryview]) -> None:
        """`views` back to back from the start of slot `index`. Past the end of a file the client shrank, the
        write grows it back; OSError where the host has no pages for that, or the connection ended."""
        want = sum(map(len, views))
        written = os.pwritev(self._descriptor(), views, index * self.slot_size)
        if written != want:
            raise OSError(f"{written} of {want} bytes written")
