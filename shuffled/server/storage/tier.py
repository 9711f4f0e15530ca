"""The object-store tier: pieces written into objects below memory and the data dir (architecture.md, "The
object-store tier").

Every object the tier writes is pieces of one shuffle, back to back, and a footer that indexes them
(object_format.py): pieces in memory are handed to the client as they are (their segments referenced
until the upload ends, never copied), pieces in the data file are read back first (outside the pool,
at most one object's worth per write). An object holds at least a part (`object-store-part-size`,
unless a flush or a stop writes what is left) and less than two, sent as one PUT: at most 64 PUTs per
GiB with 16 MiB parts. Keys start from the clock, so no life of a daemon repeats one.

It writes for three reasons, and counts each (`TierStats`):

- **spill** (no data dir): the spiller's writes go to an object instead of a file (`ObjectTarget`);
- **move** (a data dir over `disk-quota` or an application over `app-disk-quota`): the oldest pieces
  of the shuffle holding the most disk move to an object; their blocks are punched once no load of
  that shuffle is under way (`Spiller.reclaim`);
- **durable uploads** (`durability = object-store`): committed attempts that asked for it are queued
  per shuffle; a shuffle's queue is uploaded once its pieces not yet in an object fill a part, or
  `object-store-durable-delay` after its last commit. An object carries the commit records of the
  attempts whose last pieces it holds, and only once it is complete are those attempts *durable*
  (stats, the journal). A failed upload changes nothing and is tried again after a back-off that
  doubles up to `RETRY_MAX`.

While an upload holds an attempt's pieces, the spiller leaves them (its `taken` says so), and pieces in
memory that an object holds stay in memory until the spiller wants their room: freeing them then needs
no write. A write whose shuffle was removed meanwhile deletes its object instead of keeping it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field

from ...buffers import Buffer
from ...config import DaemonConfig
from ...logs import event
from ...ops.stats import TierStats
from ...protocol.errors import CorruptData, StorageError
from .adopt import Adopter
from .disk import PIECE_ROW, Disk, StoredObject
from .object_format import FOOTER_GUESS, Entry, Footer, app_prefix, object_key, shuffle_prefix
from .objects import ObjectStore
from .shuffles import FILE, MapOutput, ShuffleData, commit_fields
from .spill import Placed, Taken
from .store import Store

log = logging.getLogger(__name__)

#: spill writes to objects at once (each one part of stored data: two keep the link busy while one ends)
OBJECT_IN_FLIGHT = 2
#: durable uploads at once (objects of different attempts)
UPLOADS_IN_FLIGHT = 4
#: first and longest wait before a failed durable upload is tried again (seconds; doubles in between)
RETRY_FIRST, RETRY_MAX = 1.0, 30.0
#: a disk over its quota is brought down to this share of it, so moves do not start again at once
DISK_LOW = 0.9

#: pieces of one attempt an object takes: their indices, ascending
Pieces = tuple[MapOutput, list[int]]


@dataclass(slots=True, eq=False)
class _Queue:
    """A shuffle's committed attempts waiting for their durable upload."""

    attempts: list[MapOutput] = field(default_factory=list)
    #: loop time from which it is uploaded (a part's worth is there, or the delay passed)
    due: float = 0.0
    #: seconds to wait after the next failure
    backoff: float = RETRY_FIRST


class ObjectTier:
    """The daemon's object-store tier (see the module). `start` it once the daemon listens, `close` at stop."""

    def __init__(
        self,
        store: Store,
        objects: ObjectStore,
        disk: Disk | None,
        config: DaemonConfig,
        stats: TierStats | None = None,
    ) -> None:
        self.store = store
        self.objects = objects
        self.disk = disk
        self.config = config
        self.stats = stats if stats is not None else TierStats()
        self.part = objects.config.part_size
        #: the most bytes of pieces an object takes: under two parts, with room for the footer
        self.most = 2 * self.part - FOOTER_GUESS
        #: this daemon's name (set once it listens): objects are written under it
        self.node = ""
        #: appends a record to a shuffle's journal (the spiller's, with a data dir)
        self.journal: Callable[[ShuffleData, dict[str, object]], None] = _no_journal
        #: attempts the spiller is writing (their pieces are not taken)
        self.busy: Container[MapOutput] = ()
        self._sequence = itertools.count(time.time_ns())
        self._queues: dict[ShuffleData, _Queue] = {}
        #: attempts a tier write under way holds: their pieces (an upload, a move) or their commit record
        self._claimed: set[MapOutput] = set()
        #: serves other nodes' (and its own earlier life's) data from their objects
        self.adopter = Adopter(store, objects, self.stats)
        self._wake = asyncio.Event()
        self._uploader: asyncio.Task[None] | None = None
        self._uploads: set[asyncio.Task[bool]] = set()
        self._mover: asyncio.Task[None] | None = None

    def start(self, node: str) -> None:
        self.node = self.adopter.node = node
        self._uploader = asyncio.create_task(self._upload_loop())

    async def close(self) -> None:
        for task in (self._uploader, self._mover, *self._uploads):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def adopt(self, app: str, shuffle: int, node: str) -> int:
        """Serve what `node`'s objects of the shuffle prove from here (adopt.py); the attempts adopted."""
        return await self.adopter.adopt(app, shuffle, node)

    # -- writing one object

    async def write(self, data: ShuffleData, pieces: list[Pieces], commits: list[MapOutput], why: str) -> int | None:
        """One object of these pieces, back to back in this order, and the commit records of `commits`; its
        place in the shuffle once complete, None if the shuffle was removed meanwhile (the object is then
        deleted). Raises StorageError (nothing changed) or CorruptData (a piece read back from the data
        file failed its check)."""
        held: list[Buffer] = []
        try:
            chunks = await self._chunks(data, pieces, held)
            footer = Footer(data.app, data.shuffle, data.partitions, self.node, self.store.app_keys.get(data.app))
            offset = 0
            for out, indices in pieces:
                for run in _runs(indices):
                    rows = b"".join(PIECE_ROW.pack(out.sizes[i], out.crcs[i], out.firsts[i], out.lasts[i]) for i in run)
                    footer.entries.append(Entry(out.attempt, out.serial, run[0], offset, rows))
                    offset += sum(out.sizes[i] for i in run)
            footer.commits = [commit_fields(data, out.attempt) for out in commits]
            tail = footer.encode()
            key = object_key(data.app, data.shuffle, self.node, next(self._sequence))
            size = await self.objects.write(key, [*chunks, tail], single=True)
        finally:
            for buf in held:
                buf.release()
        if data.removed:
            await self._delete([key])
            return None
        stats = self.stats
        setattr(stats, f"{why}_objects", getattr(stats, f"{why}_objects") + 1)
        setattr(stats, f"{why}_bytes", getattr(stats, f"{why}_bytes") + offset)
        place = self.store.placement.add_object(data, StoredObject(key, size))
        record: dict[str, object] = {
            "k": "object",
            "key": key,
            "size": size,
            "a": [[e.attempt, e.serial, e.start, e.offset, e.rows] for e in footer.entries],
            "d": [[out.attempt, out.serial] for out in commits],
        }
        self.journal(data, record)
        return place

    async def _chunks(self, data: ShuffleData, pieces: list[Pieces], held: list[Buffer]) -> list[memoryview]:
        """The pieces' bytes in order: memory ones as they are (a reference each in `held`), those in the data
        file read back with one read per run of them that lies back to back, and checked."""
        chunks: list[memoryview] = []
        #: pieces in the file: (offset, [(chunk slot, size, CRC32C)]) per run, and where the last run ends
        runs: list[tuple[int, list[tuple[int, int, int]]]] = []
        end = -1
        for out, indices in pieces:
            for i in indices:
                buf = out.buffer(i)
                if buf is not None:
                    buf.retain()
                    held.append(buf)
                    chunks.append(buf.data())
                    continue
                assert i < out.placed and out.places[i] == FILE, "a tier write takes no piece an object holds"
                at, size = out.offsets[i], out.sizes[i]
                if at != end:
                    runs.append((at, []))
                runs[-1][1].append((len(chunks), size, out.crcs[i]))
                end = at + size
                chunks.append(memoryview(b""))
        for at, slots in runs:
            await self._read_back(data, at, slots, chunks)
        return chunks

    async def _read_back(
        self, data: ShuffleData, offset: int, slots: list[tuple[int, int, int]], chunks: list[memoryview]
    ) -> None:
        """Read pieces lying back to back in the shuffle's file from `offset` into memory of their own (not
        the pool's: at most an object's worth, for as long as its upload takes), as `chunks[slot]`, and check
        each against its CRC32C."""
        assert self.disk is not None and data.file is not None
        room = memoryview(bytearray(sum(size for _, size, _ in slots)))
        views = []
        at = 0
        for slot, size, _ in slots:
            chunks[slot] = room[at : at + size]
            views.append(chunks[slot])
            at += size
        data.loading += 1
        try:
            fd, crcs = await self.disk.read(None, data.file.path, offset, views)
            os.close(fd)
        except (OSError, EOFError) as exc:
            raise StorageError(f"reading spilled data of {data.app}/{data.shuffle} back failed: {exc}") from None
        finally:
            data.loading -= 1
        if crcs != [crc for _, _, crc in slots]:
            raise CorruptData(f"spilled data of {data.app}/{data.shuffle} failed its CRC32C check on its way up")

    # -- spills without a data dir

    def spill_target(self, batch: int) -> ObjectTarget:
        return ObjectTarget(self, batch)

    def complete_commits(self, data: ShuffleData, placing: dict[MapOutput, int]) -> list[MapOutput]:
        """Queued attempts of the shuffle whose pieces not yet in an object are exactly those a write places
        (`placing`: attempt -> the index its pieces up to are placed): their commit records may go in it."""
        queue = self._queues.get(data)
        if queue is None:
            return []
        done = []
        for out in queue.attempts:
            if out.durable or out.dead or out in self._claimed:
                continue
            if placing.get(out, out.placed) == out.pieces and all(p != FILE for p in out.places):
                done.append(out)
        return done

    def made_durable(self, data: ShuffleData, outs: list[MapOutput]) -> None:
        """These attempts' commit records are in a complete object."""
        queue = self._queues.get(data)
        for out in outs:
            self._claimed.discard(out)
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

    # -- durable uploads

    def committed(self, out: MapOutput) -> None:
        """An attempt was committed: queue its durable upload if it wants one."""
        if not out.wants_durable or out.durable:
            return
        data = out.shuffle
        queue = self._queues.setdefault(data, _Queue())
        queue.attempts.append(out)
        self.stats.pending_attempts += 1
        now = asyncio.get_running_loop().time()
        queue.due = (
            now
            if self._pending_bytes(queue) >= self.part
            else max(queue.due, now + self.config.object_store_durable_delay)
        )
        self._count_pending()
        self._wake.set()

    def _pending_bytes(self, queue: _Queue) -> int:
        return sum(o.unplaced_bytes() for o in queue.attempts if not o.dead)

    def _count_pending(self) -> None:
        self.stats.pending_bytes = sum(self._pending_bytes(q) for q in self._queues.values())

    async def _upload_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._wake.clear()
                now = loop.time()
                for data in [d for d, q in self._queues.items() if q.due <= now]:
                    while len(self._uploads) < UPLOADS_IN_FLIGHT and self.start_upload(data) is not None:
                        pass
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
            self._forget(data)
            return None
        pieces, commits = self._take(queue)
        if not pieces and not commits:
            if not any(o in self._claimed for o in queue.attempts):  # spills under way: look again soon
                queue.due = asyncio.get_running_loop().time() + RETRY_FIRST
            return None
        outs = {out for out, _ in pieces} | set(commits)
        for out, _ in pieces:
            out.taken = out.pieces  # the spiller leaves them (pieces in memory an object holds it may free)
        self._claimed.update(outs)
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
            place = await self.write(data, pieces, commits, "durable")
        except (StorageError, CorruptData) as exc:
            self.stats.write_errors += 1
            self._claimed.difference_update(outs)
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
            self._claimed.difference_update(outs)
            for out, _ in pieces:
                out.taken = out.placed
            raise
        queue.backoff = RETRY_FIRST
        self._claimed.difference_update(outs)
        if place is not None:
            self._placed(pieces, place)
        for out, _ in pieces:
            out.taken = out.placed
        self.made_durable(data, commits if place is not None else [])
        if data in self._queues and self._pending_bytes(queue) >= self.part:
            queue.due = asyncio.get_running_loop().time()
        return True

    def _take(self, queue: _Queue) -> tuple[list[Pieces], list[MapOutput]]:
        """The pieces not yet in an object of the queued attempts, in order, until an object is full (an
        attempt may be cut: its commit record then goes in a later object), and the attempts all of whose
        such pieces are taken."""
        pieces: list[Pieces] = []
        commits: list[MapOutput] = []
        size = 0
        for out in queue.attempts:
            if out in self.busy or out in self._claimed or out.durable:
                continue
            left = [i for i in range(out.placed) if out.places[i] == FILE] + list(range(out.placed, out.pieces))
            took: list[int] = []
            for i in left:
                if size + out.sizes[i] > self.most and (pieces or took):
                    break
                took.append(i)
                size += out.sizes[i]
            if took:
                pieces.append((out, took))
            if len(took) == len(left):
                commits.append(out)
            if len(took) < len(left) or size >= self.part:
                break
        return pieces, commits

    def _placed(self, pieces: list[Pieces], place: int) -> None:
        offset = 0
        for out, indices in pieces:
            if not out.dead:
                self.store.placement.uploaded(out, indices, place, offset)
            offset += sum(out.sizes[i] for i in indices)

    def _forget(self, data: ShuffleData) -> None:
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

    # -- moves from the data dir

    def relieve_disk(self) -> None:
        """With the data dir over `disk-quota` (or an application over `app-disk-quota`), start moving its
        oldest pieces to objects unless that is under way."""
        if self.disk is None or (self._mover is not None and not self._mover.done()):
            return
        if self._over_disk() > 0:
            self._mover = asyncio.create_task(self._move())

    def _over_disk(self) -> int:
        """Bytes to move: down to DISK_LOW of the daemon's quota, or of an application's."""
        assert self.disk is not None
        cfg = self.config
        over = 0
        live = self._live_disk_bytes()
        if cfg.disk_quota and live > cfg.disk_quota:
            over = live - int(cfg.disk_quota * DISK_LOW)
        if cfg.app_disk_quota:
            for usage in self.store.usage.values():
                if usage.disk_bytes > cfg.app_disk_quota:
                    over = max(over, usage.disk_bytes - int(cfg.app_disk_quota * DISK_LOW))
        return over

    def _live_disk_bytes(self) -> int:
        """Spill file bytes not yet given back, less those moved already (punched soon)."""
        assert self.disk is not None
        return self.disk.stats.used_bytes - sum(g.length for g in self.store.placement.garbage)

    async def _move(self) -> None:
        try:
            over = self._over_disk()
            while over > 0:
                found = self._most_disk()
                if found is None:
                    return
                data, pieces = found
                outs = [out for out, _ in pieces]
                self._claimed.update(outs)
                try:
                    place = await self.write(data, pieces, [], "moved")
                finally:
                    self._claimed.difference_update(outs)
                if place is not None:
                    self._placed(pieces, place)
                over -= sum(out.sizes[i] for out, indices in pieces for i in indices)
        except (StorageError, CorruptData) as exc:
            self.stats.write_errors += 1
            event(log, "moving spilled data to the object store failed", logging.WARNING, reason=exc.message)
        except Exception:
            event(log, "moving spilled data to the object store failed", logging.ERROR, exc_info=True)

    def _most_disk(self) -> tuple[ShuffleData, list[Pieces]] | None:
        """The oldest pieces in the data file (by offset) of the committed attempts of the shuffle holding the
        most disk, up to an object's worth."""
        shuffles = [d for s in self.store.apps.values() for d in s.values() if d.file is not None and not d.removed]
        for data in sorted(shuffles, key=lambda d: d.disk_bytes, reverse=True):
            found: list[tuple[int, MapOutput, int]] = [
                (out.offsets[i], out, i)
                for out in data.committed.values()
                if out not in self._claimed
                for i in range(out.placed)
                if out.places[i] == FILE
            ]
            if not found:
                continue
            found.sort(key=lambda f: f[0])
            chosen: dict[MapOutput, list[int]] = {}
            size = 0
            for _, out, i in found:
                if size + out.sizes[i] > self.most and chosen:
                    break
                chosen.setdefault(out, []).append(i)
                size += out.sizes[i]
            return data, [(out, sorted(indices)) for out, indices in chosen.items()]
        return None

    # -- cleanup

    async def removed(self, shuffles: list[ShuffleData], adopted: bool = True) -> None:
        """Dropped shuffles: forget their queued uploads and delete their objects (those this daemon wrote,
        and with `adopted` those it adopted from other nodes). A write still under way deletes its own
        object when it ends. A delete that fails is logged: the sweep finds what it left."""
        keys = []
        for data in shuffles:
            self._forget(data)
            keys += [o.key for o in data.objects if adopted or o.own]
            for out in data.committed.values():
                if out.durable:
                    self.stats.durable_attempts -= 1
        await self._delete(keys)

    async def delete_prefix(self, app: str, shuffle: int | None = None) -> None:
        """Delete every node's objects of an application or one shuffle of it (the daemon the driver told:
        lost nodes' objects go too)."""
        prefix = app_prefix(app) if shuffle is None else shuffle_prefix(app, shuffle)
        try:
            self.stats.deleted_objects += await self.objects.delete_prefix(prefix)
        except StorageError as exc:
            event(log, "deleting objects failed", logging.WARNING, prefix=prefix, reason=exc.message)

    async def _delete(self, keys: list[str]) -> None:
        if not keys:
            return
        try:
            await self.objects.delete(keys)
            self.stats.deleted_objects += len(keys)
        except StorageError as exc:
            event(log, "deleting objects failed", logging.WARNING, objects=len(keys), reason=exc.message)


class ObjectTarget:
    """The spiller's writes into objects, without a data dir (spill.py's `SpillTarget`)."""

    in_flight = OBJECT_IN_FLIGHT

    def __init__(self, tier: ObjectTier, batch: int) -> None:
        self.tier = tier
        self.name = tier.objects.config.url
        self.batch = batch

    def submit(self, data: ShuffleData, taken: list[Taken], held: list[Buffer]) -> asyncio.Future[Placed]:
        tier = self.tier
        pieces = [(out, list(range(start, end))) for out, start, end in taken]
        commits = tier.complete_commits(data, {out: end for out, _, end in taken})
        tier._claimed.update(commits)
        return asyncio.ensure_future(self._write(data, pieces, commits))

    async def _write(self, data: ShuffleData, pieces: list[Pieces], commits: list[MapOutput]) -> Placed:
        tier = self.tier
        try:
            place = await tier.write(data, pieces, commits, "spilled")
        except BaseException:
            tier._claimed.difference_update(commits)
            raise
        if place is None:  # removed meanwhile: the spiller leaves garbage nowhere, the object is gone
            tier._claimed.difference_update(commits)
            return Placed(0, 0)
        return Placed(place, 0, None, lambda: tier.made_durable(data, commits))

    def wrote(self, data: ShuffleData, written: int) -> None:
        """Counted by the tier's write."""

    def failed(self) -> None:
        self.tier.stats.write_errors += 1


def _runs(indices: list[int]) -> list[list[int]]:
    """Ascending indices cut into runs of consecutive ones."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][-1] + 1 == i:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _no_journal(data: ShuffleData, record: dict[str, object]) -> None:
    """Without a data dir nothing is journaled: footers describe the objects."""
