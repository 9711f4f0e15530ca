"""Which shuffle the spiller writes first under pressure (storage/placement.py): the one used longest ago
(pushed to, committed or read), whatever its size. A long Spark session keeps its finished queries'
shuffles; writing the largest instead put the shuffle being pushed now on disk, and its reads, which come
next, had to load it back while the finished ones sat in memory unread."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuffled.buffers import GlobalPool
from shuffled.server.storage.disk import Disk
from shuffled.server.storage.plan import make_plan
from shuffled.server.storage.spill import Spiller
from shuffled.server.storage.store import Store
from tests.aio import within
from tests.pieces import pack, push

SEGMENT = 32 << 10


def _shuffle(pool: GlobalPool, store: Store, shuffle: int, pieces: int, commit: bool) -> None:
    """One map output of `pieces` one-run groups (a segment each)."""
    out = store.open_map_output("app", shuffle, 0, 1, 1)
    for _ in range(pieces):
        push(pool, store, out, pack(1, [(0, b"x" * 80)]))
    if commit:
        store.commit(out)


async def _spill(store: Store, spiller: Spiller) -> dict[int, int]:
    """Let the pool's pressure spill; the segments each shuffle then holds in memory."""
    spiller.check()
    task = spiller._task
    assert task is not None, "the pool is past the start mark"
    await task
    return {shuffle: data.segments for shuffle, data in store.apps["app"].items()}


@pytest.mark.parametrize("read_the_first_again", [False, True])
@within(30)
async def test_the_shuffle_used_longest_ago_goes_to_disk_first_whatever_its_size(
    tmp_path: Path, read_the_first_again: bool
) -> None:
    pool = GlobalPool(100 * SEGMENT, SEGMENT, reserve=8)
    store = Store(SEGMENT, can_spill=True)
    disk = Disk(str(tmp_path))
    spiller = Spiller(store, pool, disk, 0.85, 0.7)  # spills from 77 segments in use down to 70
    _shuffle(pool, store, 1, 20, commit=True)  # an earlier query's, small
    _shuffle(pool, store, 2, 40, commit=True)
    if read_the_first_again:
        make_plan(store, "app", 1, 0, 1, [1], digest=b"")  # a read of it: now the second is the older
    _shuffle(pool, store, 3, 20, commit=False)  # the one being pushed now
    held = await _spill(store, spiller)
    if read_the_first_again:
        assert held[1] == held[3] == 20 and held[2] < 40, "the second, unread since its commit, went first"
    else:
        assert held == {1: 0, 2: 40, 3: 20}, "the first went, though the second held twice its memory"
    assert pool.used == store.memory_segments == sum(held.values()) <= spiller.low
    disk.close()
