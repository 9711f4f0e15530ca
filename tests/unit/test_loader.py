"""The one loader of spilled pieces (storage/loader.py): a batch is pieces back to back in the file, it takes
the segments free when it takes them, a bad or missing file fails the load with the error its reader gets
and gives every segment back, and a load cancelled mid-read gives its segments back only once the reading
thread is done with them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuffled.buffers import FRAME, LOAD, GlobalPool
from shuffled.protocol.errors import CorruptData, PartitionNotFound
from shuffled.protocol.integrity import checksum
from shuffled.server.storage.disk import Disk, SpillFile
from shuffled.server.storage.loader import PieceLoader, run, take
from shuffled.server.storage.shuffles import MapOutput
from shuffled.server.storage.store import Store
from tests.aio import within
from tests.pieces import pack
from tests.turns import until

SEG = 4096
TIMEOUT = 10


def _spilled(tmp_path: Path, *pieces: bytes, gap_after: int = -1) -> MapOutput:
    """An attempt whose pieces lie in a data file in this order (another attempt's bytes after piece
    `gap_after`), as the store lists a spilled attempt."""
    store = Store(SEG)
    out = store.open_map_output("app", 0, 0, 1, 8)
    path = str(tmp_path / "data")
    offset = 0
    with open(path, "wb") as f:
        for i, piece in enumerate(pieces):
            f.write(piece)
            out.firsts.append(i)
            out.lasts.append(i)
            out.sizes.append(len(piece))
            out.crcs.append(checksum(piece))
            out.offsets.append(offset)
            out.places.append(0)
            offset += len(piece)
            if i == gap_after:
                f.write(b"-" * 7)
                offset += 7
    out.spilled = out.placed = out.taken = len(pieces)
    out.shuffle.file = SpillFile(path, offset)
    return out


def _pieces(n: int) -> list[bytes]:
    return [pack(1, [(i, bytes([97 + i]) * (100 * (i + 1)))]) for i in range(n)]


def test_a_run_is_back_to_back_in_one_file(tmp_path: Path) -> None:
    out = _spilled(tmp_path, *_pieces(4), gap_after=1)
    assert run(out, [0, 0, 1, 2, 3], 16) == [0, 1], "a gap ends the run; a piece repeated is taken once"
    assert run(out, [2, 3], 16) == [2, 3]
    assert run(out, [0, 2], 16) == [0], "a piece skipped ends the run"
    assert run(out, [2, 3], 1) == [2]
    out.spilled = 3
    assert run(out, [2, 3], 16) == [2], "a piece in memory ends the run"


@contextlib.contextmanager
def _loader(tmp_path: Path) -> Iterator[tuple[GlobalPool, PieceLoader]]:
    pool = GlobalPool(8 * SEG, SEG, reserve=4)
    disk = Disk(str(tmp_path / "dir"))
    loader = PieceLoader(disk)
    try:
        yield pool, loader
    finally:
        loader.close()
        disk.close()


@within(TIMEOUT)
async def test_a_load_checks_every_piece_and_keeps_its_file_open(tmp_path: Path) -> None:
    with _loader(tmp_path) as (pool, loader):
        pieces = _pieces(2)
        out = _spilled(tmp_path, *pieces)
        got = await loader.load(out, [0, 1], await take(pool, 2, pool.give))
        assert [bytes(b.data()) for b in got] == pieces
        assert loader._fd is not None, "the next batch of the same file needs no open"
        for b in got:
            b.release()
        assert pool.free == 8


@within(30)
async def test_a_bad_checksum_or_a_missing_file_fails_and_gives_the_segments_back(tmp_path: Path) -> None:
    with _loader(tmp_path) as (pool, loader):
        out = _spilled(tmp_path, *_pieces(2))
        out.crcs[1] ^= 1
        with pytest.raises(CorruptData, match=f"failed its CRC32C check at offset {out.offsets[1]}"):
            await asyncio.wait_for(loader.load(out, [0, 1], await take(pool, 2, pool.give)), TIMEOUT)
        assert pool.free == 8
        assert out.shuffle.file is not None
        os.unlink(out.shuffle.file.path)
        loader.close()
        with pytest.raises(PartitionNotFound, match="is gone"):
            await asyncio.wait_for(loader.load(out, [0], await take(pool, 1, pool.give)), TIMEOUT)
        assert pool.free == 8


@within(30)
async def test_a_cancelled_load_gives_its_segments_back_once_the_thread_is_done(tmp_path: Path) -> None:
    pool = GlobalPool(8 * SEG, SEG, reserve=4)
    disk = Disk(str(tmp_path / "dir"), read_threads=1)
    gate = threading.Event()
    try:
        busy = asyncio.get_running_loop().run_in_executor(disk._readers, gate.wait, TIMEOUT)
        out = _spilled(tmp_path, *_pieces(1))
        loading = asyncio.ensure_future(PieceLoader(disk).load(out, [0], await take(pool, 1, pool.give)))
        await until(lambda: disk._readers._work_queue.qsize() == 1)  # the read waits behind `busy`
        loading.cancel()
        with pytest.raises(AssertionError):
            await until(loading.done, turns=20)
        assert pool.free == 7, "the segment is the reading thread's until it is done"
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(loading, TIMEOUT)
        assert pool.free == 8
        await busy
    finally:
        gate.set()
        disk.close()


@within(30)
async def test_batch_takes_what_is_free_when_memory_is_taken() -> None:
    """Short of memory, a batch takes the one segment free instead of waiting for all it wanted; when it
    had to wait, it takes what the wait freed, not only the one it waited for."""
    pool = GlobalPool(16 * SEG, SEG, reserve=8)  # loads may hold 7 segments, frames the last one too
    held = pool.try_take(6, FRAME)
    assert held is not None
    got = await asyncio.wait_for(take(pool, 4, pool.give), TIMEOUT)
    assert len(got) == 1, "a batch must not wait for memory that is not free"
    assert pool.free_for_loads == 0 and pool.free == 9, "readers hold the reserve less a frame's, pushes the rest"
    later = asyncio.ensure_future(take(pool, 4, pool.give))
    await until(lambda: pool.waiting == 1)  # the batch runs up to its wait
    assert not later.done()
    for buf in held[:5]:
        pool.give(buf)
    refilled = await asyncio.wait_for(later, TIMEOUT)
    assert len(refilled) == 4, "after the wait the batch takes what memory freed meanwhile"
    assert pool.free_for_loads == 1
    for buf in [*got, *refilled]:
        pool.give(buf)
    assert pool.reading == 1 and pool.free == 15


@within(30)
async def test_a_waiting_push_leaves_the_reserve_to_a_batch() -> None:
    """Pushes never use the read reserve, so one waiting for memory does not shrink a read's batch
    to one segment (a cold read under push back-pressure would pay a thread hand-off per segment); a
    waiting reader does keep what is free."""
    pool = GlobalPool(32 * SEG, SEG, reserve=8)
    pushed = pool.try_take(24)  # all push memory
    held = pool.try_take(2, FRAME)
    assert pushed is not None and held is not None and pool.free == 6
    push = pool.take_later(4)
    assert not push.done() and pool.waiting == 1
    got = await asyncio.wait_for(take(pool, 16, pool.give), TIMEOUT)
    assert len(got) == 5, "the free reserve (less the frames' last eighth) is the loads' while only pushes wait"
    reader = pool.take_later(1, LOAD)
    pool.give(got.pop())
    assert reader.done(), "a waiting reader is served first"
    pool.give(got.pop())
    rest = await asyncio.wait_for(take(pool, 16, pool.give), TIMEOUT)
    assert len(rest) == 1, "what is free inside the reserve, not a wait for all 16"
    push.cancel()
    for buf in [*got, *rest, *held, *pushed, *reader.result()]:
        pool.give(buf)
    assert pool.free == 32 and pool.floating == 0
