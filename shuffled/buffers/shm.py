"""Shared memory between a daemon and one local client connection (PROTOCOL.md §6.3).

A local writer's bytes need not cross a socket: the daemon gives each connection that asks for it a region
of its own, a file on tmpfs the client maps, and names in its push credit the slots (segment-sized places)
of that region the writer may fill. When the writer says it filled one, the daemon copies the group into the
pool segment that backs the credit (one copy and a system call, where a socket takes two copies and a system
call on each side) and the slot is free again at once: a region holds only what is in flight, at most the
connection's push credit, and the writer cannot change what was stored.

Isolation: a region holds only what its own connection pushed, so a client can see no other client's data.
Its file is made for the users the Unix socket is for (its mode's owner and group bits, never others'; owned
by the client's user when the daemon is root) in a directory others may pass through but not list, under a
random name, and unlinked as soon as the client sent its first frame after the handshake, and otherwise
when the connection ends: no name is left on the host for another process to open.

A slot's pages are allocated the first time it is granted: with a full tmpfs that credit goes through the
socket instead, where a store into a page that cannot be had would kill the writer (SIGBUS). They stay while
the connection lives (free slots with pages are reused first, the highest first, so few are ever touched
and slots granted together mostly follow each other) and go when it ends.

The read slots (reads in place) are a second file, which the client maps read-only. The daemon never copies
through a mapping of either (slot_file.py: a client that shrinks a file must not kill the daemon).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
import shutil
import time
from bisect import insort
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .slot_file import RegionLost, SlotFile

__all__ = ["DIR_PREFIX", "MappedRegion", "ReadSlots", "RegionDirectory", "RegionLost", "SharedRegion"]

#: the name of a daemon's directory of regions: this prefix, its process id and a random part
DIR_PREFIX = "shuffled-"
#: what a directory's name has before the process id while it is made (until it is locked and renamed)
MAKING = "new"
#: how long a directory being made is spared: its maker locks it and names it within microseconds, so one
#: older than this was left by a daemon killed while making it
MAKING_SECONDS = 60.0
#: how long a daemon waits for the lock on the directory it is making (a sweep holds it for a moment): a
#: sweeper frozen with it must not hang the start, which then goes on without shared memory
LOCK_PATIENCE = 5.0
#: the most slots copied in one system call
RUN_VIEWS = 512


def _slot(placed: tuple[int, memoryview]) -> int:
    return placed[0]


def _runs(placed: list[tuple[int, memoryview]], size: int) -> Iterator[tuple[int, list[memoryview]]]:
    """`(slot, view)` pairs (the slots distinct; sorted here) as runs for one `preadv`/`pwritev` each: slots
    that follow each other while every view but the last fills its slot, so that no byte of a call is past a
    view's end (a segment's tail may hold an earlier buffer of anyone's), at most `RUN_VIEWS` a call (the
    kernel takes no more than IOV_MAX, 1,024 on Linux). The page cache's work is most of a copy's cost, but a
    call a buffer costs a fifth more than one for eight (measured)."""
    placed.sort(key=_slot)
    i, count = 0, len(placed)
    while i < count:
        first, data = placed[i]
        views = [data]
        j = i + 1
        end = min(count, i + RUN_VIEWS)
        while j < end and len(data) == size and placed[j][0] == first + j - i:
            data = placed[j][1]
            views.append(data)
            j += 1
        yield first, views
        i = j


class SharedRegion:
    """The daemon's side of one connection's shared memory: `slots` push slots of `slot_size` bytes in a file
    the client maps read-write and, for a client that reads in place, `read_slots` more (numbered on from
    `slots`) in a file of their own that the client may only read (`ReadSlots`)."""

    def __init__(
        self,
        directory: str,
        slots: int,
        slot_size: int,
        owner: int | None = None,
        mode: int = 0o600,
        read_slots: int = 0,
    ) -> None:
        self.file = SlotFile(directory, slots, slot_size, owner, mode)
        #: free slots whose pages are allocated (in order, the highest taken first: slots taken together then
        #: mostly follow each other, and are copied in one call) and free slots without pages
        self._warm: list[int] = []
        self._cold: list[int] = list(range(slots - 1, -1, -1))
        #: the slots served buffers are put in, for a client that reads in place (None: it does not)
        self.reads: ReadSlots | None = None
        if read_slots:
            try:
                self.reads = ReadSlots(SlotFile(directory, read_slots, slot_size, owner, mode & 0o440), slots)
            except BaseException:
                self.file.close()
                raise
        #: the log said that the tmpfs had no room for more slots (once per region)
        self.full_told = False

    @property
    def slot_size(self) -> int:
        return self.file.slot_size

    @property
    def path(self) -> str | None:
        """The push slots' file while it has a name (the read slots' loses its name with it)."""
        return self.file.path

    def offer(self) -> dict[str, Any]:
        """What a HelloAck's `shm` says of the region (§6.3)."""
        offer: dict[str, Any] = {"path": self.file.path, "size": self.file.size}
        if self.reads is not None:
            offer["reads"] = {"path": self.reads.file.path, "size": self.reads.file.size}
        return offer

    def unlink(self) -> None:
        """Take the region's names off the host (its pages stay while mapped)."""
        self.file.unlink()
        if self.reads is not None:
            self.reads.file.unlink()

    def close(self) -> None:
        """The connection ended: no slot is granted again, and the free slots' pages go now; the rest (slots
        still lent to the client or granted to its pushes) go when the client unmaps the region, as the
        daemon holds it no more."""
        self.unlink()
        warm, self._warm = self._warm, []
        try:
            for slot in warm:
                self.file.punch(slot)
            self._cold.extend(warm)
            if self.reads is not None:
                self.reads.close()
        finally:
            self.file.close()

    @property
    def closed(self) -> bool:
        return self.file.closed

    @property
    def free(self) -> int:
        return len(self._warm) + len(self._cold)

    @property
    def held(self) -> int:
        """Push slots not free: granted to pushes as credit, or placed and not yet copied out."""
        return self.file.count - self.free

    def take(self, n: int) -> tuple[list[int], str | None]:
        """Up to n free slots to name in push credit, those with pages first, and why there are fewer: a
        tmpfs with no room for a slot's pages (the rest of the credit then goes through the socket). There
        are always n free slots: every slot named stands for a pool segment promised as credit, and the
        region has one slot per segment."""
        if n > self.free:
            raise RuntimeError(f"shared region: {n} slots wanted, {self.free} free")
        warm, cold = self._warm, self._cold
        taken = [warm.pop() for _ in range(min(n, len(warm)))]
        while len(taken) < n:
            full = self.file.allocate(cold[-1])
            if full is not None:
                return taken, full
            taken.append(cold.pop())
        return taken, None

    def copy_out(self, placed: list[tuple[int, memoryview]]) -> None:
        """The groups the writer put in slots, `(slot, into)`: each copied into `into` (its length placed),
        slots that follow each other in one call; every slot is free again either way. RegionLost when a slot
        no longer holds its group (the client shrank its region)."""
        try:
            for first, views in _runs(placed, self.slot_size):
                self.file.read(first, views)
        finally:
            self.give_back([slot for slot, _ in placed])

    def give_back(self, slots: Iterable[int]) -> None:
        """Slots are free again: used, or named in credit that was never used (the push ended)."""
        if self.file.closed:  # their pages go with the client's mapping
            self._cold.extend(slots)
            return
        warm = self._warm
        for slot in slots:
            insort(warm, slot)


class ReadSlots:
    """The read slots of a region (PROTOCOL.md §6.3, reads in place), in a file of their own the client maps
    read-only: the daemon puts a served buffer in one and lends it to the client until the client gives it
    back. Pages are allocated when a slot is first taken (a full tmpfs sends buffers through the socket for
    `FULL_RETRY` seconds, told once to `on_full`). A slot given back keeps them for the next buffers (giving
    pages back and faulting them in anew per buffer cost concurrent reads more than their copies); once the
    client has held no slot and been lent none for `IDLE` seconds, all but `WARM` free slots give theirs back
    to the host, so a connection whose reads once held many slots does not keep that much tmpfs. The daemon
    sets `later` (its loop's `call_later`); without it the free slots beyond `WARM` give their pages back as
    soon as none is lent."""

    #: free read slots that keep their pages once the client's reads are idle
    WARM = 128
    #: seconds with no slot lent nor held before the free ones beyond `WARM` give their pages back
    IDLE = 5.0
    #: after a tmpfs had no room for a slot's pages, seconds before a cold slot is tried again
    FULL_RETRY = 1.0

    def __init__(self, file: SlotFile, first: int) -> None:
        self.file = file
        self.slot_size = file.slot_size
        #: the number of the file's first slot (the push slots' come before)
        self.first = first
        #: free slots with pages, in order (the highest lent first, so that slots lent together mostly follow
        #: each other and are written in one call), and free slots without pages
        self._warm: list[int] = []
        self._cold: list[int] = list(range(first + file.count - 1, first - 1, -1))
        #: slots holding a served buffer the client has not given back
        self.lent: set[int] = set()
        self._full_until = 0.0
        #: told the first time the tmpfs has no room for a slot's pages, with the reason (the daemon logs it)
        self.on_full: Callable[[str], None] | None = None
        #: told, once, that a served buffer could not be put in its slot (the daemon ends the connection)
        self.on_lost: Callable[[RegionLost], object] | None = None
        #: runs a callback after some seconds (the daemon's loop's `call_later`), for the idle trim
        self.later: Callable[[float, Callable[[], None]], object] | None = None
        self._trim_due = False
        #: when a slot was last lent (monotonic)
        self._lent_at = 0.0

    def take(self, n: int) -> list[int]:
        """Up to `n` slots to put served buffers in, lent from now on, those with pages first; fewer (or none):
        every slot is lent, or the tmpfs has no room for more pages (the other buffers then go through the
        socket)."""
        if self.file.closed:
            return []  # the connection ended: nothing is lent any more (and no tmpfs is full)
        warm = self._warm
        keep = max(0, len(warm) - n)
        taken = warm[keep:][::-1]  # the highest: free slots in order, so that most follow each other
        del warm[keep:]
        cold = self._cold
        while len(taken) < n and cold and time.monotonic() >= self._full_until:
            full = self.file.allocate(cold[-1] - self.first)
            if full is not None:
                self._full_until = time.monotonic() + self.FULL_RETRY
                on_full, self.on_full = self.on_full, None
                if on_full is not None:
                    on_full(full)
                break
            taken.append(cold.pop())
        if taken:
            self.lent.update(taken)
            self._lent_at = time.monotonic()
        return taken

    def put(self, placed: list[tuple[int, memoryview]]) -> None:
        """Served buffers into their slots: `(slot, data)`, the slots distinct, those that follow each other
        in one call. Past the end of a file the client shrank, a write grows it back; where the host has no
        pages for that (or the connection ended), the slot keeps what it held and is named all the same (the
        client's CRC32C check fails it: only a client that shrank its file gets here, as a lent or free slot
        keeps its pages), and `on_lost` is told, once: the daemon ends that client's connection with the
        reason."""
        for first, views in _runs(placed, self.slot_size):
            try:
                self.file.write(first - self.first, views)
            except OSError as exc:
                on_lost, self.on_lost = self.on_lost, None
                if on_lost is not None:
                    on_lost(RegionLost(f"cannot put served buffers in shared memory from slot {first}: {exc}"))

    def returned(self, slots: Iterable[int]) -> None:
        """The client is done with these slots; ValueError names one it does not hold (the others are back)."""
        lent, warm, wrong = self.lent, self._warm, None
        for slot in slots:
            if slot not in lent:
                wrong = slot if wrong is None else wrong
                continue
            lent.remove(slot)
            insort(warm, slot)
        if not lent and len(warm) > self.WARM and not self._trim_due:
            self._trim_after(self.IDLE)
        if wrong is not None:
            raise ValueError(f"slot {wrong} holds no served buffer of the client's")

    def _trim_after(self, seconds: float) -> None:
        if self.later is None:
            self._trim()
            return
        self.later(seconds, self._trim)
        self._trim_due = True

    def _trim(self) -> None:
        """If the client holds no slot and was lent none for `IDLE` seconds, the free slots beyond `WARM` give
        their pages back, the lowest first (a read takes the highest); lent one since, check again `IDLE`
        seconds after it."""
        self._trim_due = False
        if self.lent or self.file.closed:
            return  # the client's reads go on: the next slot it gives back that leaves none lent comes here
        quiet = time.monotonic() - self._lent_at
        if self.later is not None and quiet < self.IDLE:
            self._trim_after(self.IDLE - quiet)
            return
        excess = max(0, len(self._warm) - self.WARM)
        self._pages_back(self._warm[:excess])
        del self._warm[:excess]

    def close(self) -> None:
        """The connection ended: free slots give their pages back. Lent ones keep theirs: the client may still
        be reading them (the daemon may have ended the connection, not the client), and they go when the
        client's mapping goes (the file has no name any more)."""
        warm, self._warm = self._warm, []
        self._pages_back(warm)
        self.lent.clear()
        self.file.close()

    def _pages_back(self, free: list[int]) -> None:
        """These free slots give their pages back to the host (cold: the next to take one allocates them)."""
        for slot in free:
            self.file.punch(slot - self.first)
        self._cold.extend(free)


class RegionDirectory:
    """Where a daemon makes its regions: a directory of its own under `parent` (mode 0711: others may pass
    through it to a name they were given, but not list it), made at start and removed at stop. A daemon
    killed leaves its directory behind; the next one on the host removes it (`open`), once it holds the lock
    the owner held on it for its whole life: a process id that is not running here may be a live daemon's in
    another PID namespace sharing the directory, but a lock is released only by its holder's end."""

    def __init__(self, parent: str | None, mode: int = 0o600) -> None:
        self.parent = parent
        #: the regions' file mode: the Unix socket's, for its owner and group only (never others)
        self.mode = mode & 0o660
        self.path: str | None = None
        #: the directory, open and locked while this daemon lives
        self._lock: int | None = None

    def open(self, pool_bytes: int) -> None:
        """OSError when `parent` cannot serve: its filesystem smaller than the pool (a container's own
        /dev/shm is often 64 MiB) could run out of pages a writer was promised."""
        parent = self.parent
        if parent is None:
            return
        fs = os.statvfs(parent)
        if fs.f_blocks * fs.f_frsize < pool_bytes:
            size = fs.f_blocks * fs.f_frsize >> 20
            raise OSError(f"{parent} holds {size} MiB, less than the pool ({pool_bytes >> 20} MiB)")
        for name in os.listdir(parent):
            pid = name[len(DIR_PREFIX) :].split("-", 1)[0] if name.startswith(DIR_PREFIX) else ""
            if pid.isdigit() or pid == MAKING:
                _remove_if_abandoned(os.path.join(parent, name), young=0 if pid.isdigit() else MAKING_SECONDS)
        # Made under a name whose sweep spares it while it is young, locked, and only then given its name: a
        # daemon starting at the same moment must never find it unlocked and take it for abandoned.
        tag = f"{os.getpid()}-{secrets.token_hex(4)}"
        making = os.path.join(parent, f"{DIR_PREFIX}{MAKING}-{tag}")
        path = os.path.join(parent, f"{DIR_PREFIX}{tag}")
        os.mkdir(making, 0o711)
        try:
            os.chmod(making, 0o711)  # whatever the umask
            self._lock = _locked(making, patience=LOCK_PATIENCE)
            os.rename(making, path)  # the lock is the directory's, not its name's
        except BaseException:
            self.close()
            shutil.rmtree(making, ignore_errors=True)
            raise
        self.path = path

    def region(self, slots: int, slot_size: int, owner: int | None, read_slots: int = 0) -> SharedRegion | None:
        """A new region, or None when this daemon offers none (no usable directory)."""
        if self.path is None:
            return None
        return SharedRegion(self.path, slots, slot_size, owner, self.mode, read_slots)

    def close(self) -> None:
        path, self.path = self.path, None
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
        lock, self._lock = self._lock, None
        if lock is not None:
            os.close(lock)


def _locked(path: str, patience: float = 0.0) -> int:
    """`path` (a directory) open with an exclusive lock; BlockingIOError while someone else holds it for
    longer than `patience` seconds (a sweep that looks at a directory being made lets go at once)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        give_up = time.monotonic() + patience
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not patience:
                    raise
                if time.monotonic() >= give_up:
                    raise BlockingIOError(f"{path} still locked by another process after {patience:.0f} s") from None
                time.sleep(0.005)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_if_abandoned(path: str, young: float) -> None:
    """Remove another daemon's directory if its owner is gone (its lock is free) and it is older than `young`
    seconds; keep it when that cannot be told (another user's, locked, or gone meanwhile)."""
    try:
        fd = _locked(path)
    except OSError:  # held by a live daemon, or not ours to open
        return
    try:
        if young and time.time() - os.fstat(fd).st_mtime < young:
            return  # being made: its maker locks it next
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)


class MappedRegion:
    """A client's side of its connection's region: the push slots mapped read-write and, for reads in place,
    the read slots (numbered on from the push slots) mapped read-only; the daemon unlinks their names."""

    def __init__(self, path: str, size: int, slot_size: int, reads: tuple[str, int] | None = None) -> None:
        if size % slot_size or (reads is not None and reads[1] % slot_size):
            raise ValueError(f"shared region of {size} (reads: {reads}) bytes is not in slots of {slot_size}")
        self._map = _mapped(path, size, writable=True)
        try:
            self._reads = None if reads is None else _mapped(*reads, writable=False)
        except BaseException:
            self._map.close()
            raise
        self.slot_size = slot_size
        #: push slots; the read slots are numbered slots..slots+read_slots-1
        self.slots = size // slot_size
        self.view = memoryview(self._map)
        self.read_slots = 0 if reads is None else reads[1] // slot_size
        self._read_view = memoryview(self._reads) if self._reads is not None else memoryview(b"")

    def slot(self, index: int) -> memoryview:
        """Push slot `index`, to write a group into."""
        start = index * self.slot_size
        return self.view[start : start + self.slot_size]

    def read_slot(self, index: int) -> memoryview:
        """Read slot `index` (read-only)."""
        start = (index - self.slots) * self.slot_size
        return self._read_view[start : start + self.slot_size]


def _mapped(path: str, size: int, writable: bool) -> mmap.mmap:
    fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_size != size:
            raise OSError(f"shared region {path} is not {size} bytes")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot)
    finally:
        os.close(fd)
