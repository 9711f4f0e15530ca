"""`python -m benchmarks.packed`: what packed groups cost per 32 KiB buffer, in this process, no daemon.

Not a scenario (nothing crosses a socket); it answers the question of what the per-buffer work of
the wide-shuffle wire (PROTOCOL.md §3.3, shuffled/protocol/packed.py) costs as the runs per buffer grow,
with 10, 80 and 1000 runs per buffer (blocks of about 3 KiB, 400 and 25 bytes). Each operation is timed on
the same buffers as the CRC32C every buffer already pays (the same-run baseline), and reported in
microseconds per buffer and as a ratio to that CRC:

* pack: a writer's `RunPacker` made from a Spark-index-shaped `lengths` (its share per buffer) and
  `pack_into` a segment, per buffer;
* check_push: a daemon's check of a pushed group (InvalidRequest on a malformed one);
* tally: `LengthTally.add` per group plus the CommitAck's `lengths` (its share per buffer);
* read: a reader's `read_payload` and the walk over its runs (the offsets of each);
* slice: a daemon's `slice_group` of half a stored group (the directory parsed, header and slices built);
* walk: a relay's progress (`ReadProgress.add`: header, first and last run of each group).

With `--numpy` (when numpy is importable) the same check, packer set-up and tally written with numpy run
alongside, to say whether numpy would pay (it is not a dependency).
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable

from shuffled.protocol.integrity import checksum
from shuffled.protocol.packed import (
    LengthTally,
    PushedGroup,
    RunPacker,
    check_push,
    directory,
    read_payload,
    slice_group,
)
from shuffled.protocol.resume import ReadProgress

SEGMENT = 32 << 10
BUFFERS = 40
RUNS = (10, 80, 1000)


def _groups(runs: int) -> tuple[list[int], bytes, list[bytes]]:
    """Partitions of equal size, `runs` of them filling each of BUFFERS groups: their lengths, data, groups."""
    size = (SEGMENT - 12) // runs - 8
    lengths = [size] * (runs * BUFFERS)
    data = bytes(range(256)) * (size * runs * BUFFERS // 256 + 1)
    data = data[: size * runs * BUFFERS]
    packer = RunPacker.from_lengths(lengths, data)
    segment = memoryview(bytearray(SEGMENT))
    groups = []
    while not packer.done:
        groups.append(bytes(segment[: packer.pack_into(segment, 7)]))
    return lengths, data, groups


def _per_buffer(fn: Callable[[], object], buffers: int, repeat: int) -> float:
    """Microseconds per buffer of `fn` (which handles `buffers` buffers), best of `repeat`."""
    return min(timeit.repeat(fn, number=1, repeat=repeat)) / buffers * 1e6


def measure(runs: int, repeat: int, with_numpy: bool) -> dict[str, float]:
    lengths, data, groups = _groups(runs)
    segment = memoryview(bytearray(SEGMENT))
    n = len(groups)
    partitions = len(lengths)
    #: the middle half of each group's partitions: what a range read wants of a piece it overlaps
    halves = [(directory(g).first + runs // 4, directory(g).first + 3 * runs // 4) for g in groups]

    def pack() -> None:
        packer = RunPacker.from_lengths(lengths, data)
        while not packer.done:
            packer.pack_into(segment, 7)

    def checked() -> list[PushedGroup]:
        return [check_push(g, 7, partitions) for g in groups]

    def tally() -> None:
        t = LengthTally()
        for d in pushed:
            t.add(d.entries)
        t.lengths(partitions)

    def read() -> None:
        for g in groups:
            for d in read_payload(g, 0, partitions, {7}):
                for _ in d.runs():
                    pass

    def progress() -> None:
        p = ReadProgress()
        for g in groups:
            p.add(g)

    pushed = checked()
    out = {
        "crc32c": _per_buffer(lambda: [checksum(g) for g in groups], n, repeat),
        "pack": _per_buffer(pack, n, repeat),
        "check_push": _per_buffer(checked, n, repeat),
        "tally": _per_buffer(tally, n, repeat),
        "read": _per_buffer(read, n, repeat),
        "slice": _per_buffer(
            lambda: [slice_group(memoryview(g), *h) for g, h in zip(groups, halves, strict=True)], n, repeat
        ),
        "walk": _per_buffer(progress, n, repeat),
    }
    if with_numpy:
        out |= _numpy(lengths, groups, repeat)
    return out


def _numpy(lengths: list[int], groups: list[bytes], repeat: int) -> dict[str, float]:
    """The check, the packer's set-up and the tally as numpy would do them (vectorised over the runs)."""
    import numpy as np

    n = len(groups)

    def check(g: bytes) -> bool:
        count = int.from_bytes(g[8:12], "big")
        d = np.frombuffer(g, dtype=">u4", count=2 * count, offset=12)
        parts, lens = d[0::2], d[1::2]
        ascending = count == 1 or bool((parts[1:] > parts[:-1]).all())
        return ascending and bool(lens.all()) and int(lens.sum(dtype=np.uint64)) == len(g) - 12 - 8 * count

    def setup() -> None:
        array = np.asarray(lengths, dtype=np.uint64)
        idx = np.flatnonzero(array)
        np.cumsum(array[idx])
        directory = np.empty((len(idx), 2), dtype=">u4")
        directory[:, 0] = idx
        directory[:, 1] = array[idx]
        directory.tobytes()

    runs = [np.frombuffer(g, dtype=">u4", count=2 * int.from_bytes(g[8:12], "big"), offset=12) for g in groups]

    def tally() -> None:
        np.bincount(
            np.concatenate([r[0::2] for r in runs]),
            weights=np.concatenate([r[1::2] for r in runs]),
            minlength=len(lengths),
        )

    return {
        "numpy check": _per_buffer(lambda: all(check(g) for g in groups), n, repeat),
        "numpy pack set-up": _per_buffer(setup, n, repeat),
        "numpy tally": _per_buffer(tally, n, repeat),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.packed", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="best of this many timings per figure")
    parser.add_argument("--numpy", action="store_true", help="also time the numpy variants (needs numpy)")
    args = parser.parse_args(argv)
    results = {runs: measure(runs, args.repeats, args.numpy) for runs in RUNS}
    names = list(results[RUNS[0]])
    print(f"{'µs per 32 KiB buffer':24}" + "".join(f"{f'{r} runs':>20}" for r in RUNS))
    for name in names:
        cells = []
        for r in RUNS:
            value, crc = results[r][name], results[r]["crc32c"]
            cells.append(f"{value:9.1f} ({value / crc:5.1f}x)" if name != "crc32c" else f"{value:20.1f}")
        print(f"{name:24}" + "".join(f"{c:>20}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
