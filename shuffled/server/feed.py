"""Serving a plan (plan.py): its items turned into DATA payloads as the reader's credit asks for them.

A whole piece in memory goes out as it is: the payload is the pushed group, its CRC32C
the writer's, nothing copied or parsed. Everything else (a piece cut to the range, small
whole pieces, the rest of a resumed pair) is copied into a frame of its own, a segment of
the read reserve, as many groups as fit; its CRC32C is computed over what it holds. A
frame that took slices of many pieces holds one segment, not theirs: the pieces it
copied from, loaded from disk or not, are free to go.

A spilled piece is loaded whole into a segment of the read reserve and checked against
the CRC32C the writer sent, so everything served was checked on arrival or on load; the
pieces an attempt's items need next are loaded together when they lie back to back in
the file (one `preadv`), and only as far as the reader has credit, so a read holds a
bounded number of segments whatever its size. The feed runs as one task per read,
woken when credit comes back in batches (`LOOKAHEAD`), not per frame.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable, Iterator

from ..buffers import Buffer
from ..logs import event
from ..protocol.errors import CorruptData, InternalError, InvalidRequest, PartitionNotFound, ShuffledError
from ..protocol.integrity import checksum
from ..protocol.packed import directory, slice_group
from .chunks import Chunk
from .plan import Entry, Item, Plan, items
from .services import Services
from .store import MapOutput

log = logging.getLogger(__name__)

#: frames made beyond the reader's credit (so credit that arrives finds data ready), and how much room a
#: waiting feed needs before it is woken (so it runs once per batch of frames, not per frame)
LOOKAHEAD = 8
#: most spilled pieces loaded with one preadv
MAX_BATCH = 16


class PieceLoader:
    """Loads spilled pieces into read-reserve segments, checked against their CRC32C; keeps one file open."""

    __slots__ = ("_fd", "_path", "disk", "pool")

    def __init__(self, services: Services) -> None:
        self.pool = services.pool
        disk = services.disk
        assert disk is not None, "pieces are spilled only with a data dir"
        self.disk = disk
        self._fd: int | None = None
        self._path = ""

    async def take(self, want: int) -> list[Buffer]:
        """Up to `want` segments of the read reserve, counted when they are taken: whatever is free then (a
        consumer's credit may exceed what a small or busy pool can give at once), else one, waited for in
        turn (the reserve guarantees it in time), plus what the wait left free. Never more than is free, so
        a batch does not wait for memory it cannot get; what requests already waiting can use stays theirs
        (`free_for_readers`: a waiting push leaves the reserve to reads)."""
        pool = self.pool
        now = min(want, pool.free_for_readers)
        got = pool.try_take(now, use_reserve=True) if now else None
        if got is None:
            got = await pool.take(1, use_reserve=True)
            more = min(want - 1, pool.free_for_readers)
            if more:
                got += pool.try_take(more, use_reserve=True) or []
        for buf in got:
            buf.set_recycler(pool.give)
        return got

    async def load(self, path: str, offset: int, sizes: list[int], crcs: list[int], what: str) -> list[Buffer]:
        """The pieces of `sizes` bytes each from `offset` on (back to back), or as many of the first of them
        as memory allows now (at least one). Raises CORRUPT_DATA or PARTITION_NOT_FOUND (the file is gone).
        Cancelling it is safe: a read under way gives its segments back when the thread is done with them."""
        buffers = await self.take(len(sizes))
        for buf, size in zip(buffers, sizes, strict=False):
            buf.length = size
        if self._fd is not None and self._path != path:
            self.close()
        fd, self._fd = self._fd, None
        reading = self.disk.read(fd, path, offset, [b.data() for b in buffers])
        try:
            self._fd, got = await asyncio.shield(reading)
        except asyncio.CancelledError:
            reading.add_done_callback(lambda _: _give_back(reading, buffers))
            raise
        except FileNotFoundError:
            _release(buffers)
            raise PartitionNotFound(f"spill file {path} is gone (shuffle removed while being read?)") from None
        except (OSError, EOFError) as exc:
            _release(buffers)
            raise CorruptData(f"reading spilled data from {path} failed: {exc}") from None
        self._path = path
        for n, (crc, want) in enumerate(zip(got, crcs, strict=False)):
            if crc != want:
                _release(buffers)
                raise CorruptData(
                    f"spilled data of {what} failed its CRC32C check at offset {offset + sum(sizes[:n])} of {path}"
                )
        return buffers

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _release(buffers: list[Buffer]) -> None:
    for buf in buffers:
        buf.release()


def _give_back(reading: asyncio.Future[tuple[int, list[int]]], buffers: list[Buffer]) -> None:
    """A load whose caller went away: its segments (and file) go back once the thread is done with them."""
    _release(buffers)
    if not reading.cancelled() and reading.exception() is None:
        os.close(reading.result()[0])


class PlanFeed:
    """One read's plan turned into payloads handed to `sink`, while `budget()` (frames wanted now) is
    positive; `kick()` when it may have grown. `start` runs it; `close` stops it and frees what it holds."""

    __slots__ = (
        "_budget",
        "_fill",
        "_frame",
        "_loaded",
        "_room",
        "_waiting",
        "left",
        "limit",
        "loader",
        "plan",
        "services",
        "sink",
        "task",
    )

    def __init__(
        self, services: Services, plan: Plan, sink: Callable[[Chunk], None], budget: Callable[[], int]
    ) -> None:
        self.services = services
        self.plan = plan
        self.sink = sink
        self._budget = budget
        self.limit = services.pool.segment_size
        #: pieces not served yet (a backlog estimate for the reader's credit)
        self.left = plan.pieces
        self.loader = PieceLoader(services) if services.disk is not None else None
        #: the frame being filled (a read-reserve segment) and its fill
        self._frame: Buffer | None = None
        self._fill = 0
        #: pieces of the current entry loaded from disk and still to be served, by index
        self._loaded: dict[int, Buffer] = {}
        self._room = asyncio.Event()
        self._waiting = False
        self.task: asyncio.Task[None] | None = None

    def start(self, on_done: Callable[[], None], on_error: Callable[[ShuffledError], None]) -> None:
        async def run() -> None:
            try:
                await self._run()
            except ShuffledError as exc:
                on_error(exc)
                return
            except Exception as exc:  # a bug must fail this read, never leave the reader waiting
                event(log, "serving a read failed", logging.ERROR, exc_info=True)
                on_error(InternalError(f"serving a read failed: {exc.__class__.__name__}: {exc}"))
                return
            on_done()

        self.task = asyncio.create_task(run())

    def kick(self) -> None:
        """The sink took frames or got credit: wake the feed if it waits and a batch fits now."""
        if self._waiting and self._budget() >= LOOKAHEAD:
            self._waiting = False
            self._room.set()

    def close(self) -> None:
        if self.task is not None and asyncio.current_task() is not self.task:
            self.task.cancel()

    async def _run(self) -> None:
        try:
            for entry in self.plan.entries:
                await self._serve(entry)
            self._flush()
        finally:
            self._release()

    def _release(self) -> None:
        loaded, self._loaded = self._loaded, {}
        _release(list(loaded.values()))
        if self._frame is not None:
            self._frame.release()
            self._frame = None
        if self.loader is not None:
            self.loader.close()

    async def _serve(self, entry: Entry) -> None:
        out = entry.out
        pending = items(entry)
        ahead: deque[Item] = deque()
        skip = entry.skip
        while ahead or _pull(pending, ahead):
            if self._budget() <= 0:
                self._waiting = True
                self._room.clear()
                await self._room.wait()
            if self.plan.removed:
                raise PartitionNotFound(
                    f"shuffle {out.shuffle.app}/{out.shuffle.shuffle} was removed while being read (its data is gone)"
                )
            i, lo, hi, final = ahead[0]
            buf = out.buffer(i) or self._loaded.get(i)
            if buf is None:
                await self._load(out, ahead, pending)
                continue
            if skip and lo != entry.lo:
                raise InvalidRequest("resume point does not match this copy")
            whole = not skip and lo == out.firsts[i] and hi == out.lasts[i] + 1
            if whole and buf.length > self.limit // 2:
                self._flush()
                buf.retain()
                self.sink(Chunk(buf, lo, out.attempt, out.crcs[i]))
            else:
                skip = await self._copy(buf, lo, hi, whole, skip)
            ahead.popleft()
            if final:
                self.left -= 1
                if i in self._loaded:
                    self._loaded.pop(i).release()
        if skip:
            raise InvalidRequest("resume point does not match this copy")
        assert not self._loaded, "every loaded piece's last item was served"

    async def _copy(self, piece: Buffer, lo: int, hi: int, whole: bool, skip: int) -> int:
        """Copy the item's runs into the frame in progress, or a new one if they do not fit; what is left
        of `skip`."""
        group = piece.data()
        parts: tuple[memoryview | bytes, ...]
        if whole:
            parts, size = (group,), piece.length
        else:
            if not skip:
                found = slice_group(group, lo, hi)
            elif (length := directory(group).run_length(lo)) > skip:
                found, skip = slice_group(group, lo, hi, skip), 0
            else:  # the pair's run here was relayed whole: it goes on in a later piece, or it ends short
                skip -= length
                found = slice_group(group, lo + 1, hi)
                if found is not None and skip:
                    raise InvalidRequest("resume point does not match this copy")
            if found is None:
                return skip
            parts, size = found.parts, len(found)
        if self._fill + size > self.limit:
            self._flush()
        pool = self.services.pool
        held: Buffer | None = None
        if self._frame is None:
            got = pool.try_take(1, use_reserve=True)
            if got is None:
                held = piece  # the store may let go of it while this waits (spilled, removed)
                held.retain()
                try:
                    got = await pool.take(1, use_reserve=True)
                except BaseException:
                    held.release()
                    raise
            got[0].set_recycler(pool.give)
            self._frame = got[0]
        room, at = self._frame.memory, self._fill
        for part in parts:
            n = len(part)
            room[at : at + n] = part
            at += n
        self._fill = at
        if held is not None:
            held.release()
        return skip

    def _flush(self) -> None:
        frame, fill = self._frame, self._fill
        if frame is None or not fill:
            return
        self._frame, self._fill = None, 0
        frame.length = fill
        self.sink(Chunk(frame, 0, 0, checksum(frame.data())))

    async def _load(self, out: MapOutput, ahead: deque[Item], pending: Iterator[Item]) -> None:
        """Load the piece the next item needs and those after it that lie right behind it in the file,
        as far as the sink wants frames (one at least)."""
        assert self.loader is not None and out.shuffle.file is not None
        want = min(MAX_BATCH, max(1, self._budget()))
        first = ahead[0][0]
        batch = [first]
        k = 0
        while len(batch) < want:
            k += 1
            if k >= len(ahead) and not _pull(pending, ahead):
                break
            i = ahead[k][0]
            if i == batch[-1]:
                continue
            prev = batch[-1]
            if i != prev + 1 or i >= out.spilled or i in self._loaded:
                break
            if out.offsets[i] != out.offsets[prev] + out.sizes[prev]:
                break  # another attempt's pieces lie between
            batch.append(i)
        sizes = [out.sizes[i] for i in batch]
        crcs = [out.crcs[i] for i in batch]
        what = f"map attempt {out.attempt} of {out.shuffle.app}/{out.shuffle.shuffle}"
        got = await self.loader.load(out.shuffle.file.path, out.offsets[first], sizes, crcs, what)
        self._loaded.update(zip(batch, got, strict=False))


def _pull(pending: Iterator[Item], ahead: deque[Item]) -> bool:
    nxt = next(pending, None)
    if nxt is None:
        return False
    ahead.append(nxt)
    return True
