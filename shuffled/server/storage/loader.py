"""Reading stored pieces back: the one loader, into pool segments for a read's view (view.py: a local read,
a failover to this daemon's own copy or to the object store, a drain's or healing's copies), and into
memory of a tier write's own for an upload of pieces from the data file (`read_back`).

A batch is a run of one attempt's pieces that lie back to back in one place (`run`): the shuffle's data
file, read with one `preadv`, or one of its objects, read with one ranged GET; either way into segments
of the read reserve (`take`), each checked against the CRC32C its writer sent. A file or object that is
gone (its shuffle was removed meanwhile) is PARTITION_NOT_FOUND, a read that fails or a checksum that
differs is CORRUPT_DATA (a fetch failure: the reader tries another copy); on any failure the segments go
back to their pool. A load cancelled while the reading thread fills its segments lets the thread finish
first: a segment goes back only once nothing writes into it. While a file load is under way its
shuffle counts it (`ShuffleData.loading`), so blocks of pieces that moved to an object meanwhile are
not punched under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable, Sequence

from ...buffers import LOAD, Buffer, GlobalPool
from ...protocol.errors import CorruptData, PartitionNotFound, StorageError
from ...protocol.integrity import checksum
from .at_rest import AtRestKeys, Opener, off_loop
from .disk import Disk
from .objects import ObjectNotFound, ObjectStore
from .shuffles import FILE, MapOutput, ShuffleData, piece_ids


def run(out: MapOutput, indices: Iterable[int], limit: int) -> list[int]:
    """The first of `indices` (a piece of `out` no longer in memory) and those after it that lie right behind
    it in the same place, at most `limit` of them; an index repeated (a piece several items use) is taken
    once."""
    batch: list[int] = []
    places, offsets, sizes = out.places, out.offsets, out.sizes
    for i in indices:
        if batch and i == batch[-1]:
            continue
        if len(batch) >= limit or i >= out.spilled:
            break
        if batch and (i != batch[-1] + 1 or places[i] != places[i - 1] or offsets[i] != offsets[i - 1] + sizes[i - 1]):
            break
        batch.append(i)
    return batch


async def take(pool: GlobalPool, want: int, recycler: Callable[[Buffer], None]) -> list[Buffer]:
    """Up to `want` segments of the read reserve, counted when they are taken: whatever loads may take then
    (a reader's credit may exceed what a small or busy pool can give at once), else one, waited for in turn
    (the reserve guarantees it in time), plus what the wait left. Never more than that, so a batch does not
    wait for memory it cannot get; what loads already waiting can use stays theirs (`free_for_loads`; pushes
    have memory of their own)."""
    now = min(want, pool.free_for_loads)
    got = pool.try_take(now, LOAD) if now else None
    if got is None:
        got = await pool.take(1, LOAD)
        more = min(want - 1, pool.free_for_loads)
        if more:
            got += pool.try_take(more, LOAD) or []
    for buf in got:
        buf.set_recycler(recycler)
    return got


class PieceLoader:
    """Loads one reader's batches, keeping the file of the last one open for the next (a reader goes
    through a file front to back). `close` when done."""

    __slots__ = ("_fd", "_path", "at_rest", "disk", "objects")

    def __init__(
        self, disk: Disk | None, objects: ObjectStore | None = None, at_rest: AtRestKeys | None = None
    ) -> None:
        self.disk = disk
        self.objects = objects
        #: opens sealed pieces (at_rest.py)
        self.at_rest = at_rest
        self._fd: int | None = None
        self._path = ""

    async def load(self, out: MapOutput, batch: Sequence[int], buffers: Sequence[Buffer]) -> list[Buffer]:
        """The first `len(buffers)` pieces of `batch` (a `run` of `out`'s) read into `buffers` and checked."""
        batch = batch[: len(buffers)]
        for buf, i in zip(buffers, batch, strict=True):
            buf.length = out.sizes[i]
        loaded = False
        try:
            if out.places[batch[0]] == FILE:
                crcs, where = await self._from_file(out, batch, buffers)
            else:
                crcs, where = await self._from_object(out, batch, buffers)
            bad = [i for i, crc in zip(batch, crcs, strict=True) if out.crcs[i] != crc]
            if bad:
                data = out.shuffle
                raise CorruptData(
                    f"stored data of map attempt {out.attempt} of {data.app}/{data.shuffle} failed its CRC32C "
                    f"check at offset {out.offsets[bad[0]]} of {where}"
                )
            loaded = True
        finally:
            if not loaded:
                for buf in buffers:
                    buf.release()
        return list(buffers)

    async def _from_file(
        self, out: MapOutput, batch: Sequence[int], buffers: Sequence[Buffer]
    ) -> tuple[list[int], str]:
        data = out.shuffle
        assert self.disk is not None and data.file is not None, "only a data dir holds pieces in a file"
        path = data.file.path
        if self._path != path:
            self.close()
        fd, self._fd = self._fd, None  # a failed read closes it
        data.loading += 1
        unseal = piece_opener(self.at_rest, data.key_id, data, [(out, i) for i in batch])
        reading = self.disk.read(fd, path, out.offsets[batch[0]], [b.data() for b in buffers], unseal)
        try:
            self._fd, crcs = await asyncio.shield(reading)
            self._path = path
            stats = self.disk.stats
            stats.loads += 1
            stats.loaded_bytes += sum([b.length for b in buffers])
            return crcs, path
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # the thread fills the segments until it is done
                os.close((await reading)[0])
            raise
        except FileNotFoundError:
            raise PartitionNotFound(f"spill file {path} is gone (shuffle removed meanwhile?)") from None
        except (OSError, EOFError) as exc:
            raise CorruptData(f"reading spilled data from {path} failed: {exc}") from None
        finally:
            data.loading -= 1

    async def _from_object(
        self, out: MapOutput, batch: Sequence[int], buffers: Sequence[Buffer]
    ) -> tuple[list[int], str]:
        """One ranged GET of the run; the client copies into the segments on this thread, so a cancelled load
        leaves nothing writing into them."""
        data = out.shuffle
        stored = data.objects[out.places[batch[0]] - 1]
        key = stored.key
        if self.objects is None:
            raise CorruptData(f"pieces of {data.app}/{data.shuffle} are in object {key}, and no object store is set")
        views = [b.data() for b in buffers]
        try:
            await self.objects.read_into(key, out.offsets[batch[0]], views)
        except ObjectNotFound:
            raise PartitionNotFound(f"object {key} is gone (shuffle removed meanwhile?)") from None
        except StorageError as exc:
            raise CorruptData(f"reading stored data failed: {exc.message}") from None
        unseal = piece_opener(self.at_rest, stored.kid, data, [(out, i) for i in batch])
        if unseal is not None:
            await off_loop(lambda: unseal(views, None))
        return [checksum(v) for v in views], f"object {key}"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._path = ""


def piece_opener(
    keys: AtRestKeys | None, kid: str | None, data: ShuffleData, pieces: list[tuple[MapOutput, int]]
) -> Opener | None:
    """What opens these pieces of the shuffle where they lie sealed with key `kid` (None: not sealed there)."""
    if kid is None:
        return None
    assert keys is not None  # restore and adoption refuse data sealed with a key not given
    return keys.opener(kid, data.app, data.shuffle, piece_ids(pieces), [out.seals[i] for out, i in pieces])


async def read_back(
    disk: Disk, data: ShuffleData, offset: int, views: list[memoryview], crcs: list[int], unseal: Opener | None
) -> None:
    """Pieces lying back to back in the shuffle's data file from `offset`, read into `views` (memory of a tier
    write's own, not the pool's: at most an object's worth, for as long as its upload takes), opened by
    `unseal` when sealed, and checked against `crcs`, while the shuffle counts the load (its blocks are not
    punched under it). Raises StorageError when the read fails (the upload is tried again) and CorruptData
    for a piece that changed."""
    assert data.file is not None
    data.loading += 1
    try:
        fd, got = await disk.read(None, data.file.path, offset, views, unseal)
        os.close(fd)
    except (OSError, EOFError) as exc:
        raise StorageError(f"reading spilled data of {data.app}/{data.shuffle} back failed: {exc}") from None
    finally:
        data.loading -= 1
    if got != crcs:
        raise CorruptData(f"spilled data of {data.app}/{data.shuffle} failed its CRC32C check on its way up")
