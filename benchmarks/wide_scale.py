"""A probe of a wide shuffle's scale, not a scenario: many map outputs of many tiny blocks on one daemon.

    python -m benchmarks.wide_scale [--maps 10000] [--partitions 10000] [--block 4] [--pool 256M]

One daemon with a data dir takes `--maps` map outputs of `--partitions` blocks of `--block` bytes each
(10,000 x 10,000 x 4 bytes: 100 million blocks), pushed with `write_sorted` by `--writers` writers at
once, then read back by `--readers` readers at once, each a contiguous range of the partitions from every
attempt, as AQE's coalesced reads are. The readers count payloads rather than iterate a chunk per run
(a Python object per block would be the client's cost, not the daemon's): every payload's CRC32C and
groups are checked, and each attempt's bytes in a range must be exactly what it wrote there. Reported:
the time of each phase, the daemon's peak RSS over its pool (goal: at most 200 MiB), its RSS growth per
committed attempt and per block, and what the store held.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import crc32c

from shuffled.config import parse_size
from shuffled.launch import DaemonProcess, free_port
from shuffled.protocol.errors import ProtocolError
from shuffled.protocol.packed import read_payload
from shuffled_client import AsyncClient
from shuffled_client.aio import PartitionReader

from .common import MiB, RssSampler, rss

APP = "wide-scale"
HOST = "127.0.0.2"


class Tiles:
    """Every map output's bytes: partition p of attempt a is `block` bytes of a repeating pattern at offset
    (a mod 256) + p * block, so a range's bytes of one attempt are one slice (checked with one CRC32C)."""

    def __init__(self, partitions: int, block: int) -> None:
        self.partitions, self.block = partitions, block
        size = partitions * block + 256
        self.pattern = memoryview((bytes(range(256)) * (size // 256 + 1))[:size])

    def output(self, attempt: int) -> memoryview:
        a = attempt % 256
        return self.pattern[a : a + self.partitions * self.block]

    def crc(self, attempt: int, lo: int, hi: int) -> int:
        a = attempt % 256
        return int(crc32c.crc32c(self.pattern[a + lo * self.block : a + hi * self.block]))


class CountingReader(PartitionReader):
    """A reader that checks and counts each payload and lets it go at once: per group, one CRC32C update of
    its attempt's running checksum, never a step per run."""

    def __init__(self, client: AsyncClient, lo: int, hi: int, attempts: list[int]) -> None:
        base = client.read(APP, 0, lo, hi, {"": attempts})
        super().__init__(client, base.receiver, base.req)
        self.crcs: dict[int, int] = {}
        self.runs = 0
        self.bytes = 0

    def deliver(self, payload: Any, crc: int) -> None:  # a pool Buffer (the layers keep benchmarks above it)
        try:
            groups = read_payload(payload.data(), self.req.start, self.req.end, self._attempts)
        except ProtocolError as exc:
            payload.release()
            self.on_stream_error(exc)
            return
        view = payload.memory
        for d in groups:
            self.crcs[d.attempt] = crc32c.crc32c(view[d.data : d.end], self.crcs.get(d.attempt, 0))
            self.runs += len(d.partitions)
            self.bytes += d.end - d.data
        payload.release()

    async def finish(self) -> None:
        await self._start()
        try:
            while not self._ended and self._error is None:
                self._wake.clear()
                await self._wake.wait()
            if self._error is not None:
                raise self._error
        finally:
            await self.aclose()


async def scale(
    daemon: DaemonProcess,
    maps: int,
    partitions: int,
    block: int,
    writers: int,
    readers: int,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Push the shuffle into `daemon` and read it back, sampling its RSS; AssertionError on a wrong byte."""
    with RssSampler({"daemon": daemon.pid}, 0.02) as sampler:
        out = await _scale(
            daemon, tiles=Tiles(partitions, block), maps=maps, writers=writers, readers=readers, progress=progress
        )
    out["peak_rss"] = sampler.peak("daemon") * MiB
    return out


async def _scale(
    daemon: DaemonProcess, *, tiles: Tiles, maps: int, writers: int, readers: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    partitions, block = tiles.partitions, tiles.block
    lengths = [block] * partitions
    attempts = list(range(1, maps + 1))
    out: dict[str, Any] = {"idle_rss": rss(daemon.pid)}
    async with await AsyncClient.connect(daemon.addr) as client:
        queue = list(reversed(attempts))

        async def writer() -> None:
            while queue:
                attempt = queue.pop()
                w = await client.open_writer(APP, 0, attempt, attempt, partitions)
                await w.write_sorted(lengths, tiles.output(attempt))
                got = await w.commit()
                assert got == lengths, f"attempt {attempt} committed {sum(got)} bytes"
                if attempt % max(1, maps // 10) == 0:
                    progress(f"pushed {attempt} of {maps} map outputs")

        t0 = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(writers)))
        out["push_s"] = time.perf_counter() - t0
        out["after_push"] = (await client.stats())["store"]
        out["pushed_rss"] = rss(daemon.pid)
        step = -(-partitions // readers)
        ranges = [(lo, min(partitions, lo + step)) for lo in range(0, partitions, step)]
        t0 = time.perf_counter()
        found = [CountingReader(client, lo, hi, attempts) for lo, hi in ranges]
        await asyncio.gather(*(r.finish() for r in found))
        out["read_s"] = time.perf_counter() - t0
        out["runs"] = sum(r.runs for r in found)
        out["bytes"] = sum(r.bytes for r in found)
        for r, (lo, hi) in zip(found, ranges, strict=True):
            wrong = [a for a in attempts if r.crcs.get(a) != tiles.crc(a, lo, hi)]
            assert not wrong, f"range [{lo}, {hi}): the bytes of attempts {wrong[:5]} are not what they wrote"
        assert out["bytes"] == maps * partitions * block, out
        out["stats"] = await client.stats()
        await client.unregister_shuffle(APP, 0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--maps", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--pool", default="256M")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--readers", type=int, default=10)
    parser.add_argument("--data-dir", default=None, help="where the daemon spills (default: a temporary dir)")
    args = parser.parse_args()
    pool = parse_size(args.pool)
    with tempfile.TemporaryDirectory(dir=args.data_dir) as root:
        daemon = DaemonProcess(HOST, free_port([HOST]), args.pool, ["--data-dir", root]).wait_ready()
        try:

            def progress(message: str) -> None:
                print(f"  {message} (RSS {rss(daemon.pid) / MiB:.0f} MiB)", file=sys.stderr, flush=True)

            r = asyncio.run(scale(daemon, args.maps, args.partitions, args.block, args.writers, args.readers, progress))
        finally:
            daemon.stop()
    blocks = args.maps * args.partitions
    store, disk = r["after_push"], r["stats"]["disk"]
    grown = r["pushed_rss"] - r["idle_rss"]
    print(f"{args.maps} maps x {args.partitions} partitions x {args.block} bytes = {blocks:,} blocks")
    print(f"push {r['push_s']:.1f} s ({blocks / r['push_s'] / 1e6:.2f} M blocks/s), read {r['read_s']:.1f} s")
    print(f"held after the push: {store['attempts']} attempts, {store['pieces']} pieces, {store['stored_segments']}")
    print(f"  segments in memory; spilled {disk['spilled_bytes'] / MiB:.0f} MiB in {disk['spills']} writes")
    print(f"peak RSS {r['peak_rss'] / MiB:.0f} MiB = pool + {(r['peak_rss'] - pool) / MiB:.0f} MiB (goal: + 200)")
    print(f"RSS growth over the push: {grown / MiB:.1f} MiB, {grown / args.maps:.0f} B per attempt,")
    print(f"  {grown / blocks:.3f} B per block")


if __name__ == "__main__":
    main()
