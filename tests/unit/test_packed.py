"""Packed groups (shuffled/protocol/packed.py, PROTOCOL.md §3.3) and read progress (resume.py, §10.6).

The writer half of a wide shuffle's wire: any partitions' data, cut into groups of any size, reads back
identically for every range, however the groups are sliced and combined into payloads; every malformed
payload is refused with the error of the layer that checks it; a relay's progress is a resume point from
which the rest of the data is exactly what was not relayed. (The daemon half, a real daemon storing and
serving such groups, is for the integration tests.)
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable
from itertools import accumulate, pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffled.protocol import packed
from shuffled.protocol.compression import compress_block, decompress_run
from shuffled.protocol.errors import InvalidRequest, ProtocolError, ShuffledError
from shuffled.protocol.integrity import checksum, checksum_parts
from shuffled.protocol.packed import (
    GROUP_HEADER,
    HEADER_SIZE,
    RUN,
    RUN_SIZE,
    U32_MAX,
    Directory,
    LengthTally,
    RunPacker,
    check_push,
    directory,
    group_bytes,
    read_payload,
    slice_group,
    walk,
)
from shuffled.protocol.resume import ReadProgress, Resume

PARTITIONS = 10
Pairs = dict[tuple[int, int], bytes]

#: a map attempt's output: bytes per partition, empty ones included, now and then one much larger than a group
outputs = st.lists(
    st.one_of(st.just(b""), st.binary(min_size=1, max_size=40), st.binary(min_size=200, max_size=500)),
    min_size=PARTITIONS,
    max_size=PARTITIONS,
)
#: the sizes of the memory groups are packed into, in turn: from a few runs to roomy
#: (`test_groups_are_full_but_the_last` goes down to the smallest group, one byte of one run)
capacities = st.lists(st.integers(48, 320), min_size=1, max_size=6)


def pack(attempt: int, data: list[bytes], caps: list[int]) -> list[bytes]:
    """`data` (bytes per partition) packed into groups of the given capacities, in turn."""
    packer = RunPacker.from_lengths([len(d) for d in data], b"".join(data))
    out: list[bytes] = []
    while not packer.done:
        into = memoryview(bytearray(caps[len(out) % len(caps)]))
        out.append(bytes(into[: packer.pack_into(into, attempt)]))
    return out


def pairs_of(payloads: list[bytes], start: int, end: int, attempts: set[int]) -> tuple[Pairs, list[tuple[int, int]]]:
    """What a reader makes of payloads: each pair's bytes, and the pairs of the runs in stream order."""
    got: Pairs = {}
    order: list[tuple[int, int]] = []
    for payload in payloads:
        for d in read_payload(payload, start, end, attempts):
            for p, a, b in d.runs():
                got[(p, d.attempt)] = got.get((p, d.attempt), b"") + payload[a:b]
                order.append((p, d.attempt))
    return got, order


def expected(outputs: dict[int, list[bytes]], start: int, end: int) -> Pairs:
    return {(p, a): d for a, data in outputs.items() for p, d in enumerate(data) if d and start <= p < end}


def consecutive(order: list[tuple[int, int]]) -> bool:
    """Each pair's runs come one after another (§10.1): no pair shows up again after another one."""
    seen: list[tuple[int, int]] = []
    for pair in order:
        if not seen or seen[-1] != pair:
            if pair in seen:
                return False
            seen.append(pair)
    return True


def serve(groups: list[bytes], start: int, end: int, room: int) -> list[bytes]:
    """As a daemon serves a range: each group's part in it, several parts per payload up to `room` bytes."""
    payloads: list[bytes] = []
    current = b""
    for g in groups:
        part = slice_group(memoryview(g), start, end)
        if part is None:
            continue
        piece = b"".join(part.parts)
        if current and len(current) + len(piece) > room:
            payloads.append(current)
            current = b""
        current += piece
    return [*payloads, current] if current else payloads


@settings(max_examples=60, deadline=None)
@given(outputs, outputs, capacities, st.integers(HEADER_SIZE + 9, 800))
def test_any_split_reads_back_identically_for_every_range(
    first: list[bytes], second: list[bytes], caps: list[int], room: int
) -> None:
    """Two attempts' output, packed into groups of any sizes, each checked as a push, then served for every
    range [start, end) as slices of the groups combined into payloads: every pair reads back exactly."""
    outs = {7: first, (1 << 64) - 1: second}
    stored = {a: pack(a, data, caps) for a, data in outs.items()}
    for a, groups in stored.items():
        tally = LengthTally()
        for g in groups:
            assert len(g) <= max(caps)
            tally.add(check_push(g, a, PARTITIONS).entries)
        assert tally.lengths(PARTITIONS).tolist() == [len(d) for d in outs[a]]
    for start in range(PARTITIONS + 1):
        for end in range(start, PARTITIONS + 1):
            payloads = [p for a in outs for p in serve(stored[a], start, end, room)]
            got, order = pairs_of(payloads, start, end, set(outs))
            assert got == expected(outs, start, end), (start, end)
            assert consecutive(order)


@settings(max_examples=100, deadline=None)
@given(outputs, st.lists(st.integers(HEADER_SIZE + 9, 320), min_size=1, max_size=6))
def test_groups_are_full_but_the_last(data: list[bytes], caps: list[int]) -> None:
    """A writer's groups fill their memory (a partition's bytes split where it ends), so a daemon's segments
    are full: only the last group may be shorter, and a group never holds an empty run."""
    groups = pack(3, data, caps)
    for i, g in enumerate(groups[:-1]):
        assert caps[i % len(caps)] - len(g) <= RUN.size, "room left for a directory entry and a byte"
    assert all(0 not in directory(g).lengths for g in groups)


@settings(max_examples=100, deadline=None)
@given(outputs, st.lists(st.integers(4096, 8192), min_size=1, max_size=3), st.booleans())
def test_compressed_runs_read_back(data: list[bytes], caps: list[int], repetitive: bool) -> None:
    """Runs of compressed blocks (§10.5): each group fits its memory, and each pair's blocks decompress to
    its bytes; a block never spans runs."""
    if repetitive:
        data = [d * 40 for d in data]  # compressible, and far larger than a group
    packer = RunPacker.from_lengths([len(d) for d in data], b"".join(data))
    groups: list[bytes] = []
    while not packer.done:
        into = memoryview(bytearray(caps[len(groups) % len(caps)]))
        groups.append(bytes(into[: packer.pack_blocks_into(into, 9, compress_block)]))
    got: dict[int, bytes] = {}
    for g in groups:
        check_push(g, 9, PARTITIONS)
        for p, a, b in directory(g).runs():
            got[p] = got.get(p, b"") + bytes(decompress_run(memoryview(g)[a:b]))
    assert got == {p: d for p, d in enumerate(data) if d}


@settings(max_examples=60, deadline=None)
@given(st.lists(outputs, min_size=1, max_size=3), capacities)
def test_commit_lengths_add_up_every_flush_of_an_attempt(flushes: list[list[bytes]], caps: list[int]) -> None:
    """An attempt's CommitAck lengths from its groups, pushed as one ascending sequence per writer flush (runs
    split across groups, empty partitions, a sequence starting where the last ended): the bytes written."""
    tally = LengthTally()
    for data in flushes:
        for g in pack(3, data, caps):
            tally.add(check_push(g, 3, PARTITIONS).entries)
    assert tally.lengths(PARTITIONS).tolist() == [sum(len(data[p]) for data in flushes) for p in range(PARTITIONS)]


def test_write_sorted_shape_skips_empty_partitions_and_refuses_what_does_not_add_up() -> None:
    data = [b"", b"ab", b"", b"cde"]
    (g,) = pack(1, data, [100])
    assert directory(g).partitions == (1, 3)
    with pytest.raises(ValueError, match="add up"):
        RunPacker.from_lengths([2, 3], b"abcd")
    for lengths in ([2, -1], [0, 2, -1]):  # with and without empty partitions
        with pytest.raises(ValueError, match="negative"):
            RunPacker.from_lengths(lengths, b"a")
    with pytest.raises(ValueError, match="in number"):
        RunPacker(range(3), [1, 1], b"ab")
    with pytest.raises(ValueError, match="ascending"):
        RunPacker([3, 2], [1, 1], b"ab")


# --------------------------------------------------------------------------- malformed payloads

VALID = group_bytes(5, [(1, b"a"), (4, b"bcd"), (8, b"ef")])


def _with_entries(entries: list[int], data: bytes = b"abcdef") -> bytes:
    """A group of attempt 5 with this directory (partition, length, partition, length, ...) and data."""
    return GROUP_HEADER.pack(5, len(entries) // 2) + struct.pack(f">{len(entries)}I", *entries) + data


#: every rule of §3.3 broken once, as a change to a valid group
BREAKS: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda g: b"",
    "short header": lambda g: g[: HEADER_SIZE - 1],
    "count 0": lambda g: GROUP_HEADER.pack(5, 0) + g[HEADER_SIZE:],
    "directory cut short": lambda g: GROUP_HEADER.pack(5, 1000) + g[HEADER_SIZE:],
    "out of order": lambda g: _with_entries([4, 3, 1, 1, 8, 2]),
    "equal partitions": lambda g: _with_entries([1, 1, 1, 3, 8, 2]),
    "empty run": lambda g: _with_entries([1, 1, 4, 0, 8, 2], b"aef"),
    "lengths past the payload": lambda g: g[:-1],
    "trailing bytes": lambda g: g + b"\0",
    "second group malformed": lambda g: g + GROUP_HEADER.pack(5, 0),
}


@pytest.mark.parametrize("rule", sorted(BREAKS))
def test_every_broken_rule_is_refused_at_both_layers(rule: str) -> None:
    bad = BREAKS[rule](VALID)
    with pytest.raises(InvalidRequest):
        check_push(bad, 5, 10)
    if rule != "second group malformed":  # a read payload may hold two groups; this one's second is bad
        with pytest.raises(ProtocolError):
            read_payload(bad, 0, 10, {5})
    else:
        with pytest.raises(ProtocolError, match="no runs"):
            read_payload(bad, 0, 10, {5})


def test_a_group_must_fit_its_stream() -> None:
    with pytest.raises(InvalidRequest, match="attempt 5 pushed for attempt 6"):
        check_push(VALID, 6, 10)
    with pytest.raises(InvalidRequest, match="partition 8"):
        check_push(VALID, 5, 8)
    for start, end in ((2, 10), (0, 8)):
        with pytest.raises(ProtocolError, match="outside the read's range"):
            read_payload(VALID, start, end, {5})
    with pytest.raises(ProtocolError, match="did not name"):
        read_payload(VALID, 0, 10, {6})
    assert check_push(VALID, 5, 9).last == 8 and read_payload(VALID, 1, 9, {5})[0].first == 1


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_a_read_takes_a_group_whole_or_names_its_first_bad_run(data: st.DataObject) -> None:
    """One run, a few and many (past `_LANE_CHECK_RUNS`) are checked by different paths, after another group
    or first in the payload; each takes a group with its own runs or refuses it naming the group's place and
    its first run out of order, else its first empty one."""
    n = data.draw(st.integers(1, 30))
    partitions = sorted(data.draw(st.sets(st.integers(0, 40), min_size=n, max_size=n)))
    lengths = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    fault, i = data.draw(st.sampled_from(["none", "repeated", "swapped", "empty"])), data.draw(st.integers(0, n - 1))
    if fault == "empty":
        lengths[i] = 0
    elif i and fault == "repeated":
        partitions[i] = partitions[i - 1]
    elif i and fault == "swapped":
        partitions[i - 1], partitions[i] = partitions[i], partitions[i - 1]
    runs = list(zip(partitions, lengths, strict=True))
    before = data.draw(st.sampled_from([b"", VALID]))
    group = GROUP_HEADER.pack(5, n) + b"".join(RUN.pack(*run) for run in runs) + bytes(sum(lengths))
    disorder = next((k for k in range(1, n) if partitions[k] <= partitions[k - 1]), 0)
    if disorder:
        why = f"run {disorder} has partition {partitions[disorder]} after {partitions[disorder - 1]}"
    elif 0 in lengths:
        why = f"run {lengths.index(0)} (partition {partitions[lengths.index(0)]}) is empty"
    else:
        d = read_payload(memoryview(before + group), 0, 41, {5})[-1]
        assert (d.partitions, d.lengths) == (tuple(partitions), tuple(lengths))
        assert (d.first, d.last, d.start, d.end) == (partitions[0], partitions[-1], len(before), len(before + group))
        return
    with pytest.raises(ProtocolError) as refused:
        read_payload(before + group, 0, 41, {5})
    assert f"packed group at byte {len(before)} " in str(refused.value) and why in str(refused.value)


def _pushed(group: bytes, attempt: int, partitions: int) -> list[Directory]:
    """A group checked as a push, parsed as the daemon then stores it."""
    check_push(group, attempt, partitions)
    return [directory(group)]


@settings(max_examples=1000, deadline=None)  # as every test here: a loaded machine misses hypothesis's 200 ms
@given(st.binary(max_size=120), st.integers(0, 20))
def test_garbage_raises_only_the_layers_error(data: bytes, partitions: int) -> None:
    """Whatever the bytes, checking them raises InvalidRequest (push) or ProtocolError (read), nothing else,
    and what passes is a real group: its runs lie inside the payload."""
    checks: list[tuple[Callable[[], list[Directory]], type[ShuffledError]]] = [
        (lambda: _pushed(data, 5, partitions), InvalidRequest),
        (lambda: read_payload(data, 0, partitions, {5}), ProtocolError),
    ]
    for check, error in checks:
        try:
            groups = check()
        except error:
            continue
        for d in groups:
            assert all(d.data <= a < b <= len(data) for _, a, b in d.runs())


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_groups_are_refused_or_still_whole(data: st.DataObject) -> None:
    raw = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        got = check_push(bytes(raw), 5, 10)
    except InvalidRequest:
        return
    d = directory(raw)
    assert d.end == len(raw) and list(d.partitions) == sorted(set(d.partitions)) and min(d.lengths) >= 1
    assert (got.first, got.last, got.data_bytes) == (d.first, d.last, d.data_bytes)
    assert got.entries == raw[HEADER_SIZE : d.data]


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1)), min_size=1, max_size=40))
def test_both_run_checks_agree_on_any_directory(runs: list[tuple[int, int]]) -> None:
    """The plain loop (what the mypyc-compiled build checks pushes with) and the C-level calls (pure Python):
    the runs' bytes when the partitions ascend strictly and no run is empty, else -1. Sorted runs too, as
    random ones almost never ascend."""
    for case in (runs, sorted(dict(runs).items())):
        entries = b"".join(RUN.pack(p, n) for p, n in case)
        ascending = all(a[0] < b[0] for a, b in pairwise(case))
        expected = sum(n for _, n in case) if ascending and all(n for _, n in case) else -1
        assert packed._sum_loop(entries) == packed._sum_calls(entries) == expected


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 300), st.data())
def test_both_run_checks_find_one_bad_run_anywhere_in_a_long_directory(n: int, data: st.DataObject) -> None:
    """Directories that ascend but for at most one run (a partition repeated, or below the one before it, or
    a length of zero) at any place of up to 300 runs, partitions up to the largest u32, lengths up to it (their
    sum far past 32 bits): the lane checks of the pure build must see the one bad run wherever its borrow
    lands, and add lengths that fill their lanes without a carry."""
    gaps = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    start = data.draw(st.sampled_from([0, 1, U32_MAX - sum(gaps) + 1]))
    partitions = [start + s - gaps[0] for s in accumulate(gaps)]
    lengths = data.draw(st.lists(st.sampled_from([1, 2, 419, U32_MAX - 1, U32_MAX]), min_size=n, max_size=n))
    bad = data.draw(st.sampled_from(["none", "repeated", "below", "empty"]))
    i = data.draw(st.integers(0, n - 1))
    if bad == "empty":
        lengths[i] = 0
    elif i and bad == "repeated":
        partitions[i] = partitions[i - 1]
    elif i and bad == "below":
        partitions[i] = data.draw(st.integers(0, partitions[i - 1] - 1)) if partitions[i - 1] else 0
    entries = b"".join(RUN.pack(p, length) for p, length in zip(partitions, lengths, strict=True))
    ok = all(a < b for a, b in pairwise(partitions)) and all(lengths)
    assert packed._sum_loop(entries) == packed._sum_calls(entries) == (sum(lengths) if ok else -1)


@pytest.mark.parametrize("n", [1024, 1025, 3640])
def test_both_run_checks_agree_past_the_cached_lanes(n: int) -> None:
    """Directories longer than `_Lanes` are cached for (the most runs a 32 KiB segment holds is 3,640): whole,
    and with one bad run at the start, in the middle and at the end."""
    partitions = list(range(7, 7 + 2 * n, 2))
    lengths = [9] * n

    def check(parts: list[int], lens: list[int], expected: int) -> None:
        entries = b"".join(RUN.pack(p, length) for p, length in zip(parts, lens, strict=True))
        assert packed._sum_loop(entries) == packed._sum_calls(entries) == expected

    check(partitions, lengths, 9 * n)
    for i in (1, n // 2, n - 1):
        check([*partitions[:i], partitions[i - 1], *partitions[i + 1 :]], lengths, -1)
        check(partitions, [*lengths[:i], 0, *lengths[i + 1 :]], -1)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.integers(1, 40), st.integers(1, 5000)), min_size=1, max_size=300),
    st.data(),
)
def test_the_sums_fit_the_most_whole_runs_from_any_guess(lengths: list[int], data: st.DataObject) -> None:
    """Whatever the guess (right, far too few, far too many) and however alike the runs, the sums find the
    most whole runs that fit (run i less its skip, each run with its entry), as adding them one by one does."""
    i = data.draw(st.integers(0, len(lengths) - 1))
    skip = data.draw(st.integers(0, lengths[i] - 1))
    # any room, or one at the edge of what k whole runs take (off by one either way)
    k = data.draw(st.integers(1, len(lengths) - i))
    edge = sum(lengths[i : i + k]) - skip + RUN_SIZE * k + data.draw(st.integers(-1, 1))
    room = data.draw(st.one_of(st.integers(RUN_SIZE + 1, 40_000), st.just(max(edge, RUN_SIZE + 1))))
    guess = data.draw(st.integers(0, 400))
    j, fitted = i, -skip
    while j < len(lengths) and fitted + lengths[j] + RUN_SIZE * (j - i + 1) <= room:
        fitted += lengths[j]
        j += 1
    assert packed._fit_sums(lengths, i, len(lengths), skip, room, guess) == (j, fitted if j > i else 0)


@given(st.lists(st.integers(0, (1 << 32) - 1), max_size=50))
def test_a_zero_run_is_found_and_zero_bytes_across_two_runs_are_not_one(lengths: list[int]) -> None:
    for case in (lengths, [1, 1 << 16, *lengths], [1 << 8, 1 << 24]):  # four zero bytes straddling two runs
        assert packed._has_zero(array("I", case)) == (0 in case)


# --------------------------------------------------------------------------- serving parts of groups


@settings(max_examples=100, deadline=None)
@given(outputs, st.integers(0, PARTITIONS), st.integers(0, PARTITIONS), st.data())
def test_a_slice_with_a_skip_is_the_rest_of_its_first_pair(
    data: list[bytes], lo: int, hi: int, draw: st.DataObject
) -> None:
    """A part of a stored group, less the bytes of its first pair a resumed read already had (§10.6), is a
    group of its own: header, directory slice, data slice, whose CRC32C is computed over the slices."""
    inside = {p: d for p, d in enumerate(data) if d and lo <= p < hi}
    groups = pack(2, data, [1 << 16])
    part = slice_group(memoryview(groups[0]), lo, hi) if groups else None
    if part is None:
        assert not inside
        return
    (g,) = groups
    first = min(inside)
    skip = draw.draw(st.integers(0, len(inside[first]) - 1))
    cut = slice_group(memoryview(g), lo, hi, skip)
    assert cut is not None
    payload = b"".join(cut.parts)
    assert len(payload) == len(cut) and checksum_parts(cut.parts) == checksum(payload)
    d = directory(g)
    assert d.run_length(first) == len(inside[first]) and d.run_length(PARTITIONS) == 0
    got, _ = pairs_of([payload], lo, hi, {2})
    assert got == {(p, 2): d[skip:] if p == first else d for p, d in inside.items()}
    with pytest.raises(ValueError):
        slice_group(memoryview(g), lo, hi, len(inside[first]))


# --------------------------------------------------------------------------- resume


def rest_after(resume: Resume | None, outs: dict[int, list[bytes]], start: int, end: int) -> Pairs:
    """What a copy serves from a resume point (§10.6), over the reference data."""
    want = expected(outs, start, end)
    if resume is None:
        return want
    out: Pairs = {}
    for (p, a), d in want.items():
        if a in resume.done:
            continue
        if a == resume.attempt:
            if p < resume.partition:
                continue
            if p == resume.partition:
                d = d[resume.bytes :]
        if d:
            out[(p, a)] = d
    return out


@settings(max_examples=60, deadline=None)
@given(outputs, outputs, capacities, st.integers(HEADER_SIZE + 9, 800), st.integers(0, 3), st.integers(5, 10))
def test_progress_resumes_exactly_where_a_relay_stopped(
    first: list[bytes], second: list[bytes], caps: list[int], room: int, start: int, end: int
) -> None:
    """After any prefix of a single location's payloads, what was relayed plus what a copy serves from the
    resume point is every pair exactly once, and the resume point fits the request."""
    outs = {11: first, 12: second}
    want = expected(outs, start, end)
    payloads = [p for a, data in outs.items() for p in serve(pack(a, data, caps), start, end, room)]
    progress = ReadProgress()
    relayed: Pairs = {}
    for payload in [b"", *payloads]:  # nothing relayed yet, then after each payload
        if payload:
            counted = progress.add(payload)
            runs = pairs_of([payload], start, end, set(outs))[0]
            assert counted == sum(map(len, runs.values())), "a relay counts the bytes of the runs"
            for k, v in runs.items():
                relayed[k] = relayed.get(k, b"") + v
        resume = progress.resume()
        if resume is not None:
            resume.check(start, end, list(outs))
            assert Resume.from_wire(resume.to_wire()) == resume
        rest = rest_after(resume, outs, start, end)
        assert {k: relayed.get(k, b"") + rest.get(k, b"") for k in want} == want
        assert not (rest.keys() | relayed.keys()) - want.keys()


def test_progress_refuses_a_stream_out_of_order() -> None:
    progress = ReadProgress()
    progress.add(group_bytes(1, [(5, b"a")]))
    with pytest.raises(ProtocolError, match="partition 4 after partition 5"):
        progress.add(group_bytes(1, [(4, b"a")]))
    progress.add(group_bytes(2, [(0, b"a")]))
    with pytest.raises(ProtocolError, match="came back"):
        progress.add(group_bytes(1, [(6, b"a")]))


def test_walk_refuses_a_payload_its_groups_do_not_fill() -> None:
    good = group_bytes(1, [(2, b"xy"), (5, b"abc")])
    assert list(walk(good)) == [(1, 2, 2, 5, 3, 5)]
    for bad in (good[:-1], good + b"\0", GROUP_HEADER.pack(1, 0), good[:HEADER_SIZE] + RUN.pack(5, 9)):
        with pytest.raises(ProtocolError):
            list(walk(bad))


@pytest.mark.parametrize(
    ("resume", "why"),
    [
        (Resume((3,)), "in done are not named"),
        (Resume((), 3, 4, 0), "not a named attempt"),
        (Resume((1,), 1, 4, 0), "not a named attempt"),
        (Resume((), 1, 1, 0), "outside"),
        (Resume((), 1, 6, 0), "outside"),
    ],
)
def test_a_resume_point_must_fit_its_request(resume: Resume, why: str) -> None:
    with pytest.raises(InvalidRequest, match=why):
        resume.check(2, 6, [1, 2])
