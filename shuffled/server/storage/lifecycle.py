"""What happens to stored data at each step of its life after it was pushed: commit, drop, flush, persist,
expiry. This is the one place that says it; the parts do what it asks (the store counts and forgets, the
spiller writes to disk, disk_space.py deletes files, the tier uploads and deletes objects, the journals
record).

- **commit**: the attempt becomes readable in one step (a reader sees all of it or none); once the shuffle
  has a journal the commit is journaled, and an attempt that asked to be durable is queued for its upload.
- **drop** (an application or a shuffle, on its owner's request or when storage finds it expired or empty):
  its memory is given back now (segments readers still hold go when they let go), its spill files are
  deleted after any spill of theirs still being written, and its objects: on request those this daemon
  wrote and those it adopted; on expiry only those it wrote (adopted ones are another node's, left to their
  own lifecycle). What was dropped is remembered (departures.py), so that its owner's later read fails
  with the reason instead of reading as empty. Deleting is an owner's act: a request's token is checked
  before it gets here (`is_owner`, access.py), and other nodes' objects are deleted only where their
  footers name the requester's token (`delete_owned`). Nothing here deletes on the word of a peer that
  did not answer.
- **flush** (a finished map stage, the admin `flush`, a shuffle idle for `flush-after`): with a data dir its
  pieces in memory are written to disk (the memory goes to the next stage, a restart keeps them); without
  one but with an object store its committed attempts are made durable there; with neither there is
  nowhere to flush to.
- **persist** (the daemon stops): the same for every shuffle, then the data dir is synced and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from array import array

from ...config import DaemonConfig
from ...logs import event
from ...protocol.errors import InvalidRequest, StorageError
from . import disk_space
from .departures import Departures
from .disk import Disk
from .shuffles import MapOutput, ShuffleData
from .spill import Spiller
from .store import Store
from .tier import ObjectTier

log = logging.getLogger(__name__)


class Lifecycle:
    """Commit, drop, flush, persist and expiry (see the module), over the parts of one `StorageManager`."""

    def __init__(
        self, config: DaemonConfig, store: Store, spiller: Spiller, tier: ObjectTier | None, disk: Disk | None
    ) -> None:
        self.config = config
        self.store = store
        self.spiller = spiller
        self.tier = tier
        self.disk = disk
        self.departures = Departures()

    def commit(self, out: MapOutput, copies: tuple[str, ...]) -> array[int]:
        """Make the attempt readable (`copies`: the daemons that committed its replicas first); its bytes per
        partition. Raises MapOutputStateError for one no longer open (its shuffle was dropped meanwhile)."""
        lengths = self.store.commit(out, copies)
        self.spiller.journals.committed(out.shuffle, out.attempt)
        if self.tier is not None:
            self.tier.uploads.committed(out)
        return lengths

    def syncs_commit(self, out: MapOutput) -> bool:
        """Its CommitAck waits for a sync: `--fsync commit`, or its writer asked for it."""
        return self.disk is not None and (self.disk.syncs.on_commit or out.wants_sync)

    async def commit_synced(self, out: MapOutput, copies: tuple[str, ...]) -> array[int]:
        """`--fsync commit`'s commit: the attempt's data to its file and synced (with every write before it),
        then the commit, its journal record appended after that sync and synced with the directories. A
        restart thus never finds a commit record whose data the device may not hold; an answer (the
        CommitAck) means both are there. Commits under way at once share their syncs (fsync.py)."""
        if self.disk is None or not self.syncs_commit(out):
            return self.commit(out, copies)
        syncs, journals, data = self.disk.syncs, self.spiller.journals, out.shuffle
        try:
            await self._write_attempt(out)
            await syncs.sync()
            lengths = self.store.commit(out, copies)
            if data.directory is None:
                journals.open(data)  # the header holds the commits so far, this one too
                await syncs.sync()
            else:
                await syncs.sync([journals.commit_record(data, out.attempt)])
        except OSError as exc:
            raise StorageError(f"syncing map output to this daemon's --data-dir failed: {exc}") from exc
        if self.tier is not None:
            self.tier.uploads.committed(out)
        return lengths

    async def _write_attempt(self, out: MapOutput) -> None:
        """All of one attempt's in-memory pieces to the data file, after its write under way; raises
        StorageError if a write failed (the pieces are then in memory again)."""
        writes = self.spiller.writes
        while (under_way := writes.by_attempt.get(out)) is not None:
            await asyncio.wait([under_way.done])
        self.store.placement.release_placed(out)
        assert self.spiller.target is not None
        write = writes.start(self.spiller.target, out.shuffle, [out], None)
        if write is not None:
            await asyncio.shield(write)

    async def drop(self, app: str, shuffle: int | None, reason: str | None, adopted: bool = True) -> int:
        """Drop the application, or one shuffle of it, for `reason` (what a later read of it is told; None:
        nothing of it was ever readable); the segments freed (now, or when readers let go). `adopted`: delete
        the objects adopted from other nodes too (a request by the data's owner), not only those it wrote."""
        if reason is not None:
            self.departures.left(app, shuffle, reason, self.store.app_keys.get(app))
        if shuffle is None:
            freed, dropped = self.store.remove_application(app)
        else:
            freed, dropped = self.store.unregister_shuffle(app, shuffle)
        await disk_space.removed(self.disk, dropped)
        if self.tier is not None:
            await self.tier.removed(dropped, adopted)
        return freed

    async def delete_owned(self, app: str, shuffle: int | None, digest: bytes) -> None:
        """After a drop went round the daemons: delete every node's objects of the application (or shuffle)
        whose footers say they were written for the token with `digest`, which takes lost nodes' objects
        too and leaves those of other credentials (tier.py)."""
        if self.tier is not None:
            await self.tier.delete_owned(app, shuffle, digest)

    async def flush(self, app: str, shuffle: int | None) -> dict[str, int]:
        """Flush the application's shuffles (or one): the admin `flush`'s answer. Raises StorageError (the data
        stays in memory) or InvalidRequest (nowhere to flush to)."""
        chosen = [d for s, d in self.store.apps.get(app, {}).items() if shuffle is None or s == shuffle]
        if self.disk is None and self.tier is not None:
            try:
                await self.tier.uploads.persist(chosen)
            except StorageError as exc:
                raise StorageError("uploading to the object store failed; the data stays in memory") from exc
            return {
                "flushed_bytes": 0,
                "durable_attempts": sum(o.durable for d in chosen for o in d.committed.values()),
            }
        if self.disk is None:
            raise InvalidRequest("this daemon has no --data-dir to flush to")
        try:
            written = await self.spiller.flush(chosen)
            if self.disk.syncs.on_commit:
                await self.disk.syncs.sync()
        except StorageError as exc:
            raise StorageError("writing to this daemon's --data-dir failed; the data stays in memory") from exc
        except OSError as exc:
            raise StorageError(f"syncing this daemon's --data-dir failed: {exc}") from exc
        return {"flushed_bytes": written}

    async def persist(self) -> None:
        """At stop: write every committed byte still in memory to disk, so a restart serves it, then sync and
        close the data dir; without one, make it durable in the object store (a restart serves what the
        objects prove)."""
        shuffles = self._shuffles()
        if self.disk is None:
            if self.tier is not None and shuffles:
                try:
                    durable = await self.tier.uploads.persist(shuffles)
                except StorageError as exc:
                    event(log, "persisting to the object store failed", logging.WARNING, reason=exc.message)
                else:
                    event(log, "persisted", shuffles=len(shuffles), durable_attempts=durable)
            return
        try:
            written, complete = await self.spiller.flush(shuffles), True
        except StorageError:  # the spiller logged it; what was written before is still synced
            written, complete = 0, False
        await self.disk.sync()
        if self.disk.syncs.mode != "none":
            try:
                await self.disk.syncs.sync()
            except OSError as exc:
                event(log, "fsync failed", logging.WARNING, reason=exc)
        self.disk.close()
        event(log, "persisted", shuffles=len(shuffles), bytes_written=written, complete=complete)

    async def housekeeping(self, now: float) -> None:
        """One round (monotonic `now`): drop applications whose driver vanished (`app-ttl`) and those left
        holding nothing (every map output of theirs aborted: kept, each would cost its id and usage until
        `app-ttl`, and one tenant could leave any number), flush idle shuffles (`flush-after`), spill what
        the pool or a quota asks for and retry a failed disk, move spilled data over the disk quota to the
        object store, and give back the disk of aborted attempts' pieces."""
        cfg = self.config
        # other nodes' objects it adopted stay for their own cleanup
        for app in self._expired(now):
            await self.drop(app, None, "removed when its application expired (idle for app-ttl)", adopted=False)
        for app in self.store.empty_applications():  # nothing of it was readable: no record either
            await self.drop(app, None, None, adopted=False)
        if cfg.flush_after and self.disk is not None:
            idle = [d for d in self._shuffles() if d.segments and not d.open and now - d.last_commit > cfg.flush_after]
            with contextlib.suppress(StorageError):  # the spiller logged it; the next round tries again
                await self.spiller.flush(idle)
        self.spiller.check()
        if self.tier is not None:
            self.tier.mover.relieve_disk()
        await disk_space.reclaim(self.store.placement, self.disk)

    def _expired(self, now: float) -> list[str]:
        """Applications idle for `app-ttl` with no map output open."""
        ttl = self.config.app_ttl
        if not ttl:
            return []
        expired = []
        for app, usage in list(self.store.usage.items()):
            busy = any(d.open for d in self.store.apps.get(app, {}).values())
            if not busy and now - usage.last_active > ttl:
                event(log, "application expired", app=app, idle_seconds=round(now - usage.last_active))
                expired.append(app)
        return expired

    def _shuffles(self) -> list[ShuffleData]:
        return [d for shuffles in self.store.apps.values() for d in shuffles.values()]
