"""`latency`: round trip of a read request for a tiny partition, p50/p99 in microseconds.

Many tiny partitions are pushed into A, then single requests are timed one after
another: open the read (a client pool, a PartitionRequest), receive the bytes and
the end of partition, close. A client of A reads local data; a client of B reads
data on A, so B forwards the request over the shared connection and relays the
answer. The baseline is a bare ping-pong of the same payload size between this
process and an echo process, measured in the same run.
"""

from __future__ import annotations

import asyncio
import time

from shuffled_client import AsyncClient

from .bare import measure_echo
from .common import (
    DEFAULT_DAEMON_POOL,
    SEGMENT,
    Context,
    Plot,
    ScenarioResult,
    bounded,
    drain,
    percentile,
    push,
    require,
    store_pool,
    warm_up_peer,
)

APP = "bench-latency"
SHUFFLE = 1
ATTEMPT = 1
PARTITIONS = 256
SIZE = 100
WARMUP = 20


async def _time_reads(client: AsyncClient, locations: dict[str, list[int]], count: int, seconds: float) -> list[float]:
    samples: list[float] = []
    for i in bounded(count + WARMUP, seconds):
        p = i % PARTITIONS
        t0 = time.perf_counter_ns()
        n = await asyncio.wait_for(drain(client.read(APP, SHUFFLE, p, p + 1, locations)), 5.0)
        elapsed = (time.perf_counter_ns() - t0) / 1000
        require(n == SIZE, f"partition {p} returned {n} bytes, {SIZE} were pushed")
        if i >= WARMUP:
            samples.append(elapsed)
    return samples


def _cdf(samples: list[float]) -> tuple[list[float], list[float]]:
    xs = sorted(samples)
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


async def run(ctx: Context, result: ScenarioResult) -> None:
    count = ctx.pick(3000, 300)
    seconds = ctx.pick(60.0, 8.0)
    echo = await measure_echo(SIZE, count, seconds)
    ctx.progress(f"bare echo p50 {percentile(echo, 50):.0f} µs")
    async with ctx.daemons(store_pool(PARTITIONS * SEGMENT, PARTITIONS), DEFAULT_DAEMON_POOL) as (a, b):
        async with ctx.client(a.addr) as ca, ctx.client(b.addr) as cb:
            await warm_up_peer(ca, cb, a.addr)
            await push(ca, APP, SHUFFLE, ATTEMPT, [SIZE] * PARTITIONS)
            local = await _time_reads(ca, {"": [ATTEMPT]}, count, seconds)
            ctx.progress(f"local read p50 {percentile(local, 50):.0f} µs")
            remote = await _time_reads(cb, {a.addr: [ATTEMPT]}, count, seconds)
            ctx.progress(f"remote read p50 {percentile(remote, 50):.0f} µs")

    result.add("bare echo p50", percentile(echo, 50), "µs")
    result.add("bare echo p99", percentile(echo, 99), "µs")
    for label, samples in (("local read (client→A)", local), ("remote read (client→B→A)", remote)):
        for q in (50, 99):
            base = percentile(echo, q)
            result.add(f"{label} p{q}", percentile(samples, q), "µs", baseline_name=f"echo p{q}", baseline=base)
    result.notes.append(
        f"{SIZE}-byte partitions, {len(local)} local and {len(remote)} remote requests one at a time "
        f"after {WARMUP} warm-up requests each; ratio > 1 means slower than the bare echo"
    )
    result.plots.append(
        Plot(
            "latency",
            f"Read round trip of a {SIZE}-byte partition (CDF)",
            "microseconds",
            "fraction of requests",
            lines={"bare echo": _cdf(echo), "local read": _cdf(local), "remote read (via B)": _cdf(remote)},
            logx=True,
        )
    )
