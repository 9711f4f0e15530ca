"""Which shuffle the spiller writes first under pressure (storage/placement.py): not one being pushed while
another holds memory, and otherwise the one used longest ago (a push opened, a commit, a read's batch),
whatever its size. A long Spark session keeps its finished queries' shuffles; writing the largest instead
put the shuffle being pushed on disk, and its reads, which come next, loaded it back while the finished
ones sat in memory unread. The same holds for spilled pieces moved from the data dir to objects."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuffled.buffers import GlobalPool
from shuffled.server.storage.disk import Disk
from shuffled.server.storage.loader import PieceLoader
from shuffled.server.storage.plan import make_plan
from shuffled.server.storage.shuffles import MapOutput
from shuffled.server.storage.spill import Spiller
from shuffled.server.storage.store import Store
from shuffled.server.storage.view import ReadView
from tests.aio import within
from tests.pieces import pack, push

SEGMENT = 32 << 10


def _push(pool: GlobalPool, store: Store, out: MapOutput, pieces: int) -> None:
    """`pieces` one-run groups (a segment each)."""
    for _ in range(pieces):
        push(pool, store, out, pack(out.attempt, [(0, b"x" * 80)]))


def _committed(pool: GlobalPool, store: Store, shuffle: int, pieces: int, app: str = "app") -> None:
    out = store.open_map_output(app, shuffle, 0, 1, 1)
    _push(pool, store, out, pieces)
    store.commit(out)


async def _spill(store: Store, spiller: Spiller) -> dict[int, int]:
    """Let the pool's pressure spill; the segments each shuffle then holds in memory."""
    spiller.check()
    task = spiller._task
    assert task is not None, "the pool is past the start mark"
    await task
    return {shuffle: data.segments for shuffle, data in store.apps["app"].items()}


@pytest.mark.parametrize("first", ["unread", "read again", "being read"])
@within(30)
async def test_the_shuffle_used_longest_ago_goes_to_disk_first_not_the_largest_being_pushed(
    tmp_path: Path, first: str
) -> None:
    """Shuffle 3 is opened first and pushed last, the largest: it stays. Of the two committed ones the one
    used longest ago goes (a batch's worth): the first, unless it was read after the second's commit, or a
    read of it is still taking batches then."""
    pool = GlobalPool(200 * SEGMENT, SEGMENT, reserve=8)
    store = Store(SEGMENT, can_spill=True)
    disk = Disk(str(tmp_path))
    spiller = Spiller(store, pool, disk, 0.85, 0.7)  # spills from 155 segments in use down to 140
    assert spiller.batch == 32
    pushing = store.open_map_output("app", 3, 0, 1, 1)  # the query's map tasks start first...
    _committed(pool, store, 1, 40)
    view = ReadView(make_plan(store, "app", 1, 0, 1, [1], digest=b""), pool, PieceLoader(disk))
    _committed(pool, store, 2, 40)
    if first == "read again":
        make_plan(store, "app", 1, 0, 1, [1], digest=b"")
    elif first == "being read":
        chunks, _ = view.take(1)
        for chunk in chunks:  # the reader is done with that batch; it takes more later
            chunk.buffer.release()
    _push(pool, store, pushing, 80)  # ...and push after others were committed and read
    held = await _spill(store, spiller)
    view.close()
    assert held[3] == 80, "the shuffle being pushed, though the largest, stays in memory"
    if first == "unread":
        assert held == {1: 8, 2: 40, 3: 80}, "the first went (a write of 32 segments)"
    else:
        assert held == {1: 40, 2: 8, 3: 80}, "the second, not used since its commit, went"
    assert pool.used == store.memory_segments == sum(held.values()) <= spiller.low
    disk.close()


@within(30)
async def test_shuffles_too_small_for_a_write_go_after_those_that_fill_one(tmp_path: Path) -> None:
    """Sixty one-segment shuffles used long ago and one of forty: the forty go in one write, not forty
    writes (and files) of one segment each."""
    pool = GlobalPool(200 * SEGMENT, SEGMENT, reserve=8)
    store = Store(SEGMENT, can_spill=True)
    disk = Disk(str(tmp_path))
    spiller = Spiller(store, pool, disk, 0.85, 0.7)
    for shuffle in range(60):
        _committed(pool, store, 100 + shuffle, 1)
    _committed(pool, store, 1, 40)
    pushing = store.open_map_output("app", 2, 0, 1, 1)
    _push(pool, store, pushing, 60)
    held = await _spill(store, spiller)
    assert held[1] == 8 and held[2] == 60 and all(held[100 + s] == 1 for s in range(60))
    assert disk.stats.spills == 1
    disk.close()


@pytest.mark.parametrize("case", ["unread", "read since", "over its quota"])
@within(30)
async def test_spilled_pieces_of_the_shuffle_used_longest_ago_move_to_objects_first(tmp_path: Path, case: str) -> None:
    """With the data dir over its quota, spilled pieces move to objects (disk_moves.py), which reads serve
    more slowly: those of the shuffle used longest ago first, the oldest in its file and up to an object's
    worth, not those of the shuffle holding the most disk; an application over its own quota gives its
    shuffles first. Pieces a write already claimed are not chosen again."""
    pool = GlobalPool(200 * SEGMENT, SEGMENT, reserve=8)
    store = Store(SEGMENT, can_spill=True)
    disk = Disk(str(tmp_path))
    spiller = Spiller(store, pool, disk, 0.85, 0.7)
    _committed(pool, store, 1, 20)
    _committed(pool, store, 2, 60, app="other")  # committed later, and the most disk
    await spiller.flush([d for shuffles in store.apps.values() for d in shuffles.values()])
    if case != "unread":
        make_plan(store, "app", 1, 0, 1, [1], digest=b"")  # a read since: the other is colder
    first = {"app"} if case == "over its quota" else set()
    piece = store.apps["app"][1].committed[1].sizes[0]
    found = store.placement.coldest_on_disk(first, (), 8 * piece)
    assert found is not None
    data, pieces = found
    assert (data.app, data.shuffle) == (("other", 2) if case == "read since" else ("app", 1))
    ((out, indices),) = pieces
    assert indices == list(range(8)), "the oldest pieces in the file, up to an object's worth"
    again = store.placement.coldest_on_disk(first, {out}, 8 * piece)
    assert again is not None and again[0] is not data, "a claimed attempt's pieces wait for its write"
    if first:  # only the daemon's own quota lets another application's pieces move
        assert store.placement.coldest_on_disk(first, {out}, 8 * piece, others=False) is None
    disk.close()
