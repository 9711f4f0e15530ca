"""`scale_wide`: 10,000 map outputs of 10,000 partitions of 4 bytes (100 million blocks) through one daemon.

One daemon (256 MiB pool, a data dir) takes the map outputs, pushed with `write_sorted` by four writers
at once (1.1 GiB of packed groups: most of it is spilled), then ten readers at once read it back, each a
range of 1,000 partitions from every attempt, as AQE's coalesced reads are. The readers read in bulk
(`groups()`: an object per packed group, never one per block) and check every attempt's bytes in their
range with one CRC32C per group. Reported: the time of each phase, the daemon's peak RSS over its pool
(goal: at most 200 MiB), and what the daemon keeps per committed attempt and per block (its RSS growth
over the push) and stores per block (its bytes, its directory entry and its share of a group's header).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import crc32c

from shuffled.launch import DaemonProcess
from shuffled_client import AsyncClient

from .common import Context, Goal, MiB, Plot, RssSampler, ScenarioResult, require, rss

APP = "bench-scale-wide"
POOL = 256 * MiB
OVERHEAD_GOAL = 200  # MiB over the pool
#: 100 million blocks: about a minute of pushing and half of reading on 2 cores
TIME_LIMIT = 1800.0


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


async def scale(
    daemon: DaemonProcess,
    maps: int,
    partitions: int,
    block: int,
    writers: int,
    readers: int,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Push the shuffle into `daemon` and read it back, sampling its RSS; BenchmarkFailure on a wrong byte."""
    with RssSampler({"daemon": daemon.pid}, 0.02) as sampler:
        out = await _scale(
            daemon, tiles=Tiles(partitions, block), maps=maps, writers=writers, readers=readers, progress=progress
        )
    out["peak_rss"] = sampler.peak("daemon") * MiB
    out["rss"] = sampler.series["daemon"]
    return out


async def _read(client: AsyncClient, tiles: Tiles, lo: int, hi: int, attempts: list[int]) -> tuple[int, int]:
    """Read [lo, hi) in bulk, every attempt's bytes checked; (runs, bytes) read."""
    crcs: dict[int, int] = {}
    runs = nbytes = 0
    async with client.read(APP, 0, lo, hi, {"": attempts}) as reader:
        async for group in reader.groups():
            crcs[group.attempt] = crc32c.crc32c(group.data, crcs.get(group.attempt, 0))
            runs += len(group.partitions)
            nbytes += len(group.data)
    wrong = [a for a in attempts if crcs.get(a) != tiles.crc(a, lo, hi)]
    require(not wrong, f"range [{lo}, {hi}): the bytes of attempts {wrong[:5]} are not what they wrote")
    return runs, nbytes


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
                require(got == lengths, f"attempt {attempt} committed {sum(got)} bytes")
                if attempt % max(1, maps // 10) == 0:
                    progress(f"pushed {attempt} of {maps} map outputs (daemon RSS {rss(daemon.pid) / MiB:.0f} MiB)")

        t0 = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(writers)))
        out["push_s"] = time.perf_counter() - t0
        out["after_push"] = await client.stats()
        out["pushed_rss"] = rss(daemon.pid)
        step = -(-partitions // readers)
        t0 = time.perf_counter()
        found = await asyncio.gather(
            *(_read(client, tiles, lo, min(partitions, lo + step), attempts) for lo in range(0, partitions, step))
        )
        out["read_s"] = time.perf_counter() - t0
        out["runs"] = sum(runs for runs, _ in found)
        out["bytes"] = sum(nbytes for _, nbytes in found)
        require(out["bytes"] == maps * partitions * block, f"read {out['bytes']} bytes")
        out["stats"] = await client.stats()
        await client.unregister_shuffle(APP, 0)
    return out


async def run(ctx: Context, result: ScenarioResult) -> None:
    maps, partitions, block = ctx.pick((10_000, 10_000, 4), (200, 2_000, 4))
    async with ctx.daemons(POOL) as (daemon,):
        r = await scale(daemon, maps, partitions, block, writers=4, readers=10, progress=ctx.progress)
    blocks = maps * partitions
    pool = daemon.pool_size / MiB
    store, disk = r["after_push"]["store"], r["after_push"]["disk"]
    packed = disk["spilled_bytes"] + store["memory_bytes"]  # every piece, on disk or in memory
    grown = r["pushed_rss"] - r["idle_rss"]
    result.plots.append(
        Plot(
            "scale_wide",
            f"{blocks:,} blocks through one daemon: its RSS",
            "seconds",
            "RSS (MiB)",
            lines={"daemon": r["rss"]},
            hlines={"pool": pool, f"pool + {OVERHEAD_GOAL} MiB": pool + OVERHEAD_GOAL},
        )
    )
    result.add("push", r["push_s"], "s")
    result.add("push, blocks per second", blocks / r["push_s"] / 1e6, "M/s")
    result.add("read", r["read_s"], "s")
    result.add(
        "daemon peak RSS",
        r["peak_rss"] / MiB,
        "MiB",
        baseline_name="pool",
        baseline=pool,
        goal=Goal("value", "<=", pool + OVERHEAD_GOAL),
    )
    result.add("daemon peak RSS over its pool", r["peak_rss"] / MiB - pool, "MiB")
    result.add("daemon memory per committed attempt (RSS growth over the push)", grown / maps, "B")
    result.add("daemon memory per block (RSS growth over the push)", grown / blocks, "B")
    result.add("stored per block (its data, directory entry and share of a group header)", packed / blocks, "B")
    result.notes.append(
        f"{maps:,} map outputs x {partitions:,} partitions x {block} bytes = {blocks:,} blocks, pushed with "
        f"write_sorted by 4 writers, read in bulk by 10 readers of {-(-partitions // 10):,} partitions; after the "
        f"push the store held {store['attempts']:,} attempts in {store['pieces']:,} pieces, "
        f"{store['stored_segments']:,} segments in memory; {disk['spilled_bytes'] / MiB:,.0f} MiB spilled in "
        f"{disk['spills']:,} writes; every attempt's bytes in every range checked (CRC32C)"
    )
