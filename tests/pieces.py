"""Packed groups for tests that drive the daemon's store in-process: packing a writer's data into pieces
as clients do (any split), pushing them into a `Store`, and reading a plan back through a `ReadView`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from hypothesis import strategies as st

from shuffled.buffers import Chunk, GlobalPool
from shuffled.protocol.integrity import checksum
from shuffled.protocol.packed import HEADER_SIZE, RUN_SIZE, check_push, directory, group_bytes
from shuffled.server.serving.view_reader import ViewReader
from shuffled.server.storage.disk import Disk
from shuffled.server.storage.loader import PieceLoader
from shuffled.server.storage.plan import Plan
from shuffled.server.storage.shuffles import MapOutput
from shuffled.server.storage.store import Store
from shuffled.server.storage.view import ReadView

Run = tuple[int, bytes]
Pair = tuple[int, int]  # partition, attempt


def pack(attempt: int, runs: Iterable[Run]) -> bytes:
    """One packed group (PROTOCOL.md §3.3) of these (partition, bytes) runs, partitions strictly ascending."""
    return group_bytes(attempt, runs)


def unpack(payload: bytes | memoryview) -> list[tuple[int, int, bytes]]:
    """Every run of a payload of groups, as (attempt, partition, bytes)."""
    view, at, found = memoryview(payload), 0, []
    while at < len(view):
        d = directory(view, at)
        found += [(d.attempt, p, bytes(view[lo:hi])) for p, lo, hi in d.runs()]
        at = d.end
    return found


def group_runs(
    attempt: int, partitions: Sequence[int], lengths: Sequence[int], data: bytes | memoryview
) -> list[tuple[int, int, bytes]]:
    """The runs (attempt, partition, bytes) that a group's directory and data describe (the bulk read's view)."""
    ends = list(accumulate(lengths))
    assert ends[-1] == len(data), f"the directory's runs hold {ends[-1]} bytes, the data {len(data)}"
    return [(attempt, p, bytes(data[a:b])) for p, a, b in zip(partitions, [0, *ends[:-1]], ends, strict=True)]


def split(attempt: int, runs: Iterable[Run], limit: int, cuts: Iterable[int] = ()) -> list[bytes]:
    """The groups a writer fills to `limit` bytes from runs in partition order, a run continuing in the
    next group when it does not fit; `cuts` (counts of data bytes) end groups early, even inside a run."""
    ends = sorted(set(cuts))
    groups: list[bytes] = []
    current: list[Run] = []
    written = 0

    def close() -> None:
        if current:
            groups.append(pack(attempt, current))
            current.clear()

    for p, data in runs:
        while data:
            continuing = bool(current) and current[-1][0] == p
            size = HEADER_SIZE + sum(RUN_SIZE + len(d) for _, d in current)
            room = limit - size - (0 if continuing else RUN_SIZE)
            cut = next((c for c in ends if c > written), None)
            if cut is not None:
                room = min(room, cut - written)
            if room <= 0:
                close()
                continue
            part, data = data[:room], data[room:]
            if continuing:
                current[-1] = (p, current[-1][1] + part)
            else:
                current.append((p, part))
            written += len(part)
            if cut is not None and written == cut:
                close()
    close()
    return groups


def push(pool: GlobalPool, store: Store, out: MapOutput, group: bytes) -> None:
    """Store one group as a push session would, in a segment of `pool`."""
    (buf,) = pool.try_take(1) or []
    buf.set_recycler(pool.give)
    buf.memory[: len(group)] = group
    buf.length = len(group)
    store.add(out, buf, checksum(group), check_push(buf.data(), out.attempt, out.shuffle.partitions))


async def serve(pool: GlobalPool, disk: Disk | None, plan: Plan, timeout: float = 10) -> list[bytes]:
    """Every payload a plan's view makes, in order, each checked against its CRC32C (its segment then goes
    back), that it fits a segment, and that the bytes the view says a batch holds (what the traffic counters
    count) are exactly those of its runs."""
    got: list[tuple[list[Chunk], int]] = []
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    view = ReadView(plan, pool, PieceLoader(disk))
    sink = ViewReader(
        view,
        lambda chunks, data: got.append((chunks, data)),
        lambda: 1 << 20,
        lambda: done.set_result(None),
        done.set_exception,
    )
    sink.start()
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        payloads: list[bytes] = []
        for chunks, data in got:
            assert chunks
            batch = []
            for chunk in chunks:
                assert checksum(chunk.buffer.data()) == chunk.crc and 0 < chunk.buffer.length <= pool.segment_size
                batch.append(bytes(chunk.buffer.data()))
                chunk.buffer.release()
            assert data == sum(len(run) for payload in batch for *_, run in unpack(payload))
            payloads += batch
    return payloads


@dataclass
class Output:
    attempt: int
    #: partition -> its bytes
    data: dict[int, bytes]
    groups: list[bytes]


@st.composite
def outputs(draw: st.DrawFn, partitions: int, attempt: int, segment: int) -> Output:
    """One map attempt's data and the groups its writer pushes, at most `segment` bytes each: a partition
    empty, small or spanning several groups, its bytes split over 1-3 flushes in order (so the pieces form
    several ascending sequences), each flush packed in partition order with random early cuts."""
    sizes = draw(
        st.lists(
            st.sampled_from([0, 0, 1, 7, 300, segment - 20, segment + 5, 3 * segment]),
            min_size=partitions,
            max_size=partitions,
        )
    )
    flushes = draw(st.integers(1, 3))
    parts: list[list[tuple[int, bytes]]] = [[] for _ in range(flushes)]
    data: dict[int, bytes] = {}
    for p, size in enumerate(sizes):
        if not size:
            continue
        data[p] = body = bytes((attempt * 31 + p * 7 + i) % 251 for i in range(size))
        points = sorted(draw(st.lists(st.integers(0, size), max_size=2)))
        owners = sorted(draw(st.lists(st.integers(0, flushes - 1), min_size=len(points) + 1, max_size=len(points) + 1)))
        for owner, lo, hi in zip(owners, [0, *points], [*points, size], strict=True):
            if hi > lo:
                parts[owner].append((p, body[lo:hi]))
    groups: list[bytes] = []
    for runs in parts:
        merged: list[tuple[int, bytes]] = []
        for p, d in sorted(runs, key=lambda r: r[0]):  # stable: a partition's parts keep their order
            if merged and merged[-1][0] == p:
                merged[-1] = (p, merged[-1][1] + d)
            else:
                merged.append((p, d))
        total = sum(len(d) for _, d in merged)
        cuts = draw(st.lists(st.integers(1, max(1, total)), max_size=3))
        groups += split(attempt, merged, segment, cuts)
    return Output(attempt, data, groups)


def check(runs: Iterable[tuple[int, int, bytes | memoryview]], want: dict[Pair, bytes]) -> None:
    """Runs (attempt, partition, bytes) as a read served them hold exactly `want`, each pair's runs
    consecutive, each attempt's pairs together and in ascending partition order (one location's read)."""
    got: dict[Pair, bytearray] = {}
    pairs: list[Pair] = []
    attempts: list[int] = []
    for attempt, p, data in runs:
        pair = (p, attempt)
        if not pairs or pairs[-1] != pair:
            assert pair not in got, f"pair {pair} in two runs"
            if attempts and attempts[-1] == attempt:
                assert p > pairs[-1][0], f"attempt {attempt}: partition {p} after {pairs[-1][0]}"
            else:
                assert attempt not in attempts, f"attempt {attempt}'s pairs are not together"
                attempts.append(attempt)
            pairs.append(pair)
        got.setdefault(pair, bytearray()).extend(data)
    assert {k: bytes(v) for k, v in got.items()} == want
