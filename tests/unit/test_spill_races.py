"""Races between a spill's write (on the disk's writer thread) and the event loop, in one process with
a real pool and real files: the writer thread is held at a gate so the race happens every time."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from shuffled.buffers import GlobalPool
from shuffled.protocol.integrity import checksum
from shuffled.server.storage import disk_space
from shuffled.server.storage.at_rest import Sealer
from shuffled.server.storage.disk import Appended, Disk
from shuffled.server.storage.plan import make_plan
from shuffled.server.storage.shuffles import MapOutput
from shuffled.server.storage.spill import IN_FLIGHT, Spiller
from shuffled.server.storage.store import Store
from tests.aio import within
from tests.pieces import pack, push, serve, unpack
from tests.turns import until

SEGMENT = 32 << 10
#: every piece these tests push: 12 + 8 header bytes and 80 of data
PIECE = 100


def _setup(tmp_path: Path) -> tuple[GlobalPool, Store, Disk, Spiller]:
    pool = GlobalPool(64 * SEGMENT, SEGMENT, reserve=8)
    store = Store(SEGMENT, can_spill=True)
    disk = Disk(str(tmp_path))
    return pool, store, disk, Spiller(store, pool, disk, 0.85, 0.7)


def _piece(attempt: int, partition: int, tag: bytes) -> bytes:
    return pack(attempt, [(partition, tag.ljust(PIECE - 20, b"."))])


def _push(pool: GlobalPool, store: Store, attempt: int, pieces: int, partitions: int = 2) -> MapOutput:
    """`pieces` pieces of one run each, partition by partition in turn, each saying what it is."""
    out = store.open_map_output("app", 1, attempt, attempt, partitions)
    for i in range(pieces):
        push(pool, store, out, _piece(attempt, i % partitions, f"{attempt}/{i % partitions}/{i}".encode()))
    return out


async def _read(
    pool: GlobalPool, store: Store, disk: Disk, attempts: list[int], lo: int = 0, hi: int = 2
) -> list[bytes]:
    """The runs a read serves, in order, their padding cut."""
    payloads = await serve(pool, disk, make_plan(store, "app", 1, lo, hi, attempts, digest=b""))
    return [data.rstrip(b".") for payload in payloads for _, _, data in unpack(payload)]


async def _spill_while_held(disk: Disk, spiller: Spiller, store: Store) -> tuple[asyncio.Task[int], threading.Event]:
    """Start a spill of the shuffle with the writer thread blocked in front of it."""
    gate = threading.Event()
    disk._writer.submit(gate.wait, 10)
    task = asyncio.create_task(spiller.spill(store.apps["app"][1]))
    await asyncio.sleep(0)  # the spill took its pieces and queued its write behind the gate
    return task, gate


@within(30)
async def test_abort_during_a_spill_frees_every_segment_and_serves_nothing(tmp_path: Path) -> None:
    pool, store, disk, spiller = _setup(tmp_path)
    out = _push(pool, store, 7, 10)
    task, gate = await _spill_while_held(disk, spiller, store)
    store.abort(out)
    assert pool.used == 10, "the write still holds the segments it is writing"
    gate.set()
    assert await task == 10 * PIECE
    assert pool.used == 0 and store.stats().stored_segments == store.memory_segments == 0
    assert store.placement.garbage and sum(g.length for g in store.placement.garbage) == 10 * PIECE  # punched later
    assert make_plan(store, "app", 1, 0, 2, [], digest=b"").entries == []
    disk.close()


@within(30)
async def test_unregister_during_a_spill_deletes_the_files_after_the_write(tmp_path: Path) -> None:
    pool, store, disk, spiller = _setup(tmp_path)
    out = _push(pool, store, 3, 8)
    store.commit(out)
    task, gate = await _spill_while_held(disk, spiller, store)
    freed, dropped = store.unregister_shuffle("app", 1)
    assert freed == 8
    removal = asyncio.create_task(disk_space.removed(disk, dropped))
    gate.set()
    await task
    await removal
    assert pool.used == 0
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["LOCK"]
    assert disk.stats.used_bytes == 0 and disk.stats.files == 0
    disk.close()


@within(30)
async def test_push_during_a_spill_lands_after_the_spilled_prefix(tmp_path: Path) -> None:
    """Pieces pushed while their attempt is being written stay in memory, after it in read order."""

    pool, store, disk, spiller = _setup(tmp_path)
    out = _push(pool, store, 5, 4, partitions=1)
    task, gate = await _spill_while_held(disk, spiller, store)
    push(pool, store, out, _piece(5, 0, b"new"))
    gate.set()
    await task
    store.commit(out)
    assert out.spilled == 4 and store.memory_segments == store.stats().stored_segments == 1
    assert await _read(pool, store, disk, [5], 0, 1) == [b"5/0/0", b"5/0/1", b"5/0/2", b"5/0/3", b"new"]
    disk.close()


@within(30)
async def test_commit_during_a_spill_serves_the_pieces_from_the_file(tmp_path: Path) -> None:
    """Pieces committed while being written are served from memory until the write is done, then from disk."""

    pool, store, disk, spiller = _setup(tmp_path)
    out = _push(pool, store, 9, 6)
    task, gate = await _spill_while_held(disk, spiller, store)
    store.commit(out)
    want = [f"9/0/{i}".encode() for i in (0, 2, 4)] + [f"9/1/{i}".encode() for i in (1, 3, 5)]
    assert out.spilled == 0 and await _read(pool, store, disk, [9]) == want
    gate.set()
    await task
    assert out.spilled == 6 and list(out.offsets) == [i * PIECE for i in range(6)]
    assert await _read(pool, store, disk, [9]) == want
    assert pool.used == store.memory_segments == 0
    disk.close()


@within(30)
async def test_a_spill_cancelled_during_its_write_still_completes(tmp_path: Path) -> None:
    """A flush cut short (e.g. at stop) must not lose the pieces it took: they end up in the file."""

    pool, store, disk, spiller = _setup(tmp_path)
    out = _push(pool, store, 4, 4)
    store.commit(out)
    task, gate = await _spill_while_held(disk, spiller, store)
    task.cancel()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await disk.sync()  # the write is done, and its bookkeeping ran before this returns
    await until(lambda: out.spilled == 4)
    assert pool.used == store.memory_segments == 0
    disk.close()


@within(30)
async def test_memory_changed_since_the_push_is_not_hidden_by_a_spill(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The journal keeps the CRC32C the writer sent, not one of the bytes as they are when spilled: a piece
    that changed in memory fails its check when read back, and the spill logs the corruption."""

    pool, store, disk, spiller = _setup(tmp_path)
    out = _push(pool, store, 6, 2)
    store.commit(out)
    pushed_crc = out.crcs[0]
    out.memory[0].memory[30] ^= 0xFF  # a bit flip in RAM after the push was checked
    with caplog.at_level("ERROR", logger="shuffled.server.storage.spill"):
        await spiller.spill(store.apps["app"][1])
    assert any("memory corruption" in r.getMessage() for r in caplog.records)
    assert out.spilled == 2 and out.crcs[0] == pushed_crc
    assert store.apps["app"][1].file is not None
    with open(store.apps["app"][1].file.path, "rb") as f:
        assert checksum(f.read(PIECE)) != pushed_crc  # so the read fails with CORRUPT_DATA
    with pytest.raises(Exception, match="CRC32C"):
        await _read(pool, store, disk, [6])
    disk.close()


def _fill(pool: GlobalPool, store: Store, attempts: int, partitions: int, segments: int) -> list[MapOutput]:
    """`segments` pieces round-robin over the attempts, each one run of the partitions in turn; each says
    what it is (attempt, partition, sequence within the attempt), so a read shows where every byte went."""
    outs = [store.open_map_output("app", 1, a, a, partitions) for a in range(1, attempts + 1)]
    for i in range(segments):
        out = outs[i % attempts]
        n = out.pieces
        p = n % partitions
        push(pool, store, out, _piece(out.attempt, p, f"{out.attempt}/{p}/{n}".encode()))
    return outs


@within(60)
async def test_pressure_keeps_several_writes_queued_and_each_attempt_in_push_order(tmp_path: Path) -> None:
    """Above the high watermark the spiller queues IN_FLIGHT writes on the writer thread at once, none
    writing an attempt another one writes; once they are done every attempt reads back in push order
    and no segment is lost."""

    pool = GlobalPool(1024 * SEGMENT, SEGMENT, reserve=8)  # room between the watermarks for IN_FLIGHT batches
    store = Store(SEGMENT, can_spill=True)
    disk = Disk(str(tmp_path))
    spiller = Spiller(store, pool, disk, 0.85, 0.5)
    outs = _fill(pool, store, 6, 3, spiller.high)
    gate = threading.Event()
    disk._writer.submit(gate.wait, 10)
    spiller.check()
    await until(lambda: len(spiller.writes.under_way) == IN_FLIGHT)
    assert spiller.paused and spiller.writes.leaving == IN_FLIGHT * spiller.batch
    assert len(spiller.writes.by_attempt) >= IN_FLIGHT  # each write has attempts of its own
    gate.set()
    task = spiller._task
    assert task is not None
    await task
    assert not spiller.paused and not spiller.writes.by_attempt and spiller.writes.leaving == 0
    assert pool.used == store.memory_segments <= spiller.low
    assert disk.stats.spills > IN_FLIGHT  # it went on writing after the first ones ended
    for out in outs:
        store.commit(out)
    for out in outs:
        a = out.attempt
        want = [f"{a}/{p}/{n}".encode() for p in range(3) for n in range(out.pieces) if n % 3 == p]
        assert await _read(pool, store, disk, [a], 0, 3) == want
    assert store.stats().stored_segments == store.memory_segments
    _, dropped = store.unregister_shuffle("app", 1)
    await disk_space.removed(disk, dropped)
    assert pool.used == 0 and disk.stats.used_bytes == 0
    disk.close()


@within(30)
async def test_pushes_resume_while_the_memory_they_need_is_being_written(tmp_path: Path) -> None:
    """Push credit comes back as soon as the writes under way will bring usage below the low watermark,
    not when they are done."""

    pool = GlobalPool(256 * SEGMENT, SEGMENT, reserve=8)
    store = Store(SEGMENT, can_spill=True)
    disk = Disk(str(tmp_path))
    spiller = Spiller(store, pool, disk, 0.85, 0.8)
    _fill(pool, store, 2, 4, spiller.high)
    gate = threading.Event()
    disk._writer.submit(gate.wait, 10)
    spiller.check("app")
    assert spiller.holding("app")
    await asyncio.wait_for(spiller.admitted("app"), 5)
    assert pool.used == spiller.high, "nothing was written yet"
    assert spiller.writes.by_attempt and pool.used - spiller.writes.leaving <= spiller.low
    gate.set()
    task = spiller._task
    assert task is not None
    await task
    assert pool.used == store.memory_segments <= spiller.low
    disk.close()


@within(30)
async def test_one_failed_write_among_queued_ones_fails_only_its_attempts(tmp_path: Path) -> None:
    """A write that fails while others wait behind it leaves its pieces in memory, first in their
    attempts, and fails the open map outputs that had data in it; the others land, no more are queued
    (the disk is failing), pushes are let go, and every segment comes back."""

    pool = GlobalPool(1024 * SEGMENT, SEGMENT, reserve=8)  # room between the watermarks for IN_FLIGHT batches
    store = Store(SEGMENT, can_spill=True)
    disk = Disk(str(tmp_path))
    spiller = Spiller(store, pool, disk, 0.85, 0.5)
    outs = _fill(pool, store, 8, 2, spiller.high)
    failed: dict[int, list[object]] = {out.attempt: [] for out in outs}
    for out in outs:
        out.on_failure = failed[out.attempt].append
    real = disk._append
    calls = 0

    def second_fails(
        path: str, views: Sequence[memoryview], journal: str, record: Callable[[Appended], bytes], seal: Sealer | None
    ) -> Appended:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(28, "No space left on device")
        return real(path, views, journal, record, seal)

    disk._append = second_fails  # type: ignore[method-assign]
    gate = threading.Event()
    disk._writer.submit(gate.wait, 10)
    spiller.check()
    await until(lambda: len(spiller.writes.under_way) == IN_FLIGHT)
    gate.set()
    task = spiller._task
    assert task is not None
    await task
    hit = [a for a, errors in failed.items() if errors]
    assert hit and all(type(e).__name__ == "StorageError" for a in hit for e in failed[a])
    assert disk.stats.errors == 1
    for a in hit:
        out = next(o for o in outs if o.attempt == a)
        assert out.taken == out.spilled  # nothing of it is being written, the rest is in memory
    assert not spiller.paused and not spiller.writes.by_attempt and spiller.writes.leaving == 0
    spiller.check()  # backing off: nothing is queued
    assert spiller._task is None
    for out in outs:
        store.abort(out)
    assert pool.used == 0 and store.memory_segments == 0
    disk.close()


@within(30)
async def test_a_flush_waits_for_the_shuffles_write_under_way(tmp_path: Path) -> None:
    """A flush of a shuffle whose earlier pieces are being written returns only when those and the ones
    pushed since are in the file, in push order."""

    pool, store, disk, spiller = _setup(tmp_path)
    out = _push(pool, store, 5, 4, partitions=1)
    task, gate = await _spill_while_held(disk, spiller, store)
    push(pool, store, out, _piece(5, 0, b"new"))
    flush = asyncio.create_task(spiller.flush([store.apps["app"][1]]))
    gate.set()
    assert await flush == PIECE
    assert store.memory_segments == 0 and task.done()
    store.commit(out)
    assert out.spilled == 5 and list(out.offsets) == [i * PIECE for i in range(5)]
    assert await _read(pool, store, disk, [5], 0, 1) == [b"5/0/0", b"5/0/1", b"5/0/2", b"5/0/3", b"new"]
    disk.close()


@within(30)
async def test_a_spill_after_the_writer_stopped_leaves_the_pieces_in_memory(tmp_path: Path) -> None:
    """A write that cannot even be queued (the writer thread is shut down) gives back the references it took."""

    pool, store, disk, spiller = _setup(tmp_path)
    out = _push(pool, store, 2, 4)
    disk.close()
    with pytest.raises(RuntimeError):
        await spiller.spill(store.apps["app"][1])
    assert not spiller.writes.by_attempt and spiller.writes.leaving == 0
    assert out.taken == out.spilled == 0 and len(out.memory) == 4
    store.abort(out)
    assert pool.used == 0


@within(30)
async def test_spilled_bytes_are_the_stored_bytes_in_one_file(tmp_path: Path) -> None:
    """However many partitions the pieces hold, a spill writes exactly their bytes, into one file."""

    pool, store, disk, spiller = _setup(tmp_path)
    out = store.open_map_output("app", 1, 1, 1, 10_000)
    for g in range(3):
        push(pool, store, out, pack(1, [(p, b"x" * 3) for p in range(g * 1000, g * 1000 + 1000)]))
    written = await spiller.spill(store.apps["app"][1])
    assert written == 3 * (12 + 1000 * 11) == out.size
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "LOCK"]
    assert sorted(p.name for p in files) == ["data", "journal"]
    assert os.path.getsize(store.apps["app"][1].file.path) == written  # type: ignore[union-attr]
    disk.close()
