"""How stored data is read: a view of what one read (or one copy) may take, pulled a batch of payloads at a
time (Flink's ResultSubpartitionView). Every path that serves or copies stored bytes reads through one: a
client's or a peer's read of this daemon's store, a failed-over location served from this daemon's own
copy, a drain's or healing's copy of an attempt for another daemon.

The consumer asks `take(room)` for the payloads its room (credit) allows, as many as there are now: each a
`Chunk` (a pool buffer and its CRC32C), with the bytes of the runs they hold. No payload means nothing
now: the view is `finished`, or `busy` (a load from the data file or an object, or memory for a frame, is
on its way: the `listener` is called when it is there), or it needs a piece and `room` is spent (ask again
once there is room). A failure is raised by `take` (a `ShuffledError`: PARTITION_NOT_FOUND once the
shuffle was dropped, CORRUPT_DATA for a piece that fails its check, ...), after the payloads before it were
given out; the view then holds nothing any more.

What a payload is. A read's plan (plan.py) says which runs it serves, in order: a whole piece in memory
goes out as it is (the payload is the pushed group, its CRC32C the writer's, nothing copied or parsed);
everything else (a piece cut to the range, small whole pieces, the rest of a resumed pair) is copied into a
frame of its own, a segment of the read reserve, as many groups as fit, its CRC32C computed over what it
holds. A frame that took slices of many pieces holds one segment, not theirs: the pieces it copied from,
loaded or not, are free to go. A copy's view sends every piece whole, in push order, one payload each, so
the copy's pieces are the original's. The bytes of a payload's runs come from a whole piece's header or
are summed as a frame's parts are copied, never counted per run.

A piece not in memory is loaded whole (loader.py) into a segment of the read reserve and checked against
the CRC32C the writer sent, so everything served was checked on arrival or on load; the pieces the next
items need are loaded together when they lie back to back in one place, and only as far as the room the
consumer has, so a read holds a bounded number of segments whatever its size. `backlog` counts the pieces
not served yet: the backlog the reader's credit follows.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Iterator

from ...buffers import FRAME, Buffer, Chunk, GlobalPool
from ...logs import event
from ...protocol.errors import InternalError, InvalidRequest, PartitionNotFound, ShuffledError
from ...protocol.integrity import checksum
from ...protocol.packed import data_bytes, directory, slice_group
from ...protocol.resume import Resume
from .disk import Disk
from .loader import PieceLoader, run, take
from .objects import ObjectStore
from .plan import Entry, Item, Plan, items, lookup, make_plan
from .shuffles import touch
from .store import Store

log = logging.getLogger(__name__)

#: most pieces loaded with one read
MAX_BATCH = 16

#: one payload and the bytes of the runs it holds
Payload = tuple[Chunk, int]


def push_order(entry: Entry) -> Iterator[Item]:
    """Every piece of the entry's attempt whole, in push order (a copy's items)."""
    out = entry.out
    for i in range(out.pieces):
        yield i, out.firsts[i], out.lasts[i] + 1, True


class ReadView:
    """One read's (or copy's) stored data, pulled a batch of payloads at a time (see the module). `close` it
    when the consumer is done with it early; a view that finished or failed holds nothing."""

    def __init__(self, plan: Plan, pool: GlobalPool, loader: PieceLoader, *, whole: bool = False) -> None:
        self.plan = plan
        self.pool = pool
        self.loader = loader
        self.limit = pool.segment_size
        #: a whole piece larger than this goes out as it is; a copy (`whole`) sends every piece so
        self._whole_above = 0 if whole else self.limit // 2
        self._items: Callable[[Entry], Iterator[Item]] = push_order if whole else items
        #: pieces not served yet, as of the last payload given out; `_left` as of now
        self.backlog = self._left = plan.pieces
        #: called when a load or a frame's memory the view waited for is there (or failed): pull again
        self.listener: Callable[[], None] | None = None
        self.finished = self.closed = False
        self._entries = iter(plan.entries)
        self._entry: Entry | None = None
        self._pending: Iterator[Item] = iter(())
        self._ahead: deque[Item] = deque()
        self._skip = 0
        #: the frame being filled
        self._frames = FrameFiller(pool)
        #: pieces of the current entry loaded and still to be served, by index
        self._loaded: dict[int, Buffer] = {}
        #: a load, or a wait for a frame's segment, under way
        self._waiting: asyncio.Task[None] | None = None
        self._error: ShuffledError | None = None

    @property
    def empty(self) -> bool:
        """Nothing to serve (no attempt has data in the range)."""
        return not self.plan.entries

    @property
    def busy(self) -> bool:
        """A load or a frame's memory is on its way: the `listener` is called when it is there."""
        return self._waiting is not None

    def take(self, room: int, most: int = 0) -> tuple[list[Chunk], int]:
        """The payloads `room` allows (at most `most`, if given) as far as there are any now, with the bytes of
        their runs: a server's reader queues a batch and wakes its stream once, not once a buffer. A failure
        after some payloads comes at the next call, so those still go out first."""
        if self._error is not None:
            self.closed = True
            raise self._error
        got: list[Payload] = []
        if self._waiting is None and not self.finished and not self.closed:
            touch(self.plan.data)  # a long read keeps its shuffle in use: the spiller writes others first
            try:
                self._fill(got, room, most or -1)
            except Exception as exc:  # a failure, or a bug: either ends this read (never leaves it waiting)
                self.close()
                failure = _failure(exc)
                if not got:
                    if failure is exc:
                        raise
                    raise failure from exc
                if failure is not exc:
                    failure.__cause__ = exc
                self._error = failure
        return [chunk for chunk, _ in got], sum([data for _, data in got])

    def _fill(self, got: list[Payload], room: int, most: int) -> None:
        """Add payloads to `got` until `room` (or `most`, if positive) is reached, or the view finished or waits
        for something (one loop for a batch: this runs for every buffer a read serves)."""
        ahead, frames, shuffle = self._ahead, self._frames, self.plan.data
        while len(got) != most:
            if not ahead and not self._pull():
                if not self._next_entry():
                    self.finished = True
                    self._flush(got)
                    self._release()
                    return
                continue
            entry = self._entry
            assert entry is not None
            out = entry.out
            if len(got) >= room:
                return
            if shuffle is not None and shuffle.removed:
                raise PartitionNotFound(
                    f"shuffle {out.shuffle.app}/{out.shuffle.shuffle} was removed while being read (its data is gone)"
                )
            i, lo, hi, final = ahead[0]
            buf = out.buffer(i) or self._loaded.get(i)
            if buf is None:
                self._load(room - len(got))
                return
            skip = self._skip
            if skip and lo != entry.lo:
                raise InvalidRequest("resume point does not match this copy")
            whole = not skip and lo == out.firsts[i] and hi == out.lasts[i] + 1
            if whole and buf.length > self._whole_above:
                if frames.fill:
                    self._flush(got)  # the frame in progress goes first
                    continue
                buf.retain()
                self.backlog = self._left
                self._served(i, final)
                got.append((Chunk(buf, out.crcs[i]), data_bytes(buf.memory, buf.length)))
                continue
            cut, skip = _cut(buf, lo, hi, whole, skip)
            if cut is not None:
                parts, size, data = cut
                if frames.fill and frames.fill + size > self.limit:
                    self._flush(got)
                    continue
                if not frames.copy(parts, data):
                    self._wait(frames.memory())
                    return
            self._skip = skip
            self._served(i, final)

    def _pull(self) -> bool:
        nxt = next(self._pending, None)
        if nxt is None:
            return False
        self._ahead.append(nxt)
        return True

    def _next_entry(self) -> bool:
        """The current entry is served: on to the next one; False when there is none."""
        if self._entry is not None:
            if self._skip:
                raise InvalidRequest("resume point does not match this copy")
            assert not self._loaded, "every loaded piece's last item was served"
        entry = self._entry = next(self._entries, None)
        if entry is None:
            return False
        self._pending = self._items(entry)
        self._skip = entry.skip
        return True

    def _served(self, i: int, final: bool) -> None:
        self._ahead.popleft()
        if final:
            self._left -= 1
            loaded = self._loaded.pop(i, None)
            if loaded is not None:
                loaded.release()

    def _flush(self, got: list[Payload]) -> None:
        """The frame in progress (if any) as the next payload."""
        payload = self._frames.flush()
        if payload is not None:
            self.backlog = self._left
            got.append(payload)

    def _load(self, room: int) -> None:
        """Load the piece the next item needs and those after it that lie right behind it, as far as `room`
        goes (one at least)."""
        entry = self._entry
        assert entry is not None
        want = min(MAX_BATCH, max(1, room))
        while len(self._ahead) < 2 * want and self._pull():
            pass  # enough items to see the next `want` pieces
        batch = run(entry.out, (i for i, *_ in self._ahead if i not in self._loaded), want)
        self._wait(self._fetch(entry, batch))

    async def _fetch(self, entry: Entry, batch: list[int]) -> None:
        got = await self.loader.load(entry.out, batch, await take(self.pool, len(batch), self.pool.give))
        self._loaded.update(zip(batch, got, strict=False))

    def _wait(self, work: Coroutine[None, None, None]) -> None:
        """Run `work` (a load, or a wait for a frame's memory) in the background, then call the listener."""

        async def waiting() -> None:
            try:
                await work
            except Exception as exc:  # a failure, or a bug: either ends this read (never leaves it waiting)
                self._error = _failure(exc)
            self._waiting = None
            if self.closed or self._error is not None:
                self._release()  # what came after the view was closed, or what a failed view holds
            if not self.closed and self.listener is not None:
                self.listener()

        self._waiting = asyncio.create_task(waiting())

    def close(self) -> None:
        """Stop: what the view holds goes back (a load under way is cancelled and gives back its segments)."""
        if self.closed:
            return
        self.closed = True
        waiting, self._waiting = self._waiting, None
        if waiting is not None and waiting is not asyncio.current_task():
            waiting.cancel()
        self._release()

    def _release(self) -> None:
        loaded, self._loaded = self._loaded, {}
        for buf in loaded.values():
            buf.release()
        self._frames.release()
        self.loader.close()


def _failure(exc: Exception) -> ShuffledError:
    """What fails a read for `exc` (call it where it was caught): a bug is logged and fails it as INTERNAL."""
    if isinstance(exc, ShuffledError):
        return exc
    event(log, "serving a read failed", logging.ERROR, exc_info=True)
    return InternalError(f"serving a read failed: {exc.__class__.__name__}: {exc}")


class FrameFiller:
    """The frame a view fills (see the module): a segment of the read reserve, the slices of pieces copied
    into it so far, and the bytes of their runs."""

    __slots__ = ("_data", "_frame", "_spare", "fill", "pool")

    def __init__(self, pool: GlobalPool) -> None:
        self.pool = pool
        self._frame: Buffer | None = None
        self.fill = 0
        self._data = 0
        #: a frame's segment that came after a wait for one
        self._spare: Buffer | None = None

    def copy(self, parts: tuple[memoryview | bytes, ...], data: int) -> bool:
        """Copy `parts` (holding `data` bytes of runs) in; False when there is no segment to copy into yet:
        then wait for `memory()` and copy again."""
        frame = self._frame
        if frame is None:
            got = [self._spare] if self._spare is not None else self.pool.try_take(1, FRAME)
            self._spare = None
            if got is None:
                return False
            frame = self._frame = got[0]
            frame.set_recycler(self.pool.give)
        memory, at = frame.memory, self.fill
        for part in parts:
            n = len(part)
            memory[at : at + n] = part
            at += n
        self.fill = at
        self._data += data
        return True

    async def memory(self) -> None:
        """A segment of the read reserve, for the next `copy` (reads wait for one in their own line)."""
        (self._spare,) = await self.pool.take(1, FRAME)

    def flush(self) -> Payload | None:
        """The frame as a payload (None if there is none); the next copy starts a new one."""
        frame, fill = self._frame, self.fill
        if frame is None or not fill:
            return None
        data, self._frame, self.fill, self._data = self._data, None, 0, 0
        frame.length = fill
        return Chunk(frame, checksum(frame.data())), data

    def release(self) -> None:
        for held in (self._frame, self._spare):
            if held is not None:
                held.release()
        self._frame = self._spare = None
        self.fill = self._data = 0


#: what an item copies into a frame: its parts, their size, and the bytes of their runs
Cut = tuple[tuple[memoryview | bytes, ...], int, int]


def _cut(piece: Buffer, lo: int, hi: int, whole: bool, skip: int) -> tuple[Cut | None, int]:
    """What of a piece an item copies into a frame (None: nothing), and what is left of `skip` after it."""
    group = piece.data()
    if whole:
        return ((group,), piece.length, data_bytes(group)), skip
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
        return None, skip
    return (found.parts, len(found), len(found.data)), skip


def read_view(
    store: Store,
    pool: GlobalPool,
    disk: Disk | None,
    objects: ObjectStore | None,
    app: str,
    shuffle: int,
    start: int,
    end: int,
    attempts: list[int],
    resume: Resume | None,
    digest: bytes,
) -> ReadView:
    """A read's view: its plan (plan.py, where its token is checked) served through a loader of its own."""
    plan = make_plan(store, app, shuffle, start, end, attempts, resume, digest=digest)
    return ReadView(plan, pool, PieceLoader(disk, objects, store.at_rest))


def copy_view(
    store: Store,
    pool: GlobalPool,
    disk: Disk | None,
    objects: ObjectStore | None,
    app: str,
    shuffle: int,
    attempt: int,
    digest: bytes,
) -> ReadView:
    """A copy's view of one committed attempt: its pieces whole, in push order, checked as any read is."""
    found = lookup(store, app, shuffle, 0, 0, [attempt], digest=digest)
    if found is None:
        raise PartitionNotFound(f"shuffle {app}/{shuffle} is not held by this daemon")
    data, (out,) = found
    loader = PieceLoader(disk, objects, store.at_rest)
    return ReadView(Plan(data, [Entry(out, 0, data.partitions)]), pool, loader, whole=True)
