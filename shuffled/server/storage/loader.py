"""Reading spilled chunks back into pool segments: the one loader of a subpartition reader, of a read's
local channel and of a drain's hand-over.

A batch is a run of spilled chunks that lie back to back in one file (`run`), read with one
`preadv` into segments of the read reserve (`take`) and each checked against the CRC32C it was
spilled with. A file that is gone (its shuffle was removed meanwhile) is PARTITION_NOT_FOUND, a read
that fails or a checksum that differs is CORRUPT_DATA; on any failure the segments go back to their
pool. A load cancelled while the reading thread fills its segments lets the thread finish first: a
segment goes back only once nothing writes into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable, Sequence

from ...buffers import Buffer, Chunk, GlobalPool
from ...protocol.errors import CorruptData, PartitionNotFound
from .disk import Disk
from .store import DiskChunk


def run(items: Iterable[Chunk | DiskChunk], limit: int) -> list[DiskChunk]:
    """The spilled chunks at the head of `items` that lie back to back in one file, at most `limit` of them."""
    batch: list[DiskChunk] = []
    for item in items:
        if not isinstance(item, DiskChunk) or len(batch) >= limit:
            break
        if batch and (item.path != batch[-1].path or item.offset != batch[-1].offset + batch[-1].length):
            break
        batch.append(item)
    return batch


async def take(pool: GlobalPool, want: int, recycler: Callable[[Buffer], None]) -> list[Buffer]:
    """Up to `want` segments of the read reserve, counted when they are taken: whatever is free then (a
    reader's credit may exceed what a small or busy pool can give at once), else one, waited for in turn
    (the reserve guarantees it in time), plus what the wait left free. Never more than is free, so a batch
    does not wait for memory it cannot get; what requests already waiting can use stays theirs
    (`free_for_readers`: a waiting push leaves the reserve to reads)."""
    now = min(want, pool.free_for_readers)
    got = pool.try_take(now, use_reserve=True) if now else None
    if got is None:
        got = await pool.take(1, use_reserve=True)
        more = min(want - 1, pool.free_for_readers)
        if more:
            got += pool.try_take(more, use_reserve=True) or []
    for buf in got:
        buf.set_recycler(recycler)
    return got


class ChunkLoader:
    """Loads one reader's batches, keeping the file of the last one open for the next (a reader goes
    through a file front to back). `close` when done."""

    __slots__ = ("_fd", "_path", "disk")

    def __init__(self, disk: Disk | None) -> None:
        self.disk = disk
        self._fd: int | None = None
        self._path = ""

    async def load(self, batch: Sequence[DiskChunk], buffers: Sequence[Buffer]) -> list[Chunk]:
        """`batch`, a `run`, read into `buffers` (one each) and checked; the chunks now in memory."""
        assert self.disk is not None, "only a daemon with a data dir has spilled chunks"
        path = batch[0].path
        if self._path != path:
            self.close()
        fd, self._fd = self._fd, None  # a failed read closes it
        for buf, chunk in zip(buffers, batch, strict=True):
            buf.length = chunk.length
        reading = self.disk.read(fd, path, batch[0].offset, [b.data() for b in buffers])
        loaded = False
        try:
            self._fd, crcs = await asyncio.shield(reading)
            self._path = path
            bad = [c for c, crc in zip(batch, crcs, strict=True) if c.crc != crc]
            if bad:
                raise CorruptData(
                    f"spilled data of partition {bad[0].partition} (map attempt {bad[0].attempt}) failed its "
                    f"CRC32C check at offset {bad[0].offset} of {path}"
                )
            loaded = True
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # the thread fills the segments until it is done
                os.close((await reading)[0])
            raise
        except FileNotFoundError:
            raise PartitionNotFound(f"spill file {path} is gone (shuffle removed meanwhile?)") from None
        except (OSError, EOFError) as exc:
            raise CorruptData(f"reading spilled data from {path} failed: {exc}") from None
        finally:
            if not loaded:
                for buf in buffers:
                    buf.release()
        return [Chunk(buf, c.partition, c.attempt, c.crc) for buf, c in zip(buffers, batch, strict=True)]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._path = ""
