"""Any split of any partitions' data into packed groups reads back identically, for every range, from
memory, from disk and after a restart; a read resumed at any point completes exactly the rest.

Hypothesis makes the map outputs (empty partitions, a partition spanning many groups, a writer that
flushed several times so its pieces form several ascending sequences), pushes them interleaved into a
real `Store`, spills at random points through the real `Spiller` into a real data dir, and reads ranges
through the real `ReadView`. Every read must serve each (partition, attempt) pair whole and in push
order as consecutive runs, one attempt's pairs together in ascending partition order (PROTOCOL.md
§10.1), frames of at most a segment whose CRC32C holds; and every segment must come
back once the shuffle is dropped.
"""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shuffled.buffers import GlobalPool
from shuffled.protocol.resume import ReadProgress
from shuffled.server.storage import replay
from shuffled.server.storage.disk import Disk, SpillFile
from shuffled.server.storage.plan import make_plan
from shuffled.server.storage.restore import restore_shuffle
from shuffled.server.storage.spill import Spiller
from shuffled.server.storage.store import Store
from tests.aio import run
from tests.pieces import Output, check, outputs, push, serve, unpack

SEG = 4096
APP = "app"

Scenario = tuple[int, list[Output], list[int], list[tuple[int, int]], int, list[tuple[int, int]]]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    partitions = draw(st.integers(1, 9))
    outs = [draw(outputs(partitions, a, SEG)) for a in range(1, draw(st.integers(1, 3)) + 1)]
    order = draw(st.permutations([o.attempt for o in outs for _ in o.groups]))
    # after which push (or at the end: len(order)) a spill of at most how many pieces runs (0: all)
    spills = draw(st.lists(st.tuples(st.integers(0, len(order)), st.integers(0, 4)), max_size=4))
    ranges = draw(st.lists(st.tuples(st.integers(0, partitions), st.integers(0, partitions)), max_size=3))
    cut = draw(st.integers(0, 1 << 16))
    return partitions, outs, order, [(min(r), max(r)) for r in ranges], cut, spills


def runs(payloads: list[bytes]) -> list[tuple[int, int, bytes]]:
    return [run for payload in payloads for run in unpack(payload)]


async def read_all(
    pool: GlobalPool,
    store: Store,
    disk: Disk | None,
    partitions: int,
    outs: list[Output],
    ranges: list[tuple[int, int]],
    cut: int,
) -> None:
    named = [o.attempt for o in outs]
    for lo, hi in [(0, partitions), *ranges]:
        want = {(p, o.attempt): d for o in outs for p, d in o.data.items() if lo <= p < hi}
        full = await serve(pool, disk, make_plan(store, APP, 0, lo, hi, named, digest=b""))
        check(runs(full), want)
        # A relay that passed on the first k payloads resumes on this copy exactly where they stop.
        k = cut % (len(full) + 1)
        progress = ReadProgress()
        for payload in full[:k]:
            progress.add(memoryview(payload))
        rest = await serve(pool, disk, make_plan(store, APP, 0, lo, hi, named, progress.resume(), digest=b""))
        check(runs(full[:k] + rest), want)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_any_split_reads_back_from_memory_disk_and_after_restart(scenario: Scenario) -> None:
    partitions, outs, order, ranges, cut, spills = scenario

    async def body(root: str) -> None:
        pool = GlobalPool(512 * SEG, SEG, reserve=64)
        store = Store(SEG, can_spill=True)
        disk = Disk(root)
        spiller = Spiller(store, pool, disk, 0.85, 0.7)
        mouts = {o.attempt: store.open_map_output(APP, 0, o.attempt, o.attempt, partitions) for o in outs}
        pending = {o.attempt: iter(o.groups) for o in outs}
        for step in range(len(order) + 1):
            for at, limit in spills:
                if at == step:
                    data = store.apps[APP][0]
                    if limit:
                        assert spiller.target is not None
                        spiller.writes.start(spiller.target, data, list(mouts.values()), limit)
                    else:
                        await spiller.spill(data)
            if step < len(order):
                a = order[step]
                push(pool, store, mouts[a], next(pending[a]))
        lengths = {}
        for a, out in mouts.items():
            lengths[a] = store.commit(out).tolist()
            spiller.journals.committed(out.shuffle, a)  # journaled, as a push session does
        for o in outs:
            assert lengths[o.attempt] == [len(o.data.get(p, b"")) for p in range(partitions)]
        await read_all(pool, store, disk, partitions, outs, ranges, cut)  # memory, disk, both
        await spiller.flush([store.apps[APP][0]])
        await disk.sync()
        await read_all(pool, store, disk, partitions, outs, ranges, cut)  # all on disk
        assert pool.used == store.memory_segments == 0
        disk.close()
        # A restart serves the same from the journal and the file.
        disk = Disk(root)
        again = Store(SEG)
        for loaded in replay.load(disk):
            restore_shuffle(again, loaded, SpillFile(disk.data_path(loaded.directory), loaded.file_size))
        await read_all(pool, again, disk, partitions, outs, ranges, cut)
        assert pool.used == 0
        disk.close()

    with tempfile.TemporaryDirectory() as root:
        run(body(root), 60)
