"""A read resumed on another copy (PROTOCOL.md §10.6) gets exactly what the failed read had not relayed.

Two stores hold the same pushes as the same chunks but in different states: another commit order and a
spilled prefix on one of them. Whatever prefix of the primary's stream was relayed (`PairProgress`),
the copy's resumed snapshot completes it: every pair whole, in push order, nothing twice. A resume
point that does not fit the copy is refused before anything is retained.
"""

from __future__ import annotations

import struct

import pytest

from shuffled.buffers import Buffer, GlobalPool
from shuffled.protocol.errors import InvalidRequest
from shuffled.server.chunks import Chunk
from shuffled.server.disk import SpillFile
from shuffled.server.reading import PairProgress
from shuffled.server.store import DiskChunk, Resume, Store

SEGMENT = 4096
PARTITIONS = 3
_TAG = struct.Struct(">II")  # attempt, sequence within its pair
#: (partition, attempt, sequence): two attempts pushing interleaved, pairs of 1 to 4 chunks
PUSHES = [(p, a, s) for s in range(4) for a in (1, 2) for p in range(PARTITIONS) if s < 1 + (p + a) % 4]

Item = tuple[int, int, int, int]  # partition, attempt, sequence, length


class Copy:
    def __init__(self, commit_order: tuple[int, ...], spill: dict[int, int]) -> None:
        """The pushes, then the first `spill[p]` chunks of partition p spilled, then the commits."""
        self.pool = GlobalPool(64 * SEGMENT, SEGMENT)
        self.store = Store(SEGMENT)
        self.files: dict[tuple[int, int], tuple[int, int]] = {}
        outs = {a: self.store.open_map_output("app", 0, a, a, PARTITIONS) for a in (1, 2)}
        for p, a, s in PUSHES:
            (buf,) = self.pool.try_take(1) or []
            buf.set_recycler(self.pool.give)
            buf.length = SEGMENT // 2 + 7 * s + a  # unequal lengths: the byte count must match too
            _TAG.pack_into(buf.memory, 0, a, s)
            self.store.add(outs[a], p, buf, 0)
        data = self.store.apps["app"][0]
        for p, n in spill.items():
            sub = data.subpartitions[p]
            chunks = self.store.take_for_spill(sub, n)
            sub.file = SpillFile(f"p{p}.data")
            at = 0
            for c in chunks:
                assert c.buffer is not None
                self.files[(p, at)] = _TAG.unpack_from(c.buffer.memory, 0)
                at += c.length
            sub.file.size = self.store.spilled(data, sub, chunks, 0)
        for a in commit_order:
            self.store.commit(outs[a])

    def serve(self, start: int, resume: Resume | None = None) -> list[Item]:
        items, _ = self.store.snapshot("app", 0, start, PARTITIONS, [1, 2], resume, digest=b"")
        out = []
        for item in items:
            if isinstance(item, DiskChunk):
                a, s = self.files[(item.partition, item.offset)]
                out.append((item.partition, a, s, item.length))
            else:
                assert isinstance(item, Chunk)
                a, s = _TAG.unpack_from(item.buffer.memory, 0)
                out.append((item.partition, a, s, item.buffer.length))
                item.buffer.release()
            assert a == item.attempt
        return out

    def settled(self) -> bool:
        return self.pool.used == self.store.memory_segments


def _progress(relayed: list[Item]) -> PairProgress:
    progress = PairProgress()
    for p, a, _, length in relayed:
        buf = Buffer(0, memoryview(bytearray(length)), length)
        buf.length = length
        progress.add(Chunk(buf, p, a))
    return progress


def _pairs(stream: list[Item]) -> dict[tuple[int, int], list[int]]:
    """Each pair's sequence numbers; a pair must be one run (§10.1) and partitions in order."""
    runs: list[tuple[int, int]] = []
    got: dict[tuple[int, int], list[int]] = {}
    for p, a, s, _ in stream:
        if not runs or runs[-1] != (p, a):
            assert (p, a) not in runs, f"pair {(p, a)} in two runs"
            assert not runs or runs[-1][0] <= p
            runs.append((p, a))
        got.setdefault((p, a), []).append(s)
    return got


WANT = {(p, a): [s for q, b, s in PUSHES if (q, b) == (p, a)] for p in range(PARTITIONS) for a in (1, 2)}


@pytest.mark.parametrize(
    "copy_state",
    [((1, 2), {}), ((2, 1), {}), ((2, 1), {0: 3, 1: 1}), ((1, 2), {0: 7, 1: 4, 2: 2})],
    ids=["same", "commit-order", "spilled-prefix", "spilled-most"],
)
def test_every_cut_point_resumes_to_exactly_the_rest(copy_state: tuple[tuple[int, ...], dict[int, int]]) -> None:
    primary = Copy((1, 2), {1: 2})
    full = primary.serve(0)
    assert _pairs(full) == WANT
    copy = Copy(*copy_state)
    for n in range(len(full) + 1):
        resume = _progress(full[:n]).resume()
        rest = copy.serve(0 if resume is None else resume.partition, resume)
        assert _pairs(full[:n] + rest) == WANT, f"cut after {n} chunks"
        assert copy.settled()
    assert primary.settled()


def test_a_resume_point_that_does_not_fit_is_refused_before_anything_is_retained() -> None:
    copy = Copy((1, 2), {0: 2})
    full = copy.serve(0)
    good = _progress(full[:3]).resume()
    assert good is not None and good.chunks >= 1
    bad = [
        Resume(good.partition, good.done, good.attempt, good.chunks, good.bytes + 1),  # bytes differ
        Resume(good.partition, good.done, good.attempt, 99, good.bytes),  # more chunks than the pair has
        Resume(good.partition + 1, good.done, good.attempt, good.chunks, good.bytes),  # not the start
        Resume(good.partition, (7,), good.attempt, good.chunks, good.bytes),  # an attempt not named
    ]
    for resume in bad:
        used = copy.pool.used
        with pytest.raises(InvalidRequest):
            copy.store.snapshot("app", 0, good.partition, PARTITIONS, [1, 2], resume, digest=b"")
        assert copy.pool.used == used
    with pytest.raises(InvalidRequest, match="does not match this copy"):
        copy.store.snapshot("app", 0, good.partition, PARTITIONS, [1, 2], bad[0], digest=b"")
    copy.store.unregister_shuffle("app", 0)
    assert copy.pool.used == 0


def test_resume_wire_form_round_trips() -> None:
    for resume in (Resume(3, (1, 2), 5, 4, 1000), Resume(0)):
        assert Resume.from_wire(resume.to_wire()) == resume
    assert "attempt" not in Resume(0).to_wire()
