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
  of the shuffle used longest ago (an over-quota application's first) move to an object; their blocks
  are punched once no load of that shuffle is under way (`disk_space.reclaim`);
- **durable uploads** (`durability = object-store`): committed attempts that asked for it are queued
  per shuffle; a shuffle's queue is uploaded once its pieces not yet in an object fill a part, or
  `object-store-durable-delay` after its last commit. An object carries the commit records of the
  attempts whose last pieces it holds, and only once it is complete are those attempts *durable*
  (stats, the journal). A failed upload changes nothing and is tried again after a back-off that
  doubles up to `RETRY_MAX`.

While an upload holds an attempt's pieces, the spiller leaves them (its `taken` says so), and pieces in
memory that an object holds stay in memory until the spiller wants their room: freeing them then needs
no write. A write whose shuffle was removed meanwhile deletes its object instead of keeping it.

The tier is its parts: the `ObjectWriter` (object_writer.py) writes each object, for the spiller's
`ObjectTarget` (here), the `DiskMover` (disk_moves.py) and the `DurableUploads` (durable.py); the
`Adopter` (adopt.py) serves other nodes' objects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Container

from ...buffers import Buffer, GlobalPool
from ...config import DaemonConfig
from ...logs import event
from ...ops.stats import TierStats
from ...protocol.errors import StorageError
from .access import is_owner
from .adopt import Adopter, read_footers
from .disk import Disk
from .disk_moves import DiskMover
from .durable import RETRY_FIRST, RETRY_MAX, DurableUploads
from .lease import Lease
from .object_format import app_prefix, node_dir, parse_key, shuffle_prefix
from .object_writer import ObjectWriter, Pieces
from .objects import ObjectInfo, ObjectStore
from .shuffles import MapOutput, ShuffleData
from .spill_writes import Placed, Taken
from .store import Store

log = logging.getLogger(__name__)

#: spill writes to objects at once (each one part of stored data: two keep the link busy while one ends)
OBJECT_IN_FLIGHT = 2


class ObjectTier:
    """The daemon's object-store tier (see the module). `start` it once the daemon listens, `close` at stop."""

    def __init__(
        self,
        store: Store,
        objects: ObjectStore,
        disk: Disk | None,
        config: DaemonConfig,
        stats: TierStats | None = None,
        *,
        journal: Callable[[ShuffleData, dict[str, object]], None] | None = None,
        busy: Container[MapOutput] = (),
    ) -> None:
        self.store = store
        self.objects = objects
        self.stats = stats if stats is not None else TierStats()
        #: `journal` appends a record to a shuffle's journal (with a data dir); `busy`: attempts the spiller writes
        self.writer = ObjectWriter(store, objects, disk, self.stats, journal, busy)
        self.uploads = DurableUploads(self.writer, config)
        self.mover = DiskMover(self.writer, config)
        #: serves other nodes' (and its own earlier life's) data from their objects
        self.adopter = Adopter(store, objects, self.stats)
        #: this daemon's proof of life for the other daemons' sweeps
        self.lease = Lease(objects, config.object_store_lease, self.stats)
        self._restoring: asyncio.Task[None] | None = None

    def start(self, node: str) -> None:
        self.writer.node = self.adopter.node = node
        self.uploads.start()
        self.lease.start(node)
        self._restoring = asyncio.create_task(self._restore_own())

    @property
    def restored(self) -> bool:
        """This daemon holds every attempt its own objects prove: until then it cannot say what it does not
        hold (the admin `applications` says it is still restoring, and no sweep takes it at its word)."""
        return self._restoring is not None and self._restoring.done()

    async def _restore_own(self) -> None:
        """Adopt what objects written under this daemon's name prove and its store does not know: those of an
        earlier life without a data dir, or with another. Tried again after a failure until it went through."""
        delay = RETRY_FIRST
        while True:
            try:
                adopted = await self.restore_own()
            except StorageError as exc:
                event(log, "restoring own objects failed", logging.WARNING, reason=exc.message, retry_s=delay)
                await asyncio.sleep(delay)  # a back-off before trying the store again, not a wait for an event
                delay = min(2 * delay, RETRY_MAX)
                continue
            if adopted:
                event(log, "restored own objects", attempts=adopted)
            return

    async def restore_own(self) -> int:
        """One pass of `_restore_own`: the attempts adopted."""
        me = node_dir(self.writer.node)
        known = {o.key for shuffles in self.store.apps.values() for d in shuffles.values() for o in d.objects}
        first: dict[tuple[str, int], ObjectInfo] = {}
        for info in await self.objects.list_objects():
            parts = parse_key(info.key)
            if parts is not None and parts.node_dir == me and info.key not in known:
                first.setdefault((parts.app_dir, parts.shuffle), info)
        adopted = 0
        for (_, shuffle), footer in zip(first, await read_footers(self.objects, list(first.values())), strict=True):
            if footer is not None:
                adopted += await self.adopt(footer.app, shuffle, self.writer.node)
        return adopted

    async def close(self) -> None:
        if self._restoring is not None:
            self._restoring.cancel()
        await self.uploads.close()
        await self.mover.close()
        self.lease.stop()

    async def adopt(self, app: str, shuffle: int, node: str) -> int:
        """Serve what `node`'s objects of the shuffle prove from here (adopt.py); the attempts adopted."""
        return await self.adopter.adopt(app, shuffle, node)

    def spill_target(self, pool: GlobalPool) -> ObjectTarget:
        """Where the spiller writes without a data dir: objects, one of at least a part per write (fewer
        segments only in pools too small to hold three such writes). A piece fills its segment only nearly
        (a group's header, a writer's last group), so a write takes a sixteenth more segments than a part
        holds: objects of whole parts keep spills within 64 PUTs per GiB."""
        usable = pool.total - pool.reserve
        part = self.writer.part // pool.segment_size
        return ObjectTarget(self, max(1, min(part + part // 16, usable // 3)))

    async def removed(self, shuffles: list[ShuffleData], adopted: bool = True) -> None:
        """Dropped shuffles: forget their queued uploads and delete their objects (those this daemon wrote,
        and with `adopted` those it adopted from other nodes). A write still under way deletes its own
        object when it ends. A delete that fails is logged: the sweep finds what it left."""
        keys = []
        for data in shuffles:
            self.uploads.forget(data)
            keys += [o.key for o in data.objects if adopted or o.own]
            for out in data.committed.values():
                if out.durable:
                    self.stats.durable_attempts -= 1
        await self.writer.delete(keys)

    async def delete_owned(self, app: str, shuffle: int | None, digest: bytes) -> None:
        """Delete every node's objects of an application or one shuffle of it that its owner's token (`digest`)
        speaks for: what the daemon the driver told does after the drop went round, so lost nodes' objects go
        too. Each object's footer names the digest its application was bound to where it was written; one
        written for other credentials, for none, or whose footer cannot be read stays (`is_owner`: deleting
        is an owner's act), counted and logged, for its own lifecycle (the sweep)."""
        prefix = app_prefix(app) if shuffle is None else shuffle_prefix(app, shuffle)
        try:
            listed = await self.objects.list_objects(prefix)
            footers = await read_footers(self.objects, listed)
            doomed = [
                info.key
                for info, footer in zip(listed, footers, strict=True)
                if footer is not None and footer.app == app and is_owner(footer.key, digest)
            ]
            await self.objects.delete(doomed)
        except StorageError as exc:
            event(log, "deleting objects failed", logging.WARNING, prefix=prefix, reason=exc.message)
            return
        self.stats.deleted_objects += len(doomed)
        if len(doomed) < len(listed):
            self.stats.kept_objects += len(listed) - len(doomed)
            event(
                log,
                "objects kept",
                logging.WARNING,
                prefix=prefix,
                objects=len(listed) - len(doomed),
                reason="written for other credentials than this request's (or their footer does not say)",
            )


class ObjectTarget:
    """The spiller's writes into objects, without a data dir (spill_writes.py's `SpillTarget`)."""

    in_flight = OBJECT_IN_FLIGHT
    where = "to the object store"

    def __init__(self, tier: ObjectTier, batch: int) -> None:
        self.tier = tier
        self.name = tier.objects.config.url
        self.batch = batch

    def submit(self, data: ShuffleData, taken: list[Taken], held: list[Buffer]) -> asyncio.Future[Placed]:
        tier = self.tier
        pieces = [(out, list(range(start, end))) for out, start, end in taken]
        commits = tier.uploads.complete_commits(data, {out: end for out, _, end in taken})
        tier.writer.claimed.update(commits)
        return asyncio.ensure_future(self._write(data, pieces, commits))

    async def _write(self, data: ShuffleData, pieces: list[Pieces], commits: list[MapOutput]) -> Placed:
        tier = self.tier
        try:
            written = await tier.writer.write(data, pieces, commits, "spilled")
        except BaseException:
            tier.writer.claimed.difference_update(commits)
            raise
        if written is None:  # removed meanwhile: the spiller leaves garbage nowhere, the object is gone
            tier.writer.claimed.difference_update(commits)
            return Placed(0, 0)
        return Placed(written.place, 0, None, lambda: tier.uploads.made_durable(data, commits), written.seals)

    def wrote(self, data: ShuffleData, written: int) -> None:
        """Counted by the tier's write."""

    def failed(self) -> None:
        self.tier.stats.write_errors += 1
