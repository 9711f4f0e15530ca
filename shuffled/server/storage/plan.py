"""What a read of a partition range serves, in which order (PROTOCOL.md §10.1).

A plan is the attempts a request names, each with the partitions it wants: one attempt's
pairs go out together, in ascending partition order, then the next attempt's. Attempts
whose data starts on disk come first, in the order it lies in the shuffle's file, then
those whose data starts in an object, then those held only in memory, so a read goes
forward through the file and the objects.

An attempt's *items* are (piece, lo, hi): the pieces overlapping [lo, hi) clamped to it,
found by bisecting its ascending sequences, never by scanning them. An attempt pushed as
several sequences (its writer flushed more than once) has its sequences merged by
partition, so every pair is still one run of consecutive items: where sequences overlap
that costs an item per partition, where one sequence alone covers partitions its pieces
go out as they are. Items are made lazily, as the read goes: a plan holds one entry per
attempt, never one per block, and a piece found on disk or in memory when it is served.

A resumed read (§10.6) starts with the attempt in progress from its partition in
progress, leaving out the bytes of that pair already relayed, then serves the named
attempts not relayed whole.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...protocol.errors import InvalidRequest, PartitionNotFound
from ...protocol.resume import Resume
from .shuffles import MapOutput, ShuffleData, touch
from .store import Store


def lookup(
    store: Store, app: str, shuffle: int, start: int, end: int, attempts: list[int], *, digest: bytes
) -> tuple[ShuffleData, list[MapOutput]] | None:
    """The shuffle and these committed attempts, for a read of partitions [start, end); None for a
    shuffle this daemon does not hold when no attempt is named.

    The one gate every path that serves stored bytes passes, at the moment it serves (a client's read,
    a peer's relayed or resumed read, a failover to this daemon's own copy, a drain's copy): `digest`,
    the requester's token digest, must be the one the application is bound to now (`authorize`). A
    check made once, when a request arrives, is not enough: an application with no data here yet has
    no binding, and its first push binds it while a read naming it waits to fail over here.
    """
    store.app_keys.authorize(app, digest)
    data = store.apps.get(app, {}).get(shuffle)
    if data is None:
        if not attempts:
            return None
        raise PartitionNotFound(f"shuffle {app}/{shuffle} is not held by this daemon")
    if not 0 <= start <= end <= data.partitions:
        raise InvalidRequest(f"partition range [{start}, {end}) outside 0..{data.partitions}")
    committed = data.committed
    missing = [a for a in attempts if a not in committed]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise PartitionNotFound(f"map attempts not committed here for {app}/{shuffle}: {shown}")
    data.usage.last_active = time.monotonic()
    touch(data)
    return data, [committed[a] for a in attempts]


#: (piece index, lo, hi, whether it is the piece's last item in this plan)
Item = tuple[int, int, int, bool]


@dataclass(slots=True)
class Entry:
    """One attempt's part of a plan: its partitions [lo, hi), the first `skip` bytes of pair `lo` left out,
    and the index range of the pieces overlapping them in each of its sequences."""

    out: MapOutput
    lo: int
    hi: int
    skip: int = 0
    ranges: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        firsts, lasts, lo, hi = self.out.firsts, self.out.lasts, self.lo, self.hi
        for s, e in self.out.sequences():
            i0 = bisect_left(lasts, lo, s, e)
            i1 = bisect_left(firsts, hi, i0, e)
            if i0 < i1:
                self.ranges.append((i0, i1))

    @property
    def pieces(self) -> int:
        return sum(i1 - i0 for i0, i1 in self.ranges)


class Plan:
    """The entries of one read, in serving order (see the module), and the pieces they overlap."""

    __slots__ = ("data", "entries", "pieces")

    def __init__(self, data: ShuffleData | None, entries: list[Entry]) -> None:
        self.data = data
        self.entries = [e for e in entries if e.ranges or e.skip]
        self.pieces = sum(e.pieces for e in self.entries)


def _placed(out: MapOutput) -> tuple[float, int]:
    """Where an attempt's data starts: its place and offset there (the file first, then the objects in the
    order they were written), or after all of them if it is in memory."""
    return (out.places[0], out.offsets[0]) if out.spilled else (float("inf"), 0)


def make_plan(
    store: Store,
    app: str,
    shuffle: int,
    start: int,
    end: int,
    attempts: list[int],
    resume: Resume | None = None,
    *,
    digest: bytes,
) -> Plan:
    """The plan of a read of partitions [start, end) of these committed attempts by the holder of a token
    with this `digest` (`lookup` checks it). Everything is checked here except that the resumed pair
    holds `bytes` bytes, which its items tell (`items`)."""
    found = lookup(store, app, shuffle, start, end, attempts, digest=digest)
    if found is None:
        return Plan(None, [])
    data, outs = found
    first: list[Entry] = []
    if resume is not None:
        resume.check(start, end, attempts)
        if resume.attempt is not None:
            first = [Entry(data.committed[resume.attempt], resume.partition, end, resume.bytes)]
        named = {*resume.done, resume.attempt}
        outs = [o for o in outs if o.attempt not in named]
    if start == end:
        return Plan(data, [])
    outs.sort(key=_placed)
    return Plan(data, [*first, *(Entry(o, start, end) for o in outs)])


def items(entry: Entry) -> Iterator[Item]:
    """The entry's items, pairs in ascending order, each pair's in push order."""
    out, lo, hi, ranges = entry.out, entry.lo, entry.hi, entry.ranges
    firsts, lasts = out.firsts, out.lasts
    if len(ranges) == 1:
        i0, i1 = ranges[0]
        for i in range(i0, i1):  # a comparison, not max/min calls: this runs for every piece a read serves
            first, end = firsts[i], lasts[i] + 1
            yield i, first if first > lo else lo, end if end < hi else hi, True
        return
    yield from _merged(firsts, lasts, lo, hi, ranges)


def _merged(firsts: Any, lasts: Any, lo: int, hi: int, ranges: list[tuple[int, int]]) -> Iterator[Item]:
    """Several sequences merged by partition. Each cursor is [piece, end of its range, the lowest
    partition of the piece not served yet]; a partition several cursors hold goes out cursor by cursor
    (each with every piece of its sequence holding it), a stretch one cursor alone holds in one item."""
    cursors = [[i0, i1, max(lo, firsts[i0])] for i0, i1 in ranges]

    def advance(c: list[int], q: int) -> None:
        i = c[0]
        if q > lasts[i] or q >= hi:
            c[0] = i = i + 1
            c[2] = max(lo, firsts[i]) if i < c[1] else hi
        else:
            c[2] = q

    while cursors:
        p = min(c[2] for c in cursors)
        holding = [c for c in cursors if c[2] == p]
        if len(holding) == 1:
            c = holding[0]
            i = c[0]
            q = min([lasts[i] + 1, hi, *(d[2] for d in cursors if d is not c)])
            yield i, p, q, q > lasts[i] or q >= hi
            advance(c, q)
        else:
            for c in holding:
                while c[0] < c[1] and c[2] == p:
                    i = c[0]
                    yield i, p, p + 1, p >= lasts[i] or p + 1 >= hi
                    advance(c, p + 1)
        cursors = [c for c in cursors if c[0] < c[1]]
