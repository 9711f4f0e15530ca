"""Reading spilled pieces back into pool segments: the one loader of a read's plan feed (a local read,
a failover to this daemon's own copy) and of a drain's hand-over.

A batch is a run of one attempt's spilled pieces that lie back to back in its shuffle's data file
(`run`), read with one `preadv` into segments of the read reserve (`take`), each checked against the
CRC32C its writer sent. A file that is gone (its shuffle was removed meanwhile) is
PARTITION_NOT_FOUND, a read that fails or a checksum that differs is CORRUPT_DATA; on any failure the
segments go back to their pool. A load cancelled while the reading thread fills its segments lets the
thread finish first: a segment goes back only once nothing writes into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable, Sequence

from ...buffers import Buffer, GlobalPool
from ...protocol.errors import CorruptData, PartitionNotFound
from .disk import Disk
from .store import MapOutput


def run(out: MapOutput, indices: Iterable[int], limit: int) -> list[int]:
    """The first of `indices` (a spilled piece of `out`) and those after it that lie right behind it in the
    file, at most `limit` of them; an index repeated (a piece several items use) is taken once."""
    batch: list[int] = []
    for i in indices:
        if batch and i == batch[-1]:
            continue
        if len(batch) >= limit or i >= out.spilled:
            break
        if batch and (i != batch[-1] + 1 or out.offsets[i] != out.offsets[i - 1] + out.sizes[i - 1]):
            break
        batch.append(i)
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


class PieceLoader:
    """Loads one reader's batches, keeping the file of the last one open for the next (a reader goes
    through a file front to back). `close` when done."""

    __slots__ = ("_fd", "_path", "disk")

    def __init__(self, disk: Disk | None) -> None:
        self.disk = disk
        self._fd: int | None = None
        self._path = ""

    async def load(self, out: MapOutput, batch: Sequence[int], buffers: Sequence[Buffer]) -> list[Buffer]:
        """The first `len(buffers)` pieces of `batch` (a `run` of `out`'s) read into `buffers` and checked."""
        assert self.disk is not None and out.shuffle.file is not None, "only a data dir holds spilled pieces"
        path = out.shuffle.file.path
        if self._path != path:
            self.close()
        fd, self._fd = self._fd, None  # a failed read closes it
        batch = batch[: len(buffers)]
        for buf, i in zip(buffers, batch, strict=True):
            buf.length = out.sizes[i]
        reading = self.disk.read(fd, path, out.offsets[batch[0]], [b.data() for b in buffers])
        loaded = False
        try:
            self._fd, crcs = await asyncio.shield(reading)
            self._path = path
            bad = [i for i, crc in zip(batch, crcs, strict=True) if out.crcs[i] != crc]
            if bad:
                data = out.shuffle
                raise CorruptData(
                    f"spilled data of map attempt {out.attempt} of {data.app}/{data.shuffle} failed its CRC32C "
                    f"check at offset {out.offsets[bad[0]]} of {path}"
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
        return list(buffers)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._path = ""
