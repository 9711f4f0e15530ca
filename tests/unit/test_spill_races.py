"""Races between a spill's write (on the disk's writer thread) and the event loop, in one process with
a real pool and real files: the writer thread is held at a gate so the race happens every time."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from shuffled.buffers import GlobalPool
from shuffled.protocol.integrity import checksum
from shuffled.server.disk import Disk
from shuffled.server.spill import IN_FLIGHT, Spiller
from shuffled.server.store import DiskChunk, MapOutput, Store
from tests.turns import until

pytestmark = pytest.mark.asyncio

SEGMENT = 32 << 10


def _setup(tmp_path: Path) -> tuple[GlobalPool, Store, Disk, Spiller]:
    pool = GlobalPool(64 * SEGMENT, SEGMENT)
    store = Store(SEGMENT)
    store.can_spill = True
    disk = Disk(str(tmp_path))
    return pool, store, disk, Spiller(store, pool, disk, 0.85, 0.7)


def _push(pool: GlobalPool, store: Store, attempt: int, chunks: int) -> MapOutput:
    out = store.open_map_output("app", 1, attempt, attempt, 2)
    for i in range(chunks):
        (buf,) = pool.try_take(1) or []
        buf.set_recycler(pool.give)
        buf.memory[:100] = bytes([attempt]) * 100
        buf.length = 100
        store.add(out, i % 2, buf, checksum(buf.data()))
    return out


async def _spill_while_held(disk: Disk, spiller: Spiller, store: Store) -> tuple[asyncio.Task[int], threading.Event]:
    """Start a spill of the largest partition with the writer thread blocked in front of it."""
    gate = threading.Event()
    disk._writer.submit(gate.wait, 10)
    found = store.largest_in_memory()
    assert found is not None
    task = asyncio.create_task(spiller.spill(*found))
    await asyncio.sleep(0)  # the spill took its chunks and queued its write behind the gate
    return task, gate


async def test_abort_during_a_spill_frees_every_segment_and_serves_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        pool, store, disk, spiller = _setup(tmp_path)
        out = _push(pool, store, 7, 10)
        task, gate = await _spill_while_held(disk, spiller, store)
        store.abort(out)
        assert pool.used == 5, "the write still holds the segments it is writing"
        gate.set()
        assert await task == 500
        assert pool.used == 0 and store.stats().stored_segments == store.memory_segments == 0
        assert store.snapshot("app", 1, 0, 2, [], digest=b"") == ([], 0)
        disk.close()

    await asyncio.wait_for(body(), 30)


async def test_unregister_during_a_spill_deletes_the_files_after_the_write(tmp_path: Path) -> None:
    async def body() -> None:
        pool, store, disk, spiller = _setup(tmp_path)
        out = _push(pool, store, 3, 8)
        store.commit(out)
        task, gate = await _spill_while_held(disk, spiller, store)
        freed, dropped = store.unregister_shuffle("app", 1)
        assert freed == 8
        removal = asyncio.create_task(spiller.removed(dropped))
        gate.set()
        await task
        await removal
        assert pool.used == 0
        assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["LOCK"]
        assert disk.stats.used_bytes == 0 and disk.stats.files == 0
        disk.close()

    await asyncio.wait_for(body(), 30)


async def test_push_during_a_spill_lands_after_the_spilled_prefix(tmp_path: Path) -> None:
    """Chunks pushed while their partition is being written stay in memory, after it in read order."""

    async def body() -> None:
        pool, store, disk, spiller = _setup(tmp_path)
        out = _push(pool, store, 5, 4)
        task, gate = await _spill_while_held(disk, spiller, store)
        (buf,) = pool.try_take(1) or []
        buf.set_recycler(pool.give)
        buf.memory[:3] = b"new"
        buf.length = 3
        store.add(out, 0, buf, checksum(buf.data()))
        gate.set()
        await task
        store.commit(out)
        assert store.memory_segments == store.stats().stored_segments == 3  # partition 1 and the new chunk
        items, on_disk = store.snapshot("app", 1, 0, 1, [5], digest=b"")
        assert on_disk == 2 and len(items) == 3
        assert [type(i).__name__ for i in items] == ["DiskChunk", "DiskChunk", "Chunk"]
        for item in items[2:]:
            item.buffer.release()  # type: ignore[union-attr]
        disk.close()

    await asyncio.wait_for(body(), 30)


async def test_commit_during_a_spill_serves_the_chunks_from_the_file(tmp_path: Path) -> None:
    """Chunks committed while being written are served from memory until the write is done, then from disk."""

    async def body() -> None:
        pool, store, disk, spiller = _setup(tmp_path)
        out = _push(pool, store, 9, 6)
        task, gate = await _spill_while_held(disk, spiller, store)
        store.commit(out)
        before, on_disk = store.snapshot("app", 1, 0, 1, [9], digest=b"")
        assert on_disk == 0 and len(before) == 3
        for item in before:
            item.buffer.release()  # type: ignore[union-attr]
        gate.set()
        await task
        after, on_disk = store.snapshot("app", 1, 0, 2, [9], digest=b"")
        assert on_disk == 3 and [type(i).__name__ for i in after] == ["DiskChunk"] * 3 + ["Chunk"] * 3
        assert [i.offset for i in after[:3]] == [0, 100, 200]  # type: ignore[union-attr]
        for item in after[3:]:
            item.buffer.release()  # type: ignore[union-attr]
        assert pool.used == store.memory_segments == 3
        disk.close()

    await asyncio.wait_for(body(), 30)


async def test_a_spill_cancelled_during_its_write_still_completes(tmp_path: Path) -> None:
    """A flush cut short (e.g. at stop) must not lose the chunks it took: they end up in the file."""

    async def body() -> None:
        pool, store, disk, spiller = _setup(tmp_path)
        out = _push(pool, store, 4, 4)
        store.commit(out)
        task, gate = await _spill_while_held(disk, spiller, store)
        task.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await disk.sync()  # the write is done, and its bookkeeping ran before this returns
        items, on_disk = store.snapshot("app", 1, 0, 2, [4], digest=b"")
        assert on_disk == 2 and pool.used == store.memory_segments == 2
        for item in items[2:]:
            item.buffer.release()  # type: ignore[union-attr]
        disk.close()

    await asyncio.wait_for(body(), 30)


async def test_memory_changed_since_the_push_is_not_hidden_by_a_spill(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The journal keeps the CRC32C the writer sent, not one of the bytes as they are when spilled: a chunk
    that changed in memory fails its check when read back, and the spill logs the corruption."""

    async def body() -> None:
        pool, store, disk, spiller = _setup(tmp_path)
        out = _push(pool, store, 6, 2)
        store.commit(out)
        chunk = store.apps["app"][1].subpartitions[0].chunks[0]
        pushed_crc = chunk.crc
        assert chunk.buffer is not None
        chunk.buffer.memory[10] ^= 0xFF  # a bit flip in RAM after the push was checked
        found = store.largest_in_memory()
        assert found is not None
        with caplog.at_level("ERROR", logger="shuffled.server.spill"):
            await spiller.spill(*found)
        assert any("memory corruption" in r.getMessage() for r in caplog.records)
        items, on_disk = store.snapshot("app", 1, 0, 1, [6], digest=b"")
        assert on_disk == 1 and isinstance(items[0], DiskChunk) and items[0].crc == pushed_crc
        with open(items[0].path, "rb") as f:
            f.seek(items[0].offset)
            assert checksum(f.read(items[0].length)) != pushed_crc  # so the read fails with CORRUPT_DATA
        disk.close()

    await asyncio.wait_for(body(), 30)


def _fill(pool: GlobalPool, store: Store, attempts: int, partitions: int, segments: int) -> list[MapOutput]:
    """`segments` chunks round-robin over the attempts and partitions; each chunk says what it is
    (attempt, partition, sequence within the pair), so a read shows where every byte went."""
    outs = [store.open_map_output("app", 1, a, a, partitions) for a in range(1, attempts + 1)]
    for i in range(segments):
        out, p = outs[i % attempts], (i // attempts) % partitions
        (buf,) = pool.try_take(1) or []
        buf.set_recycler(pool.give)
        tag = f"{out.attempt}/{p}/{out.lengths.get(p, 0) // 100}".encode().ljust(100, b".")
        buf.memory[:100] = tag
        buf.length = 100
        store.add(out, p, buf, checksum(buf.data()))
    return outs


def _tags(store: Store, partition: int, attempts: list[int]) -> list[bytes]:
    """What a read of one partition serves, chunk by chunk, from disk or memory."""
    items, _ = store.snapshot("app", 1, partition, partition + 1, attempts, digest=b"")
    got = []
    for item in items:
        if isinstance(item, DiskChunk):
            with open(item.path, "rb") as f:
                f.seek(item.offset)
                got.append(f.read(item.length).rstrip(b"."))
        else:
            got.append(bytes(item.buffer.data()).rstrip(b"."))
            item.buffer.release()
    return got


async def test_pressure_keeps_several_writes_queued_and_each_partition_in_push_order(tmp_path: Path) -> None:
    """Above the high watermark the spiller queues IN_FLIGHT writes on the writer thread at once, one per
    partition; once they are done every pair reads back in push order and no segment is lost."""

    async def body() -> None:
        pool = GlobalPool(1024 * SEGMENT, SEGMENT)  # room between the watermarks for IN_FLIGHT batches
        store = Store(SEGMENT)
        store.can_spill = True
        disk = Disk(str(tmp_path))
        spiller = Spiller(store, pool, disk, 0.85, 0.5)
        outs = _fill(pool, store, 3, 6, spiller.high)
        gate = threading.Event()
        disk._writer.submit(gate.wait, 10)
        spiller.check()
        await until(lambda: len(spiller._writing) == IN_FLIGHT)
        assert spiller.paused and spiller.leaving == IN_FLIGHT * spiller.batch
        assert len({w.data.shuffle for w in spiller._writing.values()}) == 1 and len(spiller._writing) == IN_FLIGHT
        gate.set()
        task = spiller._task
        assert task is not None
        await task
        assert not spiller.paused and not spiller._writing and spiller.leaving == 0
        assert pool.used == store.memory_segments <= spiller.low
        assert disk.stats.spills > IN_FLIGHT  # it went on writing after the first ones ended
        for out in outs:
            store.commit(out)
        for p in range(6):
            for a in (1, 2, 3):
                want = [f"{a}/{p}/{i}".encode() for i in range(len(_tags(store, p, [a])))]
                assert _tags(store, p, [a]) == want
        assert store.stats().stored_segments == store.memory_segments
        _, dropped = store.unregister_shuffle("app", 1)
        await spiller.removed(dropped)
        assert pool.used == 0 and disk.stats.used_bytes == 0
        disk.close()

    await asyncio.wait_for(body(), 30)


async def test_pushes_resume_while_the_memory_they_need_is_being_written(tmp_path: Path) -> None:
    """Push credit comes back as soon as the writes under way will bring usage below the low watermark,
    not when they are done."""

    async def body() -> None:
        pool = GlobalPool(256 * SEGMENT, SEGMENT)
        store = Store(SEGMENT)
        store.can_spill = True
        disk = Disk(str(tmp_path))
        spiller = Spiller(store, pool, disk, 0.85, 0.8)
        _fill(pool, store, 2, 4, spiller.high)
        gate = threading.Event()
        disk._writer.submit(gate.wait, 10)
        spiller.check("app")
        assert spiller.holding("app")
        await asyncio.wait_for(spiller.admitted("app"), 5)
        assert pool.used == spiller.high, "nothing was written yet"
        assert spiller._writing and pool.used - spiller.leaving <= spiller.low
        gate.set()
        task = spiller._task
        assert task is not None
        await task
        assert pool.used == store.memory_segments <= spiller.low
        disk.close()

    await asyncio.wait_for(body(), 30)


async def test_one_failed_write_among_queued_ones_fails_only_its_partition(tmp_path: Path) -> None:
    """A write that fails while others wait behind it puts its chunks back in memory in push order and fails
    the open map outputs that had data in it; the others land, no more are queued (the disk is failing),
    pushes are let go, and every segment comes back."""

    async def body() -> None:
        pool = GlobalPool(1024 * SEGMENT, SEGMENT)  # room between the watermarks for IN_FLIGHT batches
        store = Store(SEGMENT)
        store.can_spill = True
        disk = Disk(str(tmp_path))
        spiller = Spiller(store, pool, disk, 0.85, 0.5)
        outs = _fill(pool, store, 1, 4, spiller.high)
        failed: list[object] = []
        outs[0].on_failure = failed.append
        os.makedirs(disk.data_path(disk.shuffle_dir("app", 1), 2))  # a directory: opening it to write fails
        gate = threading.Event()
        disk._writer.submit(gate.wait, 10)
        spiller.check()
        await until(lambda: len(spiller._writing) == IN_FLIGHT)
        sub = store.apps["app"][1].subpartitions[2]
        gate.set()
        task = spiller._task
        assert task is not None
        await task
        assert [type(e).__name__ for e in failed] == ["StorageError"]
        assert disk.stats.spills >= IN_FLIGHT - 1 and disk.stats.errors == 1  # more if one ended before it
        assert len(sub.spilled) == 0 and sub.memory_segments == len(sub.memory) > 0
        assert not spiller.paused and not spiller._writing and spiller.leaving == 0
        assert [bytes(c.buffer.data()).rstrip(b".") for c in sub.memory if c.buffer] == [
            f"1/2/{i}".encode() for i in range(len(sub.memory))
        ]
        spiller.check()  # backing off: nothing is queued
        assert spiller._task is None
        store.abort(outs[0])
        assert pool.used == 0 and store.memory_segments == 0
        disk.close()

    await asyncio.wait_for(body(), 30)


async def test_a_flush_waits_for_the_partitions_write_under_way(tmp_path: Path) -> None:
    """A flush of a partition whose earlier chunks are being written returns only when those and the ones
    pushed since are in the file, in push order."""

    async def body() -> None:
        pool, store, disk, spiller = _setup(tmp_path)
        out = _push(pool, store, 5, 4)
        task, gate = await _spill_while_held(disk, spiller, store)
        data = store.apps["app"][1]
        (buf,) = pool.try_take(1) or []
        buf.set_recycler(pool.give)
        buf.memory[:3] = b"new"
        buf.length = 3
        store.add(out, 0, buf, checksum(buf.data()))
        flush = asyncio.create_task(spiller.flush([data]))
        gate.set()
        assert await flush == 200 + 3
        assert store.memory_segments == 0 and task.done()
        store.commit(out)
        items, on_disk = store.snapshot("app", 1, 0, 1, [5], digest=b"")
        assert on_disk == 3 and [i.offset for i in items] == [0, 100, 200]  # type: ignore[union-attr]
        disk.close()

    await asyncio.wait_for(body(), 30)


async def test_a_spill_after_the_writer_stopped_leaves_the_chunks_in_memory(tmp_path: Path) -> None:
    """A write that cannot even be queued (the writer thread is shut down) gives back the references it took."""

    async def body() -> None:
        pool, store, disk, spiller = _setup(tmp_path)
        out = _push(pool, store, 2, 4)
        disk.close()
        found = store.largest_in_memory()
        assert found is not None
        with pytest.raises(RuntimeError):
            await spiller.spill(*found)
        assert not spiller._writing and spiller.leaving == 0
        assert len(found[1].memory) == found[1].memory_segments == 2
        store.abort(out)
        assert pool.used == 0

    await asyncio.wait_for(body(), 30)
