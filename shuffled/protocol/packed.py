"""Packed groups, the one payload format of the data frames (PROTOCOL.md §3.3); no IO.

A group carries bytes of many reduce partitions of one map attempt: a 12-byte header (attempt
u64, count u32), a directory of `count` runs (partition u32, length u32: partitions strictly
ascending, every length at least 1), then the runs' bytes back to back. A PushData payload is
exactly one group, a BufferResponse payload one or more back to back.

With thousands of reduce partitions a block is a few hundred bytes, so the per-block metadata
lives in these directories, never in Python objects: everything here costs a few calls per
group (per 32 KiB buffer), and the work per run happens inside C-level calls (struct with a
repeat count, array, itertools, bisect, sum). Where mypyc compiles this module (setup.py), the
daemon's check of a push is instead a plain loop, native code there. Who uses what:

- writers: `RunPacker` fills caller-provided memory (a pool segment) with groups;
- a daemon taking a push: `check_push` (InvalidRequest), `LengthTally` of the checked directories
  for the CommitAck;
- readers: `read_payload` (ProtocolError), then `Directory.runs` per group;
- a daemon serving a range: `directory` of a stored group and `slice_group` for the part of it
  a read wants (header + directory slice + data slice, no copy).
"""

from __future__ import annotations

import functools
import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from itertools import accumulate, compress, islice, repeat
from operator import lt
from types import FunctionType
from typing import Any, NoReturn

from .errors import InvalidRequest, ProtocolError, ShuffledError

#: attempt u64, count u32
GROUP_HEADER = struct.Struct(">QI")
#: one directory entry: partition u32, length u32
RUN = struct.Struct(">II")
HEADER_SIZE = GROUP_HEADER.size  # 12
RUN_SIZE = RUN.size  # 8
#: the largest run length and partition a directory entry holds
U32_MAX = (1 << 32) - 1

#: what the functions here read groups from
BytesLike = bytes | bytearray | memoryview


@functools.lru_cache(maxsize=512)
def _entries(n: int) -> struct.Struct:
    """A directory of n runs in one struct call: 2n u32, partition and length alternating (one repeated code:
    a cached struct is ~136 bytes whatever n is)."""
    return struct.Struct(f">{2 * n}I")


#: directories up to this many runs have a cached lengths-only struct. Its size grows with n (two codes a
#: run, ~32 bytes each), and n comes from whoever sent the group: 512 entries of at most 64 runs hold
#: at most ~2 MiB, where uncapped ones of thousands of runs held tens of MiB
_LENGTHS_ONLY_RUNS = 64


@functools.lru_cache(maxsize=512)
def _lengths_only(n: int) -> struct.Struct:
    """Only the n lengths of a directory (the partitions skipped as pad bytes): what walking a payload needs."""
    return struct.Struct(">" + "4xI" * n)


class _Lanes:
    """A directory of n runs read as one big-endian integer: a 64-bit lane a run, the first run's the most
    significant, its partition in the lane's high half and its length in the low one. A check of every run is
    then a few big-integer operations (C loops over the digits), not an int object and a comparison a run.
    The checks take a lane-wise difference whose operands are zero in one half of every lane: while no lane
    goes below zero, none borrows and that half stays zero everywhere. `ascending` works in the high halves:
    the last lane that goes below zero borrows from the one before it, whose low half becomes all ones (the
    first lane's too: a negative int's bits are its two's complement). `all_nonzero` works in the low halves:
    a lane that goes below zero wraps to all ones, its high half with it."""

    __slots__ = ("folds", "high", "low", "ones", "step")

    def __init__(self, n: int) -> None:
        #: every lane's low half, every lane's high half, 1 in every lane, 1 in every lane's high half but the
        #: first lane's
        self.low = int.from_bytes(b"\0\0\0\0\xff\xff\xff\xff" * n, "big")
        self.high = self.low << 32
        self.ones = self.low // U32_MAX
        self.step = (self.ones >> 64) << 32
        #: `total`'s steps: the bits of the lower half of the lanes left, and their mask
        self.folds: list[tuple[int, int]] = []
        while n > 1:
            bits = (n >> 1) << 6
            self.folds.append((bits, (1 << bits) - 1))
            n -= n >> 1

    def ascending(self, runs: int) -> bool:
        """Whether the partitions ascend strictly: each less the one before it, less one, at least zero."""
        partitions = runs & self.high
        gaps = partitions - (partitions >> 64) - self.step
        return not gaps & self.low

    def all_nonzero(self, lengths: int) -> bool:
        """Whether no length (`runs & low`) is zero: each less one at least zero."""
        less_one = lengths - self.ones
        return not less_one & self.high

    def total(self, lengths: int) -> int:
        """The sum of the lengths (`runs & low`): the upper lanes added to the lower ones until one is left. No
        lane carries into the next: a sum of n < 2**32 lengths below 2**32 is below 2**64."""
        for bits, lower in self.folds:
            lengths = (lengths >> bits) + (lengths & lower)
        return lengths


#: directories up to this many runs have their `_Lanes` cached (five ints of about 8.5 bytes a run: 128 of at
#: most 1,024 runs hold at most 6 MiB); a longer one builds its own, about 1.5 times what its check takes and
#: still less than a check that makes an int a run
_CACHED_LANES_RUNS = 1024
_cached_lanes = functools.lru_cache(maxsize=128)(_Lanes)


#: a reader checks directories of more runs than this with `_sum_runs` and reads their tuples only if asked
#: for; up to it, unpacking the tuples and comparing them costs less than the lane check (measured: even at
#: about 20 runs, 1.3 times the cost at 3 to 5)
_LANE_CHECK_RUNS = 20


def _lanes(n: int) -> _Lanes:
    return _cached_lanes(n) if n <= _CACHED_LANES_RUNS else _Lanes(n)


def _run_bytes(payload: BytesLike, offset: int, n: int) -> int:
    """The sum of the lengths of the n-run directory at `offset`. Past `_LENGTHS_ONLY_RUNS` runs, unpacking the
    partitions too costs about the same as skipping them (measured at 500 and 2,000 runs)."""
    if n <= _LENGTHS_ONLY_RUNS:
        return sum(_lengths_only(n).unpack_from(payload, offset))
    return sum(_entries(n).unpack_from(payload, offset)[1::2])


class Directory:
    """One group of a payload as parsed: its attempt, its first and last partitions and where its parts lie in
    the payload; the runs (`partitions`, `lengths`) of a group of one run or of a long directory are read from
    the payload when first asked for, which must hold the group until then. A reader that takes groups in
    bulk and never asks so makes no int a run: at 10,000 partitions that was most of what a client's bulk
    read spent more than at 200 (py-spy).

    A plain class, made once per group a reader receives: a frozen dataclass sets each field through
    `object.__setattr__`, five times the cost (1.6 against 0.3 µs), which a 32 KiB buffer of one run pays
    on the relayed read's critical path."""

    __slots__ = ("_runs", "_view", "attempt", "data", "end", "first", "last", "start")

    def __init__(
        self,
        view: BytesLike,
        attempt: int,
        start: int,
        data: int,
        end: int,
        first: int,
        last: int,
        runs: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
    ) -> None:
        self._view = view
        self.attempt = attempt
        #: offset of the group's header in its payload
        self.start = start
        #: offset of the group's first data byte, and one past its last
        self.data = data
        self.end = end
        self.first = first
        self.last = last
        #: the runs' partitions and lengths, once read
        self._runs = runs

    @property
    def partitions(self) -> tuple[int, ...]:
        return self._read_runs()[0]

    @property
    def lengths(self) -> tuple[int, ...]:
        return self._read_runs()[1]

    def _read_runs(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if self._runs is None:
            n = (self.data - self.start - HEADER_SIZE) // RUN_SIZE
            entries = _entries(n).unpack_from(self._view, self.start + HEADER_SIZE)
            self._runs = entries[0::2], entries[1::2]
        return self._runs

    @property
    def data_bytes(self) -> int:
        return self.end - self.data

    def runs(self) -> Iterator[tuple[int, int, int]]:
        """(partition, first byte, end byte) of each run, offsets in the payload."""
        bounds = tuple(accumulate(self.lengths, initial=self.data))
        return zip(self.partitions, bounds[:-1], bounds[1:], strict=True)

    def add_runs(self, out: list[tuple[int, int, int, int]]) -> None:
        """Append (partition, attempt, first byte, end byte) of each run to `out`: a reader's chunks, made in
        C-level calls (one tuple a run, the group's one-run case without the bounds)."""
        if self.first == self.last:  # one run (in a checked group, partitions ascend strictly)
            out.append((self.first, self.attempt, self.data, self.end))
            return
        bounds = tuple(accumulate(self.lengths, initial=self.data))
        out.extend(zip(self.partitions, repeat(self.attempt), bounds[:-1], bounds[1:]))

    def run_length(self, partition: int) -> int:
        """Bytes of `partition` in this group (0 if it has no run here)."""
        i = bisect_left(self.partitions, partition)
        return self.lengths[i] if i < len(self.partitions) and self.partitions[i] == partition else 0


def _parse(view: BytesLike, start: int, end: int, error: type[ShuffledError]) -> Directory:
    """The group at `start`, checked against everything it says of itself (§3.3 rules 1-4); its data may run
    past `end`, which the caller judges. `error` is what a malformed group is at the caller's layer."""
    if end - start < HEADER_SIZE:
        raise error(f"packed group at byte {start}: {end - start} bytes are shorter than its 12-byte header")
    attempt, n = GROUP_HEADER.unpack_from(view, start)
    if n == 0:
        raise error(f"packed group at byte {start} (attempt {attempt}) has no runs (count 0)")
    data = start + HEADER_SIZE + RUN_SIZE * n
    if data > end:
        raise error(
            f"packed group at byte {start} (attempt {attempt}): a directory of {n} runs needs {RUN_SIZE * n} "
            f"bytes, {end - start - HEADER_SIZE} follow the header"
        )
    at = start + HEADER_SIZE
    if n == 1:  # most groups of a narrow shuffle: its run is read again only if asked for
        first, total = RUN.unpack_from(view, at)
        if not total:
            _refuse(view, start, attempt, n, error)
        return Directory(view, attempt, start, data, data + total, first, first)
    if n > _LANE_CHECK_RUNS:  # no int a run; the runs' tuples are read only if asked for
        total = _sum_runs(bytes(memoryview(view)[at:data]))
        if total < 0:
            _refuse(view, start, attempt, n, error)
        first = RUN.unpack_from(view, at)[0]
        return Directory(view, attempt, start, data, data + total, first, RUN.unpack_from(view, data - RUN_SIZE)[0])
    entries = _entries(n).unpack_from(view, at)
    partitions, lengths = entries[0::2], entries[1::2]
    if 0 in lengths or not all(map(lt, partitions, islice(partitions, 1, None))):
        _refuse(view, start, attempt, n, error)
    end = data + sum(lengths)
    return Directory(view, attempt, start, data, end, partitions[0], partitions[-1], (partitions, lengths))


def _refuse(view: BytesLike, start: int, attempt: int, n: int, error: type[ShuffledError]) -> NoReturn:
    """Why the directory of the group at `start` is malformed: the first run out of order, else the first
    empty one (what the run check found, told run by run)."""
    entries = _entries(n).unpack_from(view, start + HEADER_SIZE)
    partitions, lengths = entries[0::2], entries[1::2]
    i = next((i for i in range(1, n) if partitions[i] <= partitions[i - 1]), 0)
    if i:
        raise error(
            f"packed group at byte {start} (attempt {attempt}): partitions are not strictly ascending "
            f"(run {i} has partition {partitions[i]} after {partitions[i - 1]})"
        )
    if 0 not in lengths:
        raise AssertionError("the run check refused a directory that the runs one by one pass")
    i = lengths.index(0)
    raise error(f"packed group at byte {start} (attempt {attempt}): run {i} (partition {partitions[i]}) is empty")


def _past_end(start: int, attempt: int, held: int, follow: int) -> str:
    return (
        f"packed group at byte {start} (attempt {attempt}): its runs hold {held} bytes, {follow} follow its directory"
    )


class PushedGroup:
    """A pushed group as `check_push` found it: what the store indexes it by, and its directory's entries as
    they came (8 bytes a run, big-endian) for the map output's `LengthTally`. No tuple of runs: building one
    (a Python int a partition and a length) was a third of the check's cost per run."""

    __slots__ = ("attempt", "data_bytes", "entries", "first", "last")

    def __init__(self, attempt: int, first: int, last: int, data_bytes: int, entries: bytes) -> None:
        self.attempt = attempt
        self.first = first
        self.last = last
        #: bytes of its runs
        self.data_bytes = data_bytes
        self.entries = entries


def _sum_calls(entries: bytes) -> int:
    """Bytes of the runs of a directory's `entries`, -1 unless their partitions ascend strictly and no run is
    empty: the directory read as one integer (`_Lanes`), a few big-integer operations a group whatever its
    runs (an int a partition and a length and a comparison a run cost about twice as much at 77 runs)."""
    lanes = _lanes(len(entries) // RUN_SIZE)
    runs = int.from_bytes(entries, "big")
    lengths = runs & lanes.low
    if not lanes.ascending(runs) or not lanes.all_nonzero(lengths):
        return -1
    return lanes.total(lengths)


def _sum_loop(entries: bytes) -> int:
    """As `_sum_calls`, as one plain loop over the bytes: compiled by mypyc it is native code without an int
    object a run, several times faster than the C-level calls; interpreted it is slower than them."""
    total = 0
    last = -1
    for k in range(0, len(entries), RUN_SIZE):
        partition = (entries[k] << 24) | (entries[k + 1] << 16) | (entries[k + 2] << 8) | entries[k + 3]
        length = (entries[k + 4] << 24) | (entries[k + 5] << 16) | (entries[k + 6] << 8) | entries[k + 7]
        if partition <= last or length == 0:
            return -1
        last = partition
        total += length
    return total


#: mypyc-compiled (setup.py's COMPILED) functions are not Python functions: whether this module's plain loops
#: are native code, where they beat C-level calls (which make an int object a run)
_NATIVE = not isinstance(_sum_loop, FunctionType)
_sum_runs: Callable[[bytes], int] = _sum_loop if _NATIVE else _sum_calls


def check_push(group: BytesLike, attempt: int, partitions: int) -> PushedGroup:
    """A PushData payload, checked as the daemon must (§7.10): exactly one well-formed group of the stream's
    `attempt` whose partitions are below the map output's `partitions`. InvalidRequest says what is wrong."""
    end = len(group)
    total = -1
    if end >= HEADER_SIZE:
        got, n = GROUP_HEADER.unpack_from(group)
        data = HEADER_SIZE + RUN_SIZE * n
        if n and data <= end:
            entries = bytes(group[HEADER_SIZE:data])
            total = _sum_runs(entries)
    if total < 0:  # malformed: the full parse says how
        _parse(group, 0, end, InvalidRequest)
        raise AssertionError("a packed group the run check refused passed the full parse")
    if data + total != end:
        if data + total > end:
            raise InvalidRequest(_past_end(0, got, total, end - data))
        raise InvalidRequest(f"{end - data - total} bytes after the packed group's {total} bytes of runs")
    if got != attempt:
        raise InvalidRequest(f"packed group of attempt {got} pushed for attempt {attempt}")
    first, _ = RUN.unpack_from(entries)
    last, _ = RUN.unpack_from(entries, len(entries) - RUN_SIZE)
    if last >= partitions:
        raise InvalidRequest(f"packed group has partition {last}; the map output has {partitions} partitions")
    return PushedGroup(got, first, last, total, entries)


def read_payload(payload: BytesLike, start: int, end: int, attempts: Container[int]) -> list[Directory]:
    """A BufferResponse DATA payload, checked as a reader must (§7.6): one or more well-formed groups back to
    back, filling it exactly, of the named `attempts`, their partitions within [start, end). ProtocolError
    says what is wrong (the reader fails that read stream with it)."""
    size = len(payload)
    out: list[Directory] = []
    offset = 0
    while True:
        d = _parse(payload, offset, size, ProtocolError)
        if d.end > size:
            raise ProtocolError(_past_end(d.start, d.attempt, d.data_bytes, size - d.data))
        if d.attempt not in attempts:
            raise ProtocolError(f"packed group at byte {offset} is of attempt {d.attempt}, which the read did not name")
        if d.first < start or d.last >= end:
            raise ProtocolError(
                f"packed group at byte {offset} (attempt {d.attempt}) has partitions {d.first}..{d.last}, "
                f"outside the read's range [{start}, {end})"
            )
        out.append(d)
        offset = d.end
        if offset == size:
            return out


def directory(group: BytesLike, start: int = 0) -> Directory:
    """The directory of a group already checked (a stored piece): one struct call, no checks."""
    attempt, n = GROUP_HEADER.unpack_from(group, start)
    entries = _entries(n).unpack_from(group, start + HEADER_SIZE)
    partitions, lengths = entries[0::2], entries[1::2]
    data = start + HEADER_SIZE + RUN_SIZE * n
    return Directory(
        group, attempt, start, data, data + sum(lengths), partitions[0], partitions[-1], (partitions, lengths)
    )


def data_bytes(group: BytesLike, length: int = -1) -> int:
    """Bytes of the runs of one checked group (a stored piece, `length` bytes from the start of `group` if
    given, else all of it): its length less its header and directory, from the count in its header (what the
    daemon's traffic counters count, like Spark's shuffle metrics)."""
    n: int = GROUP_HEADER.unpack_from(group)[1]
    return (len(group) if length < 0 else length) - HEADER_SIZE - RUN_SIZE * n


def walk(payload: BytesLike) -> list[tuple[int, int, int, int, int, int]]:
    """(attempt, runs, first partition, last partition, last run's length, bytes of its runs) of each group of a
    payload, without unpacking what that does not need (a relay's progress, resume.py): a list, not a generator
    (a relay walks every payload it relays), a group of one run in two struct calls. ProtocolError where a
    group's bounds do not lie inside the payload."""
    size = len(payload)
    out: list[tuple[int, int, int, int, int, int]] = []
    offset = 0
    while offset < size:
        if size - offset < HEADER_SIZE:
            raise ProtocolError(f"{size - offset} bytes at the end of a payload are not a packed group")
        attempt, n = GROUP_HEADER.unpack_from(payload, offset)
        data = offset + HEADER_SIZE + RUN_SIZE * n
        if n == 0 or data > size:
            raise ProtocolError(f"packed group at byte {offset} has a count of {n} that its payload cannot hold")
        last, length = RUN.unpack_from(payload, data - RUN_SIZE)
        if n == 1:
            first, end = last, data + length
        else:
            first = RUN.unpack_from(payload, offset + HEADER_SIZE)[0]
            end = data + _run_bytes(payload, offset + HEADER_SIZE, n)
        if end > size:
            raise ProtocolError(f"packed group at byte {offset} ends at byte {end}, past its payload's {size}")
        out.append((attempt, n, first, last, length, end - data))
        offset = end
    return out


def group_bytes(attempt: int, runs: Iterable[tuple[int, BytesLike]]) -> bytes:
    """One group of (partition, data) runs, in the order given (tests, vectors, examples: a run at a time)."""
    listed = [(p, bytes(data)) for p, data in runs]
    head = struct.pack(f">QI{2 * len(listed)}I", attempt, len(listed), *(v for p, d in listed for v in (p, len(d))))
    return head + b"".join(d for _, d in listed)


# --------------------------------------------------------------------------- serving parts of groups


class GroupSlice:
    """Part of a stored group as a group of its own: a new header (with the first entry when a skip shortened
    that run), the rest of the directory slice and the data slice of the original (memoryviews, no copy).

    A plain class, not a dataclass: compiled by mypyc, a dataclass's `memoryview` fields are looked up as
    module globals when its annotations are built at import (mypyc knows no memoryview type), a KeyError."""

    __slots__ = ("data", "directory", "head")

    def __init__(self, head: bytes, directory: memoryview, data: memoryview) -> None:
        self.head = head
        self.directory = directory
        self.data = data

    @property
    def parts(self) -> tuple[bytes, memoryview, memoryview]:
        """What goes on the wire, in order (writelines; a CRC over them with `integrity.checksum_parts`)."""
        return self.head, self.directory, self.data

    def __len__(self) -> int:
        return len(self.head) + len(self.directory) + len(self.data)


def slice_group(group: memoryview, lo: int, hi: int, skip: int = 0) -> GroupSlice | None:
    """The runs of a (checked) group with partitions in [lo, hi), without the first `skip` bytes of the first
    of them (a resumed pair, §10.6); None when no run is in the range. One struct call for the directory, two
    bisects; ValueError if `skip` is not less than that first run's length."""
    d = directory(group)
    i = bisect_left(d.partitions, lo)
    j = bisect_left(d.partitions, hi, i)
    if i == j:
        return None
    lengths = d.lengths
    data_start = d.data + sum(lengths[:i])
    data_end = data_start + sum(lengths[i:j])
    entries = HEADER_SIZE + RUN_SIZE * i
    if skip:
        if not 0 < skip < lengths[i]:
            raise ValueError(f"cannot skip {skip} bytes of a run of {lengths[i]}")
        head = GROUP_HEADER.pack(d.attempt, j - i) + RUN.pack(d.partitions[i], lengths[i] - skip)
        entries += RUN_SIZE
        data_start += skip
    else:
        head = GROUP_HEADER.pack(d.attempt, j - i)
    return GroupSlice(head, group[entries : HEADER_SIZE + RUN_SIZE * j], group[data_start:data_end])


# --------------------------------------------------------------------------- the CommitAck's lengths


class LengthTally:
    """Bytes per partition of one map attempt, summed from its groups' directories for its CommitAck.

    Sparse: it keeps the directory entries as they came (8 bytes a run, one C-level copy per group), not a
    slot per partition, so an open map output of a million partitions costs what it wrote. A run that
    continues the previous group's last run (a partition split across groups) is kept as an addition to
    that run's entry, so the entries of an attempt pushed as one ascending sequence name each partition
    once, in order. `lengths` sums them once, at the commit.
    """

    __slots__ = ("_ascending", "_carries", "_entries", "_last")

    def __init__(self) -> None:
        self._entries = bytearray()
        #: (entry, bytes) to add to an entry's length: the continuations of its run in later groups
        self._carries: list[tuple[int, int]] = []
        #: the last partition added (-1: none yet)
        self._last = -1
        #: every group's runs come after the previous group's (one ascending sequence)
        self._ascending = True

    def add(self, entries: BytesLike) -> None:
        """The directory entries of one checked group (`PushedGroup.entries`, `group_entries`)."""
        first, length = RUN.unpack_from(entries)
        last = self._last
        self._last = RUN.unpack_from(entries, len(entries) - RUN_SIZE)[0]
        if first == last:  # the last partition's bytes continue
            self._carries.append((len(self._entries) // RUN_SIZE - 1, length))
            self._entries += memoryview(entries)[RUN_SIZE:]
            return
        if first < last:  # a new sequence: the writer flushed its buffer again
            self._ascending = False
        self._entries += entries

    def lengths(self, partitions: int) -> array[int]:
        """Bytes per partition 0..partitions-1 as u64 items, once per map output (what the CommitAck packs with
        one copy; a list would be a Python int a partition, `tolist` where one is compared). The entries'
        lengths as u64 with C-level calls (the partitions' bytes zeroed: an entry is then a big-endian u64 of
        its length), the carries added; they are the answer when they name every partition once, in order
        (one ascending sequence without an empty partition); else a plain loop sums the runs into place."""
        entries = self._entries
        count = len(entries) // RUN_SIZE
        wide = bytearray(entries)
        zeros = bytes(count)
        for k in range(4):
            wide[k::RUN_SIZE] = zeros
        lengths = array("Q", wide)
        if _SWAP:
            lengths.byteswap()
        for k, extra in self._carries:
            lengths[k] += extra
        if self._ascending and count == partitions:
            return lengths
        parts = array("I", entries)
        if _SWAP:
            parts.byteswap()
        out = [0] * partitions
        for p, n in zip(parts[0::2], lengths, strict=True):
            out[p] += n
        return array("Q", out)


def group_entries(group: BytesLike) -> memoryview:
    """The directory entries of a checked group (a stored piece), for a `LengthTally`: no copy."""
    n: int = GROUP_HEADER.unpack_from(group)[1]
    return memoryview(group)[HEADER_SIZE : HEADER_SIZE + RUN_SIZE * n]


# --------------------------------------------------------------------------- writers

#: a directory entry template is written big-endian from a native array of 4-byte items
_SWAP = sys.byteorder == "little"
assert array("I").itemsize == 4
#: the smallest compressed block a writer cuts to fill the rest of a buffer (smaller rests stay empty)
MIN_BLOCK = 256


@functools.lru_cache(maxsize=8)
def _range_array(n: int) -> array[int]:
    """Partitions 0..n-1 as u32 items: what every map output of an n-partition shuffle packs (never written to)."""
    return array("I", range(n))


def _ascending(partitions: Iterable[int]) -> array[int]:
    """`partitions` as u32 items (a range 0..n-1 from a cache: building it is a third of a packer's set-up)."""
    if isinstance(partitions, range) and partitions.start == 0 and partitions.step == 1:
        return _range_array(partitions.stop)
    return array("I", partitions)


def _fit_sums(lengths: list[Any], i: int, count: int, skip: int, room: int, guess: int) -> tuple[int, int]:
    """How many whole runs from run `i` on (the first less its `skip` packed bytes) fit `room` bytes with their
    directory entries: (the first run that does not, their data bytes). One or two whole runs (runs of
    kilobytes) are settled by looking at them; more with sums of slices of the lengths (C-level, no new int a
    run) at a few probes: the `guess` first (the last group's count: neighbouring runs are alike), then where
    the runs just probed say the room ends (the next run, when they say it is here); while no run that does
    not fit is known, at least twice as far on each time, and once one is, halfway whenever a probe did not
    halve what is left open: two probes when the guess is right, a few more when it is off. The lengths are
    ints or what `int` takes (numpy's), made ints where they are added up (compiled, an int is checked)."""
    fitted = int(lengths[i]) - skip  # the bytes of runs i..lo-1, the first less `skip`
    if fitted + RUN_SIZE > room:
        return i, 0
    if i + 1 == count:
        return i + 1, fitted
    second = int(lengths[i + 1])
    if fitted + second + 2 * RUN_SIZE > room:
        return i + 1, fitted
    fitted += second
    lo, hi = i + 2, count + 1  # runs i..lo-1 fit with their entries, runs i..hi-1 do not (count + 1: none known)
    j = min(count, max(i + guess, lo + 1))
    least = 1
    while lo < count:
        span = hi - lo
        more = int(sum(lengths[lo:j]))
        per = more // (j - lo) + RUN_SIZE
        if fitted + more + RUN_SIZE * (j - i) <= room:
            lo, fitted = j, fitted + more
        else:
            hi = j
        if hi - lo <= 1:
            break
        ahead = (room - fitted - RUN_SIZE * (lo - i)) // per
        if ahead == 0:
            j = lo + 1
        elif hi > count:
            j = min(count, lo + max(least, ahead))
            least *= 2
        elif 2 * (hi - lo) > span:
            j = (lo + hi) // 2
        else:
            j = min(hi - 1, lo + ahead)
    return lo, fitted


#: a u32 of 0, as bytes
_ZERO_RUN = bytes(4)


def _has_zero(runs: array[int]) -> bool:
    """Whether the u32 `runs` hold a 0, without an int an item: a search of their bytes for four zero bytes,
    exact where it lands on an item's start; the items are compared only when four zeros straddle two of
    them first (zero bytes at the end of one length and the start of the next)."""
    at = runs.tobytes().find(_ZERO_RUN)
    return at >= 0 and (at % 4 == 0 or 0 in runs)


class RunPacker:
    """Data already grouped by partition (ascending), packed into groups that fill caller-provided memory.

    The directory of every group is a slice of one big-endian template built with C-level calls when the
    packer is made; a group is then a header, that slice (its first and last entry rewritten when a run is
    split across groups) and one slice copy of the data: a few calls per group whatever its run count.
    Which whole runs fit a group: sums over slices of the lengths from a guess (`_fit_sums`), with no run
    ends (their `accumulate`, an int a run, was over half the set-up at 10,000 partitions); compiled, that
    beats a native loop over the template's lengths too.
    """

    __slots__ = ("_data", "_guess", "_i", "_lengths", "_offset", "_parts", "_skip", "_template")

    def __init__(
        self, partitions: Iterable[int], lengths: Iterable[int], data: BytesLike, *, ascending: bool = False
    ) -> None:
        """`lengths[k]` bytes of partition `partitions[k]` lie back to back in `data`; zero lengths are skipped.
        ValueError unless the partitions ascend strictly (checked unless the caller says they do, `ascending`:
        sorted keys; a range needs no check either) and the lengths add up to `data`. A few C-level
        passes over the runs (about 30 ns per run in all when none is empty and the partitions are a range,
        as a Spark index file's are), none of them a Python step per run."""
        sizes: list[Any] = lengths if type(lengths) is list else list(lengths)
        try:
            runs = array("I", sizes)
        except OverflowError:
            if min(sizes) < 0:
                raise ValueError("run lengths cannot be negative") from None
            # a run over 4 GiB: only ever packed split, so its template entry is never used
            runs = array("I", map(min, sizes, repeat(U32_MAX)))
        if _has_zero(runs):  # empty partitions have no run (`runs` says which: ints, whatever `lengths` held)
            parts = array("I", compress(partitions, runs))
            sizes = list(compress(sizes, runs))
            runs = array("I", filter(None, runs))
        else:
            parts = _ascending(partitions)
        if len(parts) != len(sizes):
            raise ValueError("partitions and lengths differ in number")
        ascending = ascending or (isinstance(partitions, range) and partitions.step > 0)
        if not ascending and len(parts) > 1 and not all(map(lt, parts, islice(parts, 1, None))):
            raise ValueError("partitions must be strictly ascending")
        self._parts = parts
        self._lengths = sizes
        self._data = memoryview(data).cast("B")
        total = sum(sizes)
        if total != len(self._data):
            raise ValueError(f"the lengths add up to {total} bytes, the data has {len(self._data)}")
        template = array("I", (0,)) * (2 * len(parts))
        template[0::2] = parts
        template[1::2] = runs
        if _SWAP:
            template.byteswap()
        #: whole runs in the last group: where `_fit_sums` starts (0: none packed yet)
        self._guess = 0
        self._template = memoryview(template).cast("B")
        self._i = 0
        #: data offset where run `_i` starts
        self._offset = 0
        #: bytes of run `_i` already packed (a run split across groups)
        self._skip = 0

    @classmethod
    def from_lengths(cls, lengths: Sequence[int], data: BytesLike) -> RunPacker:
        """`lengths[p]` bytes of partition p back to back (a Spark index file's shape), zeros included."""
        return cls(range(len(lengths)), lengths, data)

    @property
    def done(self) -> bool:
        return self._i >= len(self._parts)

    def pack_into(self, into: memoryview, attempt: int) -> int:
        """Write the next group of `attempt` into `into`, as full as its length allows; returns the group's length.

        Whole runs go in while they fit; the next one is split to fill the rest (its remainder opens the next
        group), so groups are full except the last."""
        i, skip = self._i, self._skip
        count = len(self._parts)
        room = len(into) - HEADER_SIZE
        if i >= count or room <= RUN_SIZE:
            raise ValueError("nothing left to pack" if i >= count else f"{len(into)} bytes cannot hold a group")
        first = self._offset + skip
        # the first guess: as many runs of the average length as fit
        guess = self._guess or room * count // (len(self._data) + RUN_SIZE * count)
        j, whole_bytes = _fit_sums(self._lengths, i, count, skip, room, guess)
        self._guess = j - i
        used = whole_bytes + RUN_SIZE * (j - i)
        part = room - used - RUN_SIZE if j < count and room - used > RUN_SIZE else 0
        whole = j - i
        runs = whole + (1 if part else 0)
        GROUP_HEADER.pack_into(into, 0, attempt, runs)
        into[HEADER_SIZE : HEADER_SIZE + RUN_SIZE * whole] = self._template[RUN_SIZE * i : RUN_SIZE * j]
        if skip and whole:
            RUN.pack_into(into, HEADER_SIZE, self._parts[i], int(self._lengths[i]) - skip)
        if part:
            RUN.pack_into(into, HEADER_SIZE + RUN_SIZE * whole, self._parts[j], part)
        nbytes = whole_bytes + part
        data = HEADER_SIZE + RUN_SIZE * runs
        into[data : data + nbytes] = self._data[first : first + nbytes]
        if j > i:
            self._offset = first + whole_bytes
        self._i = j
        self._skip = part + (skip if j == i else 0)
        return data + nbytes

    def pack_blocks_into(self, into: memoryview, attempt: int, block: Callable[[memoryview, memoryview], int]) -> int:
        """As `pack_into`, each run's data cut into blocks that `block(raw, dest)` writes into `dest` and returns
        the length of (compression, §10.5: a block never spans runs). A block of n raw bytes must take at most
        5 + n bytes and n at most `len(into)` - 25; blocks are cut to fill the group, never below MIN_BLOCK
        raw bytes unless the run's rest is smaller. A run at a time: the compression call is per block anyway."""
        count = len(self._parts)
        if self._i >= count:
            raise ValueError("nothing left to pack")
        room = len(into) - HEADER_SIZE
        most = room - RUN_SIZE - 5
        scratch = memoryview(bytearray(room))
        entries: list[int] = []
        filled = 0
        while self._i < count:
            i = self._i
            start = self._offset + self._skip
            rest = int(self._lengths[i]) - self._skip
            length = 0
            while rest:
                fits = room - filled - RUN_SIZE * (len(entries) // 2 + 1) - length - 5
                n = min(rest, most, fits)
                if n < min(rest, MIN_BLOCK):
                    break
                written = block(self._data[start : start + n], scratch[filled + length :])
                length += written
                start += n
                rest -= n
            if length:
                entries += (self._parts[i], length)
                filled += length
            if rest:
                self._skip = start - self._offset
                break
            self._offset += int(self._lengths[i])
            self._i, self._skip = i + 1, 0
        runs = len(entries) // 2
        struct.pack_into(f">QI{2 * runs}I", into, 0, attempt, runs, *entries)
        data = HEADER_SIZE + RUN_SIZE * runs
        into[data : data + filled] = scratch[:filled]
        return data + filled
