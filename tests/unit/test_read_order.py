"""Whatever mix of disk and memory holds a partition, a read serves each (partition, attempt) pair as one run,
in push order, with nothing dropped or repeated (PROTOCOL.md §10.1; the Spark reader reads a pair as one stream).

Hypothesis drives the store through random interleavings of pushes from several attempts, commits, aborts and
spills (started, overlapped by pushes, commits and aborts, then finished or failed), as the spiller and push
sessions do on the event loop. The store does no I/O, so a spill's "file" is a model: what each offset holds.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from shuffled.buffers import Buffer, GlobalPool
from shuffled.server.chunks import Chunk
from shuffled.server.disk import SpillFile
from shuffled.server.store import DiskChunk, MapOutput, MapState, Store, StoredChunk, Subpartition

SEGMENT = 4096
PARTITIONS = 2
ATTEMPTS = 3
_TAG = struct.Struct(">II")  # attempt, sequence within its pair

#: an operation and two small numbers (attempt or partition, and a flag); pushes are the most common so that
#: pairs get several chunks and interleave, aborts rare so that most attempts live to be read
KINDS = ["push"] * 8 + ["commit"] * 2 + ["spill"] * 2 + ["finish"] * 2 + ["abort", "read"]
ops = st.tuples(st.sampled_from(KINDS), st.integers(0, ATTEMPTS - 1), st.integers(0, PARTITIONS - 1))


@dataclass
class Model:
    pool: GlobalPool = field(default_factory=lambda: GlobalPool(256 * SEGMENT, SEGMENT))
    store: Store = field(default_factory=lambda: Store(SEGMENT))
    outs: dict[int, MapOutput] = field(default_factory=dict)
    #: (partition, attempt) -> sequence numbers pushed, in order
    pushed: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    #: (partition, file offset) -> (attempt, sequence) written there by a spill
    files: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    #: spills in flight, at most one per partition as in the spiller, by partition: its chunks and the
    #: write's own references on their segments (an abort meanwhile drops only the store's)
    spilling: dict[int, tuple[Subpartition, list[StoredChunk], list[Buffer]]] = field(default_factory=dict)

    def out(self, attempt: int) -> MapOutput:
        if attempt not in self.outs:
            self.outs[attempt] = self.store.open_map_output("app", 0, attempt, attempt, PARTITIONS)
        return self.outs[attempt]

    def push(self, attempt: int, partition: int) -> None:
        out = self.out(attempt)
        if out.state is not MapState.OPEN:
            return
        seqs = self.pushed.setdefault((partition, attempt), [])
        (buf,) = self.pool.try_take(1) or []
        buf.set_recycler(self.pool.give)
        buf.length = SEGMENT // 2 + len(seqs) % 7  # chunks of unequal length: offsets matter
        _TAG.pack_into(buf.memory, 0, attempt, len(seqs))
        self.store.add(out, partition, buf, 0)
        seqs.append(len(seqs))

    def spill(self, partition: int, limit: int | None) -> None:
        """Take the partition's oldest in-memory chunks, all or at most `limit` (a pressure spill's batch)."""
        data = self.store.apps.get("app", {}).get(0)
        if partition in self.spilling or data is None or partition not in data.subpartitions:
            return
        sub = data.subpartitions[partition]
        chunks = self.store.take_for_spill(sub, limit)
        held = [c.buffer for c in chunks if c.buffer is not None]
        for buf in held:
            buf.retain()
        self.spilling[partition] = (sub, chunks, held)

    def finish(self, partition: int, ok: bool) -> None:
        if partition not in self.spilling:
            return
        sub, chunks, held = self.spilling.pop(partition)
        data = self.store.apps["app"][0]
        if sub.file is None:
            sub.file = SpillFile(f"p{sub.partition}.data")
        offset = sub.file.size
        if ok:
            at = offset
            for buf in held:
                self.files[(sub.partition, at)] = _TAG.unpack_from(buf.memory, 0)
                at += buf.length
            sub.file.size = offset + self.store.spilled(data, sub, chunks, offset)
        else:
            self.store.unspilled(sub, chunks)
        for buf in held:
            buf.release()

    def read(self, partition: int) -> None:
        """Read partitions [partition, PARTITIONS) of every committed attempt and check each pair's run."""
        data = self.store.apps.get("app", {}).get(0)
        if data is None:
            return
        attempts = sorted(data.committed)
        items, _ = self.store.snapshot("app", 0, partition, PARTITIONS, attempts, digest=b"")
        runs: list[tuple[int, int]] = []
        got: dict[tuple[int, int], list[int]] = {}
        for item in items:
            if isinstance(item, DiskChunk):
                attempt, seq = self.files[(item.partition, item.offset)]
            else:
                assert isinstance(item, Chunk)
                attempt, seq = _TAG.unpack_from(item.buffer.memory, 0)
                item.buffer.release()
            pair = (item.partition, item.attempt)
            assert attempt == item.attempt
            if not runs or runs[-1] != pair:
                assert pair not in runs, f"pair {pair} served in two runs: {[*runs, pair]}"
                runs.append(pair)
            got.setdefault(pair, []).append(seq)
        want = {k: v for k, v in self.pushed.items() if k[0] >= partition and k[1] in data.committed}
        assert got == want


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, min_size=10, max_size=60))
def test_each_pair_is_one_run_in_push_order(steps: list[tuple[str, int, int]]) -> None:
    m = Model()
    for step in steps:
        kind, a, p = step
        match kind:
            case "push":
                m.push(a, p)
            case "commit" if m.out(a).state is MapState.OPEN:
                m.store.commit(m.out(a))
            case "abort":
                m.store.abort(m.out(a))
            case "spill":
                m.spill(p, (None, 1, 3)[a])
            case "finish":
                m.finish(p, ok=a > 0)  # one in three spills fails (ENOSPC): its chunks go back to memory
            case "read":
                m.read(p)
    for p in range(PARTITIONS):
        m.finish(p, True)
    m.read(0)
    # Every segment comes back once the shuffle is dropped.
    m.store.unregister_shuffle("app", 0)
    assert m.pool.used == 0
