"""The spill writes under way (spill.py): pieces taken from memory, written by a spill target (the data
file, or the object store), then placed, their memory freed. Each write holds its own references on the
segments it writes, so an abort meanwhile drops only the store's; an attempt has at most one write under
way, so its pieces reach the file in push order. A failed write leaves the pieces in memory, fails the
open map outputs that had data in it, and makes pressure spilling back off for `RETRY_AFTER` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ...buffers import Buffer
from ...logs import event
from ...protocol.errors import ShuffledError, StorageError
from .shuffles import MapOutput, MapState, ShuffleData
from .store import Store

log = logging.getLogger(__name__)

#: seconds pressure spilling pauses after a failed write
RETRY_AFTER = 1.0

#: the pieces [start, end) of one attempt in a spill write
Taken = tuple[MapOutput, int, int]


@dataclass(slots=True)
class Placed:
    """Where a spill write put its pieces, back to back: `place` (FILE, or an object), from `offset`; the
    CRC32C of each piece as written when the target computed them (the data file's writer does); `then`
    runs once the store knows (an object's durable commits)."""

    place: int
    offset: int
    crcs: list[int] | None = None
    then: Callable[[], None] | None = None
    #: with encryption at rest, each piece's seal, as the pieces' own from now on
    seals: list[bytes] | None = None


class SpillTarget(Protocol):
    """Where spill writes go: the data file, or the object store."""

    #: what errors name: the data dir, or the object store's URL; and where a write goes, as they say it
    name: str
    where: str
    #: most segments one pressure write takes, and writes at once
    batch: int
    in_flight: int

    def submit(self, data: ShuffleData, taken: list[Taken], held: list[Buffer]) -> asyncio.Future[Placed]:
        """Start writing the taken pieces (`held`, in order); raises if the target is shut down (at stop)."""
        ...

    def wrote(self, data: ShuffleData, written: int) -> None:
        """A write of `written` bytes of the shuffle succeeded."""
        ...

    def failed(self) -> None:
        """A write failed."""
        ...


@dataclass(slots=True, eq=False)
class _Write:
    """A spill write under way: whose, how many segments it will free, and its outcome (bytes written)."""

    data: ShuffleData
    segments: int
    done: asyncio.Future[int]


class SpillWrites:
    """The writes under way to one spill target (see the module)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        #: spill writes under way, by the attempts they write (one write per attempt at most)
        self.by_attempt: dict[MapOutput, _Write] = {}
        self.under_way: set[_Write] = set()
        #: segments the writes under way free when done
        self.leaving = 0
        #: set when a write ends (the spilling task looks again)
        self.ended = asyncio.Event()
        self.failed_at = -RETRY_AFTER
        #: why the last spill failed, until one succeeds (the disk is full or broken, the object store fails)
        self.error: str | None = None

    def backing_off(self) -> bool:
        """A write failed less than `RETRY_AFTER` seconds ago: pressure spilling waits."""
        # time.monotonic, not the loop's clock: this runs for every pushed buffer, and finding the running
        # loop costs a getpid() system call each time on Python 3.11
        return time.monotonic() - self.failed_at < RETRY_AFTER

    def leaving_of(self, app: str) -> int:
        """Segments of `app` the writes under way free when done."""
        return sum(w.segments for w in self.under_way if w.data.app == app)

    def of(self, data: ShuffleData) -> list[asyncio.Future[int]]:
        """The shuffle's writes under way."""
        return [w.done for w in self.under_way if w.data is data]

    def start(
        self, target: SpillTarget, data: ShuffleData, outs: list[MapOutput], limit: int | None
    ) -> asyncio.Future[int] | None:
        """Take the oldest in-memory pieces of these attempts in turn (at most `limit` in all) and queue
        their write on `target` now (so writes and a later deletion of the shuffle reach the writer
        thread in this order); None if there are none."""
        if data.removed:
            return None
        taken: list[Taken] = []
        count = 0
        for out in outs:
            if limit is not None and count >= limit:
                break
            if out in self.by_attempt:  # one write per attempt: its pieces reach the file in push order
                continue
            start, end = self.store.placement.take_for_spill(out, None if limit is None else limit - count)
            if end > start:
                taken.append((out, start, end))
                count += end - start
        if not taken:
            return None
        # The write's own references, taken now: an abort from here on drops only the store's.
        held = [b for out, start, end in taken for b in out.memory[start - out.spilled : end - out.spilled]]
        for buf in held:
            buf.retain()
        try:
            placed = target.submit(data, taken, held)
        except BaseException:  # the writer is shut down (at stop): the pieces stay in memory
            for buf in held:
                buf.release()
            for out, start, _ in taken:
                self.store.placement.unspilled(out, start)
            raise
        done = asyncio.ensure_future(self._finish(target, data, taken, held, placed))
        done.add_done_callback(_retrieve)  # a pressure write's failure is logged; nobody awaits it
        write = _Write(data, len(held), done)
        for out, _, _ in taken:
            self.by_attempt[out] = write
        self.under_way.add(write)
        self.leaving += len(held)
        return done

    async def _finish(
        self,
        target: SpillTarget,
        data: ShuffleData,
        taken: list[Taken],
        held: list[Buffer],
        placing: asyncio.Future[Placed],
    ) -> int:
        try:
            try:
                placed = await placing
            except (OSError, ShuffledError) as exc:
                raise self._write_failed(target, data, taken, exc) from exc
            finally:
                for buf in held:
                    buf.release()
            crcs = iter(placed.crcs) if placed.crcs is not None else None
            seals = iter(placed.seals) if placed.seals is not None else None
            offset = placed.offset
            for out, start, end in taken:
                if crcs is not None:
                    self._check_written(data, out, [i for i in range(start, end) if next(crcs) != out.crcs[i]])
                if seals is not None:
                    for i in range(start, end):
                        out.seal(i, next(seals))
                self.store.placement.spilled(out, start, end, offset, placed.place)
                offset += sum(out.sizes[start:end])
            written = offset - placed.offset
            self.error = None
            target.wrote(data, written)
            if placed.then is not None:
                placed.then()
            return written
        finally:
            for out, _, _ in taken:
                self.under_way.discard(self.by_attempt.pop(out))
            self.leaving -= len(held)
            self.ended.set()

    @staticmethod
    def _check_written(data: ShuffleData, out: MapOutput, changed: list[int]) -> None:
        if changed:  # the journal keeps the writer's CRC32C: reading these back fails with CORRUPT_DATA
            event(
                log,
                "memory corruption",
                logging.ERROR,
                app=data.app,
                shuffle=data.shuffle,
                attempt=out.attempt,
                pieces=len(changed),
            )

    def _write_failed(
        self, target: SpillTarget, data: ShuffleData, taken: list[Taken], exc: OSError | ShuffledError
    ) -> StorageError:
        """Leave the pieces in memory and fail their open map outputs; returns the error they got."""
        target.failed()
        self.failed_at = time.monotonic()
        why = exc.message if isinstance(exc, ShuffledError) else exc.strerror or str(exc)
        self.error = why
        event(log, "spill failed", logging.WARNING, app=data.app, shuffle=data.shuffle, reason=why)
        reason = StorageError(f"writing map output {target.where} failed on this daemon: {why}")
        for out, start, _ in taken:
            self.store.placement.unspilled(out, start)
        for out, _, _ in taken:
            if out.state is MapState.OPEN and out.on_failure is not None:
                out.on_failure(reason)
        return reason


def _retrieve(done: asyncio.Future[int]) -> None:
    if not done.cancelled():
        done.exception()
