"""Durable uploads (`durability = object-store`, tier.py): committed attempts that asked for it are queued
per shuffle, and a shuffle's queue is uploaded once its pieces not yet in an object fill a part, or
`object-store-durable-delay` after its last commit, `UPLOADS_IN_FLIGHT` objects at once. An object carries
the commit records of the attempts whose last pieces it holds, and only once it is complete are those
attempts durable. A failed upload changes nothing and is tried again after a back-off that doubles up to
`RETRY_MAX`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from ...config import DaemonConfig
from ...logs import event
from ...protocol.errors import CorruptData, StorageError
from .object_writer import ObjectWriter, Pieces
from .shuffles import FILE, MapOutput, ShuffleData

log = logging.getLogger(__name__)

#: durable uploads at once (objects of different attempts)
UPLOADS_IN_FLIGHT = 4
#: first and longest wait before a failed durable upload is tried again (seconds; doubles in between)
RETRY_FIRST, RETRY_MAX = 1.0, 30.0


@dataclass(slots=True, eq=False)
class _Queue:
    """A shuffle's committed attempts waiting for their durable upload."""

    attempts: list[MapOutput] = field(default_factory=list)
    #: loop time from which it is uploaded (a part's worth is there, or the delay passed)
    due: float = 0.0
    #: loop time at which its map stage counts as ended (`object-store-durable-delay` after the last commit):
    #: from then on what is left goes up however small, before then only a part's worth at a time
    idle_at: float = 0.0
    #: seconds to wait after the next failure
    backoff: float = RETRY_FIRST

    def pending_bytes(self) -> int:
        return sum(o.unplaced_bytes() for o in self.attempts if not o.dead)

    def ready_bytes(self, writer: ObjectWriter) -> int:
        """What the next upload of the queue could take now: not the bytes of uploads or spills under way,
        which counted as a part's worth would send an attempt committed meanwhile off alone, a small object."""
        return sum(
            o.unplaced_bytes() for o in self.attempts if not o.dead and o not in writer.claimed and o not in writer.busy
        )

    def worth_an_object(self, writer: ObjectWriter, now: float) -> bool:
        """Whether to start an upload of the queue now: a part's worth is ready, or its stage has ended. Not
        whatever is left after the uploads started: objects under a part cost PUTs (at most 64 per GiB at
        16 MiB parts, configuration.md)."""
        return now >= self.idle_at or self.ready_bytes(writer) >= writer.part

    def take(self, writer: ObjectWriter) -> tuple[list[Pieces], list[MapOutput]]:
        """The pieces not yet in an object of the queued attempts, in order, until an object is full (an
        attempt may be cut: its commit record then goes in a later object), and the attempts all of whose
        such pieces are taken."""
        pieces: list[Pieces] = []
        commits: list[MapOutput] = []
        size = 0
        for out in self.attempts:
            if out in writer.busy or out in writer.claimed or out.durable:
                continue
            left = [i for i in range(out.placed) if out.places[i] == FILE] + list(range(out.placed, out.pieces))
            took: list[int] = []
            for i in left:
                if size + out.sizes[i] > writer.most and (pieces or took):
                    break
                took.append(i)
                size += out.sizes[i]
            if took:
                pieces.append((out, took))
            if len(took) == len(left):
                commits.append(out)
            if len(took) < len(left) or size >= writer.part:
                break
        return pieces, commits


class DurableUploads:
    """The tier's durable uploads (see the module). `start` once the daemon listens, `close` at stop."""

    def __init__(self, writer: ObjectWriter, config: DaemonConfig) -> None:
        self.writer = writer
        self.config = config
        self.stats = writer.stats
        self._queues: dict[ShuffleData, _Queue] = {}
        self._wake = asyncio.Event()
        self._uploader: asyncio.Task[None] | None = None
        self._uploads: set[asyncio.Task[bool]] = set()

    def start(self) -> None:
        self._uploader = asyncio.create_task(self._upload_loop())

    async def close(self) -> None:
        for task in (self._uploader, *self._uploads):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def complete_commits(self, data: ShuffleData, placing: dict[MapOutput, int]) -> list[MapOutput]:
        """Queued attempts of the shuffle whose pieces not yet in an object are exactly those a write places
        (`placing`: attempt -> the index its pieces up to are placed): their commit records may go in it."""
        queue = self._queues.get(data)
        if queue is None:
            return []
        done = []
        for out in queue.attempts:
            if out.durable or out.dead or out in self.writer.claimed:
                continue
            if placing.get(out, out.placed) == out.pieces and all(p != FILE for p in out.places):
                done.append(out)
        return done

    def made_durable(self, data: ShuffleData, outs: list[MapOutput]) -> None:
        """These attempts' commit records are in a complete object."""
        queue = self._queues.get(data)
        for out in outs:
            self.writer.claimed.discard(out)
            if out.dead or out.durable:
                continue
            out.durable = True
            self.stats.durable_attempts += 1
            if queue is not None and out in queue.attempts:
                queue.attempts.remove(out)
                self.stats.pending_attempts -= 1
        if queue is not None and not queue.attempts:
            del self._queues[data]
        self._count_pending()

    def committed(self, out: MapOutput) -> None:
        """An attempt was committed: queue its durable upload if it wants one."""
        if not out.wants_durable or out.durable:
            return
        data = out.shuffle
        queue = self._queues.setdefault(data, _Queue())
        queue.attempts.append(out)
        self.stats.pending_attempts += 1
        now = asyncio.get_running_loop().time()
        queue.idle_at = now + self.config.object_store_durable_delay
        queue.due = now if queue.ready_bytes(self.writer) >= self.writer.part else max(queue.due, queue.idle_at)
        self._count_pending()
        self._wake.set()

    def _count_pending(self) -> None:
        self.stats.pending_bytes = sum(q.pending_bytes() for q in self._queues.values())

    async def _upload_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._wake.clear()
                now = loop.time()
                for data, queue in [(d, q) for d, q in self._queues.items() if q.due <= now]:
                    while (
                        len(self._uploads) < UPLOADS_IN_FLIGHT
                        and queue.worth_an_object(self.writer, now)
                        and self.start_upload(data) is not None
                    ):
                        pass
                    if queue.due <= now and not queue.worth_an_object(self.writer, now):
                        queue.due = queue.idle_at  # the rest waits for more commits or the stage's end
                later = [q.due for q in self._queues.values() if q.due > now]
                wait = None if len(self._uploads) >= UPLOADS_IN_FLIGHT or not later else min(later) - now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop durable uploads for good
                event(log, "durable upload failed", logging.ERROR, exc_info=True)
                await asyncio.sleep(RETRY_MAX)

    def start_upload(self, data: ShuffleData) -> asyncio.Task[bool] | None:
        """Start uploading one object of the shuffle's queued attempts (see the module), unless there is
        nothing to take now (all claimed by uploads under way, or being spilled)."""
        queue = self._queues.get(data)
        if queue is None:
            return None
        queue.attempts = [o for o in queue.attempts if not o.dead]
        if data.removed or not queue.attempts:
            self.forget(data)
            return None
        pieces, commits = queue.take(self.writer)
        if not pieces and not commits:
            if not any(o in self.writer.claimed for o in queue.attempts):  # spills under way: look again soon
                queue.due = asyncio.get_running_loop().time() + RETRY_FIRST
            return None
        outs = {out for out, _ in pieces} | set(commits)
        for out, _ in pieces:
            out.taken = out.pieces  # the spiller leaves them (pieces in memory an object holds it may free)
        self.writer.claimed.update(outs)
        task = asyncio.create_task(self._upload(data, queue, pieces, commits, outs))
        self._uploads.add(task)
        task.add_done_callback(self._upload_ended)
        return task

    def _upload_ended(self, task: asyncio.Task[bool]) -> None:
        self._uploads.discard(task)
        self._wake.set()

    async def _upload(
        self, data: ShuffleData, queue: _Queue, pieces: list[Pieces], commits: list[MapOutput], outs: set[MapOutput]
    ) -> bool:
        """Write one object of these pieces and commit records; whether it worked (a failure is logged, and
        the shuffle's queue tried again after its back-off)."""
        try:
            written = await self.writer.write(data, pieces, commits, "durable")
        except (StorageError, CorruptData) as exc:
            self.stats.write_errors += 1
            self.writer.claimed.difference_update(outs)
            for out, _ in pieces:
                out.taken = out.placed
            queue.due = asyncio.get_running_loop().time() + queue.backoff
            event(
                log,
                "durable upload failed",
                logging.WARNING,
                app=data.app,
                shuffle=data.shuffle,
                attempts=len(queue.attempts),
                retry_s=queue.backoff,
                reason=exc.message,
            )
            queue.backoff = min(RETRY_MAX, queue.backoff * 2)
            return False
        except BaseException:
            self.writer.claimed.difference_update(outs)
            for out, _ in pieces:
                out.taken = out.placed
            raise
        queue.backoff = RETRY_FIRST
        self.writer.claimed.difference_update(outs)
        if written is not None:
            self.writer.placed(pieces, written)
        for out, _ in pieces:
            out.taken = out.placed
        self.made_durable(data, commits if written is not None else [])
        if data in self._queues and queue.ready_bytes(self.writer) >= self.writer.part:
            queue.due = asyncio.get_running_loop().time()
        return True

    def forget(self, data: ShuffleData) -> None:
        """The shuffle was dropped: its queued attempts are not uploaded."""
        queue = self._queues.pop(data, None)
        if queue is not None:
            self.stats.pending_attempts -= len(queue.attempts)
            self._count_pending()

    async def persist(self, shuffles: list[ShuffleData]) -> int:
        """Make every committed attempt of these shuffles durable now (a flush or a stop without a data dir:
        what a restart can serve again is what the objects prove), `UPLOADS_IN_FLIGHT` objects at once; the
        attempts durable. Raises StorageError when an upload fails."""
        for data in shuffles:
            for out in data.committed.values():
                if not out.durable and not out.wants_durable:
                    out.wants_durable = True
                    self.committed(out)
        running: set[asyncio.Task[bool]] = set()
        for data in shuffles:
            while data in self._queues and not data.removed:
                while len(running) < UPLOADS_IN_FLIGHT and (task := self.start_upload(data)) is not None:
                    running.add(task)
                if not running:  # nothing to take: spill writes hold the pieces, or uploads of the loop
                    await asyncio.sleep(0.05)  # a wait for writes this call did not start, not for an event
                    continue
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                if not all(t.result() for t in done):
                    await asyncio.gather(*running, return_exceptions=True)
                    raise StorageError(f"uploading {data.app}/{data.shuffle} to the object store failed")
        await asyncio.gather(*running)
        return sum(o.durable for d in shuffles for o in d.committed.values())
