"""Moving stored data from the pool to disk: under memory pressure, over a quota, on request, at stop.

Pressure uses marks on the share of pool segments in use. Passing the start mark
(half way from the low watermark to the high one) starts spilling the shuffles
used longest ago (a push opened, a commit, a read) in the background, those being
pushed last (placement.py says which exactly), pushes carry on; spilling goes on until
what will be left once the writes under way are done is below the low watermark.
Passing the high watermark also holds back new push credit (sessions wait on
`admitted()`) until that projection is below the low one, or nothing more can be
spilled. The wait is the same back-pressure a full pool applies, just earlier, so
the disk has time to catch up.

One spill write takes at most `batch` in-memory pieces of one shuffle: the oldest of
its attempt holding the most memory, then of its other attempts in turn (so an
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

Without a data dir, with an object store, the writes go to objects instead (the same choice
of pieces, one object of at least a part per write, at most `OBJECT_IN_FLIGHT` at once;
storage/tier.py writes them): a *spill target* is where writes go, the data file
(`FileTarget`, below) or the object store.

A failed write (ENOSPC, EFBIG, EIO; an object store that fails) leaves the file as it was: the pieces stay in
memory; map outputs that were still open and had data in the failed spill are
aborted with STORAGE_ERROR, so their writers fail with the reason (Spark retries
the task) and their memory comes back. Committed data keeps being served from
memory. Pressure spilling then queues no more writes and backs off for
`RETRY_AFTER` seconds. Until a spill succeeds again, a push that needs memory
which only a spill could free fails at once with STORAGE_ERROR
(`push_memory_error`) instead of waiting for credit that will not come; so does
every such push on a daemon without a disk.

The `Spiller` decides when and what to spill; the writes under way are `SpillWrites`' (spill_writes.py),
the shuffles' journals `Journals`' (journal.py); disk_space.py gives the disk back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ...logs import event
from ...protocol.errors import StorageError
from .at_rest import SEAL, split_seals
from .disk import JOURNAL, PIECE_ROW, Appended, Disk, SpillFile, encode_record
from .journal import Journals
from .shuffles import FILE, ShuffleData, piece_ids
from .spill_writes import Placed, SpillTarget, SpillWrites, Taken
from .store import Store

if TYPE_CHECKING:
    from ...buffers import Buffer, GlobalPool

log = logging.getLogger(__name__)

#: spill writes queued on the writer thread at once
IN_FLIGHT = 4
#: segments one pressure spill write takes at least and at most (1 and 4 MiB of 32 KiB segments): below,
#: the per-write costs (files opened, journal record, a loop turn) show in the CPU per GiB
MIN_BATCH, MAX_BATCH = 32, 128


class FileTarget:
    """Spill writes into the shuffle's data file, with the journal record describing them (see the module)."""

    in_flight = IN_FLIGHT
    where = "to disk"

    def __init__(self, store: Store, journals: Journals, disk: Disk, batch: int) -> None:
        self.store = store
        self.journals = journals
        self.disk = disk
        self.name = disk.root
        self.batch = batch

    def submit(self, data: ShuffleData, taken: list[Taken], held: list[Buffer]) -> asyncio.Future[Placed]:
        disk = self.disk
        directory = self.journals.open(data)
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

        seal = None
        if data.key_id is not None:
            assert self.store.at_rest is not None
            pieces = piece_ids((out, i) for out, start, end in taken for i in range(start, end))
            seal = self.store.at_rest.sealer(data.key_id, data.app, data.shuffle, pieces)

        def record(done: Appended) -> bytes:
            if done.seals is not None:  # each attempt's seals after its rows
                at = 0
                for entry, (_, start, end) in zip(described, taken, strict=True):
                    entry.append(done.seals[at : at + (end - start) * SEAL])
                    at += (end - start) * SEAL
            return encode_record({"k": "pieces", "o": done.offset, "a": described})

        appended = disk.append(data.file, [buf.data() for buf in held], f"{directory}/{JOURNAL}", record, seal)
        return asyncio.ensure_future(_placed(appended))

    def wrote(self, data: ShuffleData, written: int) -> None:
        stats = self.disk.stats
        self.store.placement.wrote(data, written)
        assert data.file is not None
        data.file.size += written
        stats.spills += 1
        stats.spilled_bytes += written
        if not data.removed:  # else `removed` already settled the shuffle's disk accounting
            stats.used_bytes += written

    def failed(self) -> None:
        self.disk.stats.errors += 1


class Spiller:
    """Spills under pressure, over a quota and on request (see the module)."""

    def __init__(
        self,
        store: Store,
        pool: GlobalPool,
        disk: Disk | None,
        high: float,
        low: float,
        *,
        journals: Journals | None = None,
        writes: SpillWrites | None = None,
        objects: SpillTarget | None = None,
    ) -> None:
        self.store = store
        self.pool = pool
        self.disk = disk
        # Pushes never take the read reserve, so the high mark must lie below it to be reachable
        # (small pools get a proportionally larger reserve than `read_reserve` says).
        self.high = min(int(pool.total * high), pool.total - pool.reserve - 1)
        self.low = min(int(pool.total * low), self.high - 1)
        self.start = (self.low + self.high) // 2
        self.low_share = low
        self.journals = journals if journals is not None else Journals(store, disk)
        #: where writes go: the data dir (IN_FLIGHT batches span the watermarks), else `objects`, else nowhere
        self.target: SpillTarget | None = (
            FileTarget(store, self.journals, disk, max(MIN_BATCH, min(MAX_BATCH, (self.high - self.low) // IN_FLIGHT)))
            if disk is not None
            else objects
        )
        #: segments per pressure write
        self.batch = self.target.batch if self.target is not None else MIN_BATCH
        #: below this many stored segments, memory is held by push windows and reads: spilling cannot help
        self.worth_spilling = max(1, pool.total // 16)
        #: pushes get no new credit while set (above the high watermark, until usage without the writes under
        #: way is below the low one)
        self.paused = False
        self._resume = asyncio.Event()
        self._resume.set()
        self._task: asyncio.Task[None] | None = None
        #: the writes under way, and when the last one failed
        self.writes = writes if writes is not None else SpillWrites(store)
        #: applications over their memory quota: their pushes wait on the event until spilled below it
        self._apps: dict[str, asyncio.Event] = {}

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

    def check(self, app: str | None = None) -> None:
        """After data was added: start spilling if the pool or the application's quota asks for it."""
        if self.target is None or self.writes.backing_off():
            return
        changed = False
        if app is not None and app not in self._apps and self.store.quotas.over_memory(self.store.usage.get(app)):
            self._apps[app] = asyncio.Event()
            changed = True
        used = self.pool.used
        if (
            not self.pressure
            and used - self.writes.leaving >= self.start
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
            self.writes.ended.set()

    async def _run(self) -> None:
        assert self.target is not None
        try:
            while True:
                while len(self.writes.under_way) < self.target.in_flight and self._spill_next():
                    pass
                self._settle()
                if not self.writes.under_way:
                    return
                self.writes.ended.clear()
                await self.writes.ended.wait()
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
        if self.writes.backing_off():
            return False
        target = self._quota_target
        for app in self._apps:
            usage = self.store.usage.get(app)
            if usage is not None and usage.segments - self.writes.leaving_of(app) > target and self._spill_coldest(app):
                return True
        return self.pressure and self.pool.used - self.writes.leaving > self.low and self._spill_coldest(None)

    def _settle(self) -> None:
        """After queueing: let pushes go whose memory is on its way out (usage without the writes under way
        is below the mark), or for whom nothing more can be written."""
        assert self.target is not None
        stuck = (
            len(self.writes.under_way) < self.target.in_flight
        )  # the queueing stopped for want of pieces, not of room
        target = self._quota_target
        for app in list(self._apps):
            usage = self.store.usage.get(app)
            leaving = self.writes.leaving_of(app)
            if usage is None or usage.segments - leaving <= target or (stuck and not leaving):
                self._apps.pop(app).set()
        done = self.pool.used - self.writes.leaving <= self.low or (stuck and not self.writes.under_way)
        if done and self.paused:
            self.paused = False
            self._resume.set()
        if done:
            self.pressure = False

    @property
    def _quota_target(self) -> int:
        """What an application over its memory quota is spilled down to (segments)."""
        return int(self.store.quotas.memory * self.low_share)

    def _spill_coldest(self, app: str | None) -> bool:
        """Start writing the shuffle used longest ago that holds memory not being written (of `app`, or of
        anyone); False if none. Memory an object holds already is freed on the way, which may be all it
        takes."""
        found = self.store.placement.coldest_in_memory(app, self.writes.by_attempt, self.batch)
        if found is None:
            return False
        freed = sum(self.store.placement.release_placed(out) for out in found[1])
        assert self.target is not None
        return self.writes.start(self.target, *found, self.batch) is not None or freed > 0

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
        """Spill all of one shuffle's in-memory pieces, after its writes under way (in writes of at most a
        batch when they go to objects). Returns the bytes this call wrote; raises StorageError if a write
        failed (the pieces are then in memory again and their open map outputs failed).

        Once the pieces are taken, the write and its bookkeeping run to the end even if
        the caller is cancelled (a flush cut short at stop): otherwise the pieces would
        belong neither to memory nor to the file.
        """
        limit = None if isinstance(self.target, FileTarget) else self.batch
        total = 0
        while True:
            while under_way := self.writes.of(data):
                await asyncio.wait(under_way)  # their failure is their own; the pieces are back in memory then
            outs = [o for o in (*data.committed.values(), *data.open.values()) if o.movable]
            for out in outs:
                self.store.placement.release_placed(out)
            write = self.writes.start(self.target, data, outs, limit) if self.target is not None else None
            if write is not None:
                total += await asyncio.shield(write)
            if write is None or limit is None:
                if data.committed and not data.removed and self.disk is not None:
                    self.journals.open(data)  # empty attempts too must survive a restart
                return total


def push_memory_error(spiller: Spiller, need: int, app: str) -> StorageError | None:
    """Why a push of `app` waiting for `need` more segments would wait for good (None: memory will come).

    Memory held by reads comes back by itself, and so does a push window's until it is promised; memory
    held by stored data only when it is spilled or its shuffle removed, which Spark may do much later
    (when its driver collects the shuffle), and push credit granted and not yet used only when its writer
    pushes (then it is stored data) or ends, which an idle writer may never do. So a push of `app` waits
    only while stored data and other applications' credit leave room for it (its own application's
    writers going on is back-pressure; another's idle credit would starve it), or stored data can move
    below memory.
    """
    if spiller.target is not None and spiller.writes.error is None:
        return None
    usable = spiller.pool.total - spiller.pool.reserve
    stored = spiller.store.memory_segments
    idle = spiller.pool.promised - spiller.pool.promised_by.get(app, 0)
    if usable - stored - idle >= need:
        return None
    held = f"stored shuffle data fills {stored} of the {usable} segments pushes may use"
    if idle:
        held += f" and other applications' writers hold {idle} more as push credit they have not used"
    if spiller.target is None:
        return StorageError(
            f"no memory for this push: {held} and this daemon has no data directory to spill to "
            "(data-dir none); memory comes back when Spark removes shuffles"
        )
    return StorageError(
        f"no memory for this push: {held} and spilling to {spiller.target.name} fails: {spiller.writes.error}"
    )


async def _placed(appended: asyncio.Future[Appended]) -> Placed:
    done = await appended
    return Placed(FILE, done.offset, done.crcs, seals=split_seals(done.seals) if done.seals is not None else None)


def memory_held(pool: GlobalPool, store: Store) -> str:
    """Who holds the pool's memory, for an error that says why a push got none."""
    stored, promised = store.memory_segments, pool.promised
    others = max(0, pool.used - stored - promised)
    return (
        f"of {pool.total} segments, {stored} hold stored data, {promised} are push credit writers have not "
        f"used, {others} are held by reads and push windows, {pool.free} are free ({pool.reserve} kept for reads)"
    )
