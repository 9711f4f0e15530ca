"""A packed group's directory, as the daemon reads it: validation on ingest, sub-ranges when serving.

A group (WIDE.md §1.1) is `attempt u64, count u32, count x (partition u32, length u32), data`. The
daemon never keeps one object per run: it reads a directory with one C-level unpack into an
`array`, checks it with C-level calls (min, sum, all(map(...))), and slices it to serve a range.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from itertools import islice
from operator import lt

HEAD = struct.Struct(">QI")
RUN = struct.Struct(">II")
HEAD_SIZE = HEAD.size
RUN_SIZE = RUN.size
_SWAP = sys.byteorder == "little"
assert array("I").itemsize == 4


class Malformed(ValueError):
    """A group that breaks WIDE.md §1.1's rules; the message says which."""


def _unpack(group: memoryview, n: int) -> tuple[array[int], array[int]]:
    words = array("I")
    words.frombytes(group[HEAD_SIZE : HEAD_SIZE + RUN_SIZE * n])
    if _SWAP:
        words.byteswap()
    return words[0::2], words[1::2]


def validate(group: memoryview, partitions: int, attempt: int) -> tuple[array[int], array[int]]:
    """The group's run partitions and lengths, checked against a push of `attempt` with `partitions`."""
    if len(group) < HEAD_SIZE:
        raise Malformed(f"a packed group of {len(group)} bytes is shorter than its 12-byte header")
    owner, n = HEAD.unpack_from(group)
    if n == 0:
        raise Malformed("a packed group with no runs")
    end = HEAD_SIZE + RUN_SIZE * n
    if len(group) < end:
        raise Malformed(f"a packed group of {len(group)} bytes is shorter than its directory of {n} runs")
    if owner != attempt:
        raise Malformed(f"a packed group of map attempt {owner} on the push of attempt {attempt}")
    parts, lens = _unpack(group, n)
    if min(lens) == 0:
        raise Malformed("a packed group with an empty run")
    if n > 1 and not all(map(lt, parts, islice(parts, 1, None))):
        raise Malformed("a packed group whose partitions are not strictly ascending")
    if parts[-1] >= partitions:
        raise Malformed(f"a packed group with partition {parts[-1]}, outside 0..{partitions - 1}")
    if sum(lens) != len(group) - end:
        raise Malformed(f"a packed group whose runs hold {sum(lens)} bytes, {len(group) - end} follow its directory")
    return parts, lens


class RunLengths:
    """An attempt's bytes per partition, accumulated from its groups' directories for the CommitAck.

    Twelve bytes per distinct run while the push is open (never per declared partition, which may be
    2^20), and C-level work per group: when a group's partitions continue the ascending order (the
    common case) its directory is appended and a boundary partition merged; otherwise the attempt is
    marked unordered and merged at commit, one step per run.
    """

    __slots__ = ("lens", "ordered", "parts")

    def __init__(self) -> None:
        self.parts = array("I")
        self.lens = array("Q")
        self.ordered = True

    def add(self, parts: array[int], lens: array[int]) -> None:
        mine = self.parts
        if mine and self.ordered:
            if parts[0] == mine[-1]:
                self.lens[-1] += lens[0]
                parts, lens = parts[1:], lens[1:]
            elif parts[0] < mine[-1]:
                self.ordered = False
        mine.extend(parts)
        self.lens.extend(array("Q", lens))

    def dense(self, partitions: int) -> list[int]:
        """Bytes per partition 0..partitions-1."""
        if self.ordered:
            if len(self.parts) == partitions:
                return list(self.lens)
            found = dict(zip(self.parts, self.lens, strict=True))
        else:
            found = {}
            for p, n in zip(self.parts, self.lens, strict=True):
                found[p] = found.get(p, 0) + n
        return list(map(found.get, range(partitions), [0] * partitions))


def runs(group: memoryview) -> tuple[array[int], array[int]]:
    """A stored group's run partitions and lengths (it was validated on arrival)."""
    return _unpack(group, HEAD.unpack_from(group)[1])


def sub_range(group: memoryview, lo: int, hi: int, skip: int = 0) -> tuple[list[memoryview | bytes], int, int]:
    """The runs of partitions [lo, hi) of a stored group as a group of their own, without copying data.

    Returns the parts (a new 12-byte header, a slice of the directory, a slice of the data), their size
    (0: no run in the range) and what is left of `skip`. `skip` bytes are left out of partition `lo`'s
    run (a resumed read, PROTOCOL.md §10.6): a run shorter than that is left out whole and the rest of
    `skip` returned, for the next group holding the pair.
    """
    attempt, n = HEAD.unpack_from(group)
    parts, lens = _unpack(group, n)
    k0 = bisect_left(parts, lo)
    k1 = bisect_left(parts, hi, k0)
    if k0 >= k1:
        return [], 0, skip
    data = HEAD_SIZE + RUN_SIZE * n + sum(lens[:k0])
    size = sum(lens[k0:k1])
    count = k1 - k0
    entries = group[HEAD_SIZE + RUN_SIZE * k0 : HEAD_SIZE + RUN_SIZE * k1]
    directory: list[memoryview | bytes] = [entries]
    if skip and parts[k0] == lo:
        first = lens[k0]
        if first <= skip:
            skip -= first
            data += first
            size -= first
            count -= 1
            if not count:
                return [], 0, skip
            directory = [entries[RUN_SIZE:]]
        else:
            data += skip
            size -= skip
            directory = [RUN.pack(lo, first - skip), entries[RUN_SIZE:]]
            skip = 0
    return [HEAD.pack(attempt, count), *directory, group[data : data + size]], HEAD_SIZE + RUN_SIZE * count + size, skip


def groups(payload: memoryview) -> Iterator[tuple[int, int, int, int]]:
    """Each group of a served payload as (attempt, first partition, last partition, last run's length).

    Raises Malformed for a payload that does not split into whole groups. One directory unpack per
    group, none per run.
    """
    at, end = 0, len(payload)
    while at < end:
        if end - at < HEAD_SIZE:
            raise Malformed("a payload ends inside a packed group's header")
        attempt, n = HEAD.unpack_from(payload, at)
        group = payload[at:]
        if n == 0 or len(group) < HEAD_SIZE + RUN_SIZE * n:
            raise Malformed("a packed group without runs or shorter than its directory")
        parts, lens = _unpack(group, n)
        at += HEAD_SIZE + RUN_SIZE * n + sum(lens)
        if at > end:
            raise Malformed("a packed group's runs run past the payload")
        yield attempt, parts[0], parts[-1], lens[-1]
