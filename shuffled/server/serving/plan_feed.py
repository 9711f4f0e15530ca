"""Serving a plan (storage/plan.py): its items turned into DATA payloads as the reader's credit asks for them.

A whole piece in memory goes out as it is: the payload is the pushed group, its CRC32C
the writer's, nothing copied or parsed. Everything else (a piece cut to the range, small
whole pieces, the rest of a resumed pair) is copied into a frame of its own, a segment of
the read reserve, as many groups as fit; its CRC32C is computed over what it holds. A
frame that took slices of many pieces holds one segment, not theirs: the pieces it
copied from, loaded from disk or not, are free to go. Each payload goes to the sink with
the bytes of its runs (what the traffic counters count): a whole piece's from the count in
its header, a built frame's summed as its parts are copied, never per run.

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
from collections import deque
from collections.abc import Callable, Iterator

from ...buffers import Buffer, Chunk
from ...logs import event
from ...protocol.errors import InternalError, InvalidRequest, PartitionNotFound, ShuffledError
from ...protocol.integrity import checksum
from ...protocol.packed import data_bytes, directory, slice_group
from ..storage.loader import PieceLoader, run, take
from ..storage.plan import Entry, Item, Plan, items
from ..storage.shuffles import MapOutput
from .environment import ShuffleEnvironment

log = logging.getLogger(__name__)

#: frames made beyond the reader's credit (so credit that arrives finds data ready), and how much room a
#: waiting feed needs before it is woken (so it runs once per batch of frames, not per frame)
LOOKAHEAD = 8
#: most spilled pieces loaded with one preadv
MAX_BATCH = 16


def _release(buffers: list[Buffer]) -> None:
    for buf in buffers:
        buf.release()


class PlanFeed:
    """One read's plan turned into payloads handed to `sink` (with the bytes of their runs), while `budget()`
    (frames wanted now) is positive; `kick()` when it may have grown. `start` runs it; `close` stops it and
    frees what it holds."""

    __slots__ = (
        "_budget",
        "_data",
        "_fill",
        "_frame",
        "_loaded",
        "_room",
        "_waiting",
        "env",
        "left",
        "limit",
        "loader",
        "plan",
        "sink",
        "task",
    )

    def __init__(
        self,
        env: ShuffleEnvironment,
        plan: Plan,
        sink: Callable[[Chunk, int], None],
        budget: Callable[[], int],
    ) -> None:
        self.env = env
        self.plan = plan
        self.sink = sink
        self._budget = budget
        self.limit = env.pool.segment_size
        #: pieces not served yet (a backlog estimate for the reader's credit)
        self.left = plan.pieces
        self.loader = PieceLoader(env.disk, env.objects)
        #: the frame being filled (a read-reserve segment), its fill and the bytes of runs in it
        self._frame: Buffer | None = None
        self._fill = 0
        self._data = 0
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
                self.sink(Chunk(buf, out.crcs[i]), data_bytes(buf.data()))
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
            parts, size, data = (group,), piece.length, data_bytes(group)
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
            parts, size, data = found.parts, len(found), len(found.data)
        if self._fill + size > self.limit:
            self._flush()
        pool = self.env.pool
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
        self._data += data
        if held is not None:
            held.release()
        return skip

    def _flush(self) -> None:
        frame, fill = self._frame, self._fill
        if frame is None or not fill:
            return
        data, self._frame, self._fill, self._data = self._data, None, 0, 0
        frame.length = fill
        self.sink(Chunk(frame, checksum(frame.data())), data)

    async def _load(self, out: MapOutput, ahead: deque[Item], pending: Iterator[Item]) -> None:
        """Load the piece the next item needs and those after it that lie right behind it in the file,
        as far as the sink wants frames (one at least)."""
        want = min(MAX_BATCH, max(1, self._budget()))
        while len(ahead) < 2 * want and _pull(pending, ahead):
            pass  # enough items to see the next `want` pieces
        batch = run(out, (i for i, *_ in ahead if i not in self._loaded), want)
        got = await self.loader.load(out, batch, await take(self.env.pool, len(batch), self.env.pool.give))
        self._loaded.update(zip(batch, got, strict=False))


def _pull(pending: Iterator[Item], ahead: deque[Item]) -> bool:
    nxt = next(pending, None)
    if nxt is None:
        return False
    ahead.append(nxt)
    return True
