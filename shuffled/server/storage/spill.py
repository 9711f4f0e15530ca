"""Moving stored data from the pool to disk: under memory pressure, over a quota, on request, at stop.

Pressure uses marks on the share of pool segments in use. Passing the start mark
(half way from the low watermark to the high one) starts spilling the shuffles
holding the most memory in the background, pushes carry on; spilling goes on until
what will be left once the writes under way are done is below the low watermark.
Passing the high watermark also holds back new push credit (sessions wait on
`admitted()`) until that projection is below the low one, or nothing more can be
spilled. The wait is the same back-pressure a full pool applies, just earlier, so
the disk has time to catch up.

One spill write takes at most `batch` in-memory pieces of one shuffle: the oldest of
the attempt holding the most memory, then of its other attempts in turn (so an
attempt's pieces lie mostly together in the file and a read of it goes forward), and
writes them with one `writev` on the disk's writer thread into the shuffle's one
data file, then the journal record describing them; only when both are done are the
segments released. The bytes written are the bytes stored, however many partitions
they hold. Up to `IN_FLIGHT` writes wait on the writer thread at once, so it starts
the next as soon as one ends instead of waiting for the event loop to pick it; they
are submitted in the order they were taken, which is then their order in the file.
An attempt has at most one write under way: if it fails, its pieces are still the
first in memory and no later piece of it is in the file before them. A flush waits
for its shuffle's writes under way before writing the rest.

A failed write (ENOSPC, EFBIG, EIO) leaves the file as it was: the pieces stay in
memory; map outputs that were still open and had data in the failed spill are
aborted with STORAGE_ERROR, so their writers fail with the reason (Spark retries
the task) and their memory comes back. Committed data keeps being served from
memory. Pressure spilling then queues no more writes and backs off for
`RETRY_AFTER` seconds. Until a spill succeeds again, a push that needs memory
which only a spill could free fails at once with STORAGE_ERROR
(`push_memory_error`) instead of waiting for credit that will not come; so does
every such push on a daemon without a disk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...logs import event
from ...protocol.errors import StorageError
from .disk import JOURNAL, PIECE_ROW, Appended, Disk, SpillFile, encode_record
from .store import Garbage, MapOutput, MapState, ShuffleData, Store

if TYPE_CHECKING:
    from ...buffers import Buffer, GlobalPool

log = logging.getLogger(__name__)

#: seconds pressure spilling pauses after a failed write
RETRY_AFTER = 1.0
#: spill writes queued on the writer thread at once
IN_FLIGHT = 4
#: segments one pressure spill write takes at least and at most (1 and 4 MiB of 32 KiB segments): below,
#: the per-write costs (files opened, journal record, a loop turn) show in the CPU per GiB
MIN_BATCH, MAX_BATCH = 32, 128


#: the pieces [start, end) of one attempt in a spill write
Taken = tuple[MapOutput, int, int]


@dataclass(slots=True, eq=False)
class _Write:
    """A spill write under way: whose, how many segments it will free, and its outcome (bytes written)."""

    data: ShuffleData
    segments: int
    done: asyncio.Future[int]


class Spiller:
    def __init__(self, store: Store, pool: GlobalPool, disk: Disk | None, high: float, low: float) -> None:
        self.store = store
        self.pool = pool
        self.disk = disk
        # Pushes never take the read reserve, so the high mark must lie below it to be reachable
        # (small pools get a proportionally larger reserve than `read_reserve` says).
        self.high = min(int(pool.total * high), pool.total - pool.reserve - 1)
        self.low = min(int(pool.total * low), self.high - 1)
        self.start = (self.low + self.high) // 2
        self.low_share = low
        #: segments per pressure write: IN_FLIGHT of them take usage from the high watermark to the low one
        self.batch = max(MIN_BATCH, min(MAX_BATCH, (self.high - self.low) // IN_FLIGHT))
        #: below this many stored segments, memory is held by push windows and reads: spilling cannot help
        self.worth_spilling = max(1, pool.total // 16)
        #: pushes get no new credit while set (above the high watermark, until usage without the writes under
        #: way is below the low one)
        self.paused = False
        self._resume = asyncio.Event()
        self._resume.set()
        self._task: asyncio.Task[None] | None = None
        #: spill writes under way, by the attempts they write (one write per attempt at most)
        self._writing: dict[MapOutput, _Write] = {}
        self._writes: set[_Write] = set()
        #: segments the writes under way free when done
        self.leaving = 0
        #: set when a write ends (the spilling task looks again)
        self._ended = asyncio.Event()
        #: applications over their memory quota: their pushes wait on the event until spilled below it
        self._apps: dict[str, asyncio.Event] = {}
        self._failed_at = -RETRY_AFTER
        #: why the last spill failed, until one succeeds (the disk is full or broken meanwhile)
        self.disk_error: OSError | None = None

    def push_memory_error(self, need: int) -> StorageError | None:
        """Why a push waiting for `need` more segments would wait for good (None: memory will come).

        Memory held by push windows and reads comes back by itself; memory held by stored data only when it
        is spilled or its shuffle removed, which Spark may do much later (when its driver collects the
        shuffle). So a push waits only while stored data leaves room for it or can move to disk.
        """
        if self.disk is not None and self.disk_error is None:
            return None
        usable = self.pool.total - self.pool.reserve
        stored = self.store.memory_segments
        if usable - stored >= need:
            return None
        held = f"stored shuffle data fills {stored} of the {usable} segments pushes may use"
        if self.disk is None:
            return StorageError(
                f"no memory for this push: {held} and this daemon has no data directory to spill to "
                "(data-dir none); memory comes back when Spark removes shuffles"
            )
        why = self.disk_error.strerror if self.disk_error is not None else None
        return StorageError(f"no memory for this push: {held} and spilling to {self.disk.root} fails: {why}")

    def holding(self, app: str) -> bool:
        """True while pushes of `app` get no new memory."""
        return self.paused or app in self._apps

    async def admitted(self, app: str) -> None:
        """Returns when pushes of `app` may take memory again."""
        await self._resume.wait()
        held = self._apps.get(app)
        if held is not None:
            await held.wait()

    @property
    def pressure(self) -> bool:
        """Background spilling (from the start mark until usage without the writes under way is below low);
        the pool then gives no floating buffers, and spare ones go back, so they cannot take the room made."""
        return self.pool.spilling

    @pressure.setter
    def pressure(self, on: bool) -> None:
        self.pool.spilling = on

    def _backing_off(self) -> bool:
        # time.monotonic, not the loop's clock: this runs for every pushed buffer, and finding the running
        # loop costs a getpid() system call each time on Python 3.11
        return time.monotonic() - self._failed_at < RETRY_AFTER

    def check(self, app: str | None = None) -> None:
        """After data was added: start spilling if the pool or the application's quota asks for it."""
        if self.disk is None or self._backing_off():
            return
        changed = False
        if app is not None and app not in self._apps and self.store.over_memory_quota(app):
            self._apps[app] = asyncio.Event()
            changed = True
        used = self.pool.used
        if (
            not self.pressure
            and used - self.leaving >= self.start
            and self.store.memory_segments >= self.worth_spilling
        ):
            self.pressure = changed = True
        if used >= self.high and self.pressure and not self.paused:
            self.paused = changed = True
            self._resume.clear()
        if self._task is None:
            if self.pressure or self._apps:
                self._task = asyncio.create_task(self._run())
        elif changed:  # it may be waiting for a write to end: let it look at the new state now
            self._ended.set()

    async def _run(self) -> None:
        try:
            while True:
                while len(self._writes) < IN_FLIGHT and self._spill_next():
                    pass
                self._settle()
                if not self._writes:
                    return
                self._ended.clear()
                await self._ended.wait()
        except Exception:
            event(log, "spilling failed", logging.ERROR, exc_info=True)
        finally:
            self._task = None
            for held in self._apps.values():
                held.set()
            self._apps.clear()
            self.pressure = self.paused = False
            self._resume.set()

    def _spill_next(self) -> bool:
        """Queue one more write if a quota or the pool asks for it; False if nothing is to be queued now."""
        if self._backing_off():
            return False
        target = self._quota_target
        for app in self._apps:
            usage = self.store.usage.get(app)
            if usage is not None and usage.segments - self._leaving(app) > target and self._spill_largest(app):
                return True
        return self.pressure and self.pool.used - self.leaving > self.low and self._spill_largest(None)

    def _settle(self) -> None:
        """After queueing: let pushes go whose memory is on its way out (usage without the writes under way
        is below the mark), or for whom nothing more can be written."""
        stuck = len(self._writes) < IN_FLIGHT  # the queueing stopped for want of pieces, not of room
        target = self._quota_target
        for app in list(self._apps):
            usage = self.store.usage.get(app)
            leaving = self._leaving(app)
            if usage is None or usage.segments - leaving <= target or (stuck and not leaving):
                self._apps.pop(app).set()
        done = self.pool.used - self.leaving <= self.low or (stuck and not self._writes)
        if done and self.paused:
            self.paused = False
            self._resume.set()
        if done:
            self.pressure = False

    @property
    def _quota_target(self) -> int:
        """What an application over its memory quota is spilled down to (segments)."""
        return int(self.store.memory_quota * self.low_share)

    def _leaving(self, app: str) -> int:
        return sum(w.segments for w in self._writes if w.data.app == app)

    def _spill_largest(self, app: str | None) -> bool:
        """Start writing the shuffle holding the most memory not being written (of `app`, or of anyone);
        False if none."""
        found = self.store.largest_in_memory(app, self._writing)
        return found is not None and self._start(*found, self.batch) is not None

    async def flush(self, shuffles: list[ShuffleData]) -> int:
        """Write every in-memory piece of these shuffles to disk; returns the bytes this call wrote (a
        background write of the same shuffle that it waited for counts as that write's, not here).

        Raises StorageError at the first write that fails (the pieces not written stay in memory).
        """
        total = 0
        for data in shuffles:
            total += await self.spill(data)
        return total

    async def spill(self, data: ShuffleData) -> int:
        """Spill all of one shuffle's in-memory pieces, after its writes under way. Returns the bytes this
        call wrote; raises StorageError if its write failed (the pieces are then in memory again and their
        open map outputs failed).

        Once the pieces are taken, the write and its bookkeeping run to the end even if
        the caller is cancelled (a flush cut short at stop): otherwise the pieces would
        belong neither to memory nor to the file.
        """
        while under_way := [w.done for w in self._writes if w.data is data]:
            await asyncio.wait(under_way)  # their failure is their own; the pieces are back in memory then
        outs = [o for o in (*data.committed.values(), *data.open.values()) if o.taken < o.pieces]
        write = self._start(data, outs, None)
        if write is None:
            if data.committed and not data.removed:  # empty attempts too must survive a restart
                self.open_journal(data)
            return 0
        return await asyncio.shield(write)

    def _start(self, data: ShuffleData, outs: list[MapOutput], limit: int | None) -> asyncio.Future[int] | None:
        """Take the oldest in-memory pieces of these attempts in turn (at most `limit` in all) and queue
        their write on the writer thread now (so writes and a later deletion of the shuffle reach the
        thread in this order); None if there are none."""
        if data.removed:
            return None
        taken: list[Taken] = []
        count = 0
        for out in outs:
            if limit is not None and count >= limit:
                break
            if out in self._writing:  # one write per attempt: its pieces reach the file in push order
                continue
            start, end = self.store.take_for_spill(out, None if limit is None else limit - count)
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
            appended = self._submit(data, taken, held)
        except BaseException:  # the writer is shut down (at stop): the pieces stay in memory
            for buf in held:
                buf.release()
            for out, start, _ in taken:
                self.store.unspilled(out, start)
            raise
        done = asyncio.ensure_future(self._finish(data, taken, held, appended))
        done.add_done_callback(_retrieve)  # a pressure write's failure is logged; nobody awaits it
        write = _Write(data, len(held), done)
        for out, _, _ in taken:
            self._writing[out] = write
        self._writes.add(write)
        self.leaving += len(held)
        return done

    def _submit(self, data: ShuffleData, taken: list[Taken], held: list[Buffer]) -> asyncio.Future[Appended]:
        disk = self.disk
        assert disk is not None
        directory = self.open_journal(data)
        if data.file is None:
            data.file = SpillFile(disk.data_path(directory))
            disk.stats.files += 1
        # The journal keeps the CRC32C the writer sent (checked on push), not one of the bytes as written:
        # memory that went bad since is then caught when the piece is read back.
        described = [
            [
                out.attempt,
                out.serial,
                b"".join(
                    PIECE_ROW.pack(out.sizes[i], out.crcs[i], out.firsts[i], out.lasts[i]) for i in range(start, end)
                ),
            ]
            for out, start, end in taken
        ]

        def record(done: Appended) -> bytes:
            return encode_record({"k": "pieces", "o": done.offset, "a": described})

        return disk.append(data.file, [buf.data() for buf in held], f"{directory}/{JOURNAL}", record)

    async def _finish(
        self, data: ShuffleData, taken: list[Taken], held: list[Buffer], appended: asyncio.Future[Appended]
    ) -> int:
        disk = self.disk
        assert disk is not None and data.file is not None
        try:
            try:
                done = await appended
            except OSError as exc:
                raise self._write_failed(data, taken, exc) from exc
            finally:
                for buf in held:
                    buf.release()
            crcs = iter(done.crcs)
            offset = done.offset
            for out, start, end in taken:
                changed = [i for i in range(start, end) if next(crcs) != out.crcs[i]]
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
                self.store.spilled(out, start, end, offset)
                offset += sum(out.sizes[start:end])
            written = offset - done.offset
            self.disk_error = None
            self.store.wrote(data, written)
            data.file.size = offset
            disk.stats.spills += 1
            disk.stats.spilled_bytes += written
            if not data.removed:  # else `removed` already settled the shuffle's disk accounting
                disk.stats.used_bytes += written
            return written
        finally:
            for out, _, _ in taken:
                self._writes.discard(self._writing.pop(out))
            self.leaving -= len(held)
            self._ended.set()

    def open_journal(self, data: ShuffleData) -> str:
        """The shuffle's directory; the first call starts its journal with a header and the commits so far."""
        disk = self.disk
        assert disk is not None
        if data.directory is None:
            directory = disk.shuffle_dir(data.app, data.shuffle)
            head: dict[str, object] = {
                "k": "shuffle",
                "app": data.app,
                "shuffle": data.shuffle,
                "partitions": data.partitions,
            }
            key = self.store.app_keys.get(data.app)
            if key is not None:  # the application's binding, so a restart (and its drain) keeps it
                head["key"] = key
            records = [encode_record(head)]
            records += [self._commit_record(data, a) for a in data.committed]
            self._journal(directory, b"".join(records))  # raises if the writer is shut down (at stop)
            data.directory = directory  # only now: later records must follow a queued header
        return data.directory

    def committed(self, data: ShuffleData, attempt: int) -> None:
        """Journal a commit once the shuffle has files (before that, it lives in memory only)."""
        if data.directory is not None and self.disk is not None:
            self._journal(data.directory, self._commit_record(data, attempt))

    def _commit_record(self, data: ShuffleData, attempt: int) -> bytes:
        """The attempt's commit: what its pieces must add up to, and its replica marking (§12.4), so a
        restart knows what it holds for whom: `of` the primary of a replica, `copies` where a pushed
        attempt's replicas are, `r` copies wanted."""
        out = data.committed[attempt]
        record: dict[str, object] = {
            "k": "commit",
            "attempt": attempt,
            "serial": out.serial,
            "map": out.map_index,
            "bytes": out.bytes,
            "pieces": out.pieces,
            "size": out.size,
            "r": data.replicas.get(attempt, 1),
        }
        if attempt in data.replica_of:
            record["of"] = data.replica_of[attempt]
        if attempt in data.copies:
            record["copies"] = list(data.copies[attempt])
        return encode_record(record)

    def _journal(self, directory: str, record: bytes) -> None:
        assert self.disk is not None
        self.disk.append_journal(f"{directory}/{JOURNAL}", record).add_done_callback(_log_journal_failure)

    def _write_failed(self, data: ShuffleData, taken: list[Taken], exc: OSError) -> StorageError:
        """Leave the pieces in memory and fail their open map outputs; returns the error they got."""
        assert self.disk is not None
        self.disk.stats.errors += 1
        self._failed_at = time.monotonic()
        self.disk_error = exc
        event(log, "spill failed", logging.WARNING, app=data.app, shuffle=data.shuffle, reason=exc)
        reason = StorageError(f"writing map output to disk failed on this daemon: {exc.strerror or exc}")
        for out, start, _ in taken:
            self.store.unspilled(out, start)
        for out, _, _ in taken:
            if out.state is MapState.OPEN and out.on_failure is not None:
                out.on_failure(reason)
        return reason

    async def reclaim(self) -> None:
        """Free the disk blocks of aborted attempts' spilled pieces (a writer that vanished mid-push left
        them; they would stay until the shuffle goes, and one client could fill the disk that way)."""
        garbage, self.store.garbage = self.store.garbage, []
        if self.disk is None or not garbage:
            return
        files: dict[str, list[Garbage]] = {}
        for g in garbage:
            if not g.shuffle.removed:  # a removed shuffle's directory goes as a whole
                files.setdefault(g.path, []).append(g)
        for path, pieces in files.items():
            try:
                await self.disk.punch(path, [(g.offset, g.length) for g in pieces])
            except OSError as exc:
                event(log, "reclaiming disk failed", logging.WARNING, path=path, reason=exc)
                continue
            for g in pieces:
                if not g.shuffle.removed:  # removed meanwhile: `removed` settled the shuffle's accounting
                    g.shuffle.disk_bytes -= g.length
                    g.shuffle.usage.disk_bytes -= g.length
                    self.disk.stats.used_bytes -= g.length
                self.disk.stats.reclaimed_bytes += g.length

    async def removed(self, shuffles: list[ShuffleData]) -> None:
        """Delete the files of dropped shuffles (after any spill of theirs still being written)."""
        if self.disk is None:
            return
        for data in shuffles:
            if data.directory is not None:
                await self.disk.remove(data.directory)
                self.disk.stats.used_bytes -= data.disk_bytes
                self.disk.stats.files -= data.file is not None


def _log_journal_failure(done: asyncio.Future[None]) -> None:
    if not done.cancelled() and done.exception() is not None:
        event(
            log,
            "journal write failed (the data it describes will not survive a restart)",
            logging.WARNING,
            reason=done.exception(),
        )


def _retrieve(done: asyncio.Future[int]) -> None:
    if not done.cancelled():
        done.exception()


def restore(store: Store, disk: Disk) -> int:
    """Serve again what a previous run left on disk and can prove (everything else was deleted by
    `Disk.load`); the number of shuffles restored."""
    loaded = disk.load()
    for shuffle in loaded:
        store.restore(shuffle, SpillFile(disk.data_path(shuffle.directory), shuffle.file_size))
        event(
            log,
            "restored",
            app=shuffle.app,
            shuffle=shuffle.shuffle,
            attempts=len(shuffle.committed),
            bytes=sum(a.stored for a in shuffle.committed.values()),
        )
    return len(loaded)
