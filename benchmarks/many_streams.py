"""`many_streams`: 1, 8, 64 and 1000 concurrent readers through B from A, same total bytes; aggregate bytes/s.

Every reader is its own stream on the one A→B connection and on the one
B→client connection, so this shows what the per-stream work (credit messages,
round-robin scheduling, one read gate and its pool per request) costs as streams
multiply. The ratio is to the single-stream case, measured in the same run with
the same daemons. The relay daemon and the client get pools large enough for
every stream to start at once, so the streams really are concurrent instead of
queueing for memory.
"""

from __future__ import annotations

import asyncio
import time

from .bare import bare_throughput, measure_baseline
from .common import (
    SEGMENTS_PER_READER,
    Baseline,
    Context,
    CpuMeter,
    Goal,
    MiB,
    Plot,
    ScenarioResult,
    bounded,
    median,
    mib_per_s,
    push,
    reader_client_pool,
    relay_pool,
    require,
    store_pool,
    timed_read,
    warm_up_peer,
)

APP = "bench-many-streams"


#: the goals: at most 10 % lost at 64 streams, at most 20 % at 1000
GOALS = {64: Goal("ratio", ">=", 0.9), 1000: Goal("ratio", ">=", 0.8)}
#: most 32 KiB buffers the spread bare pair cycles through (512 MiB, the size of the relaying daemon's pool)
MAX_SPREAD = 16384


async def run(ctx: Context, result: ScenarioResult) -> None:
    total = ctx.pick(512 * MiB, 64 * MiB)
    counts: list[int] = ctx.pick([1, 8, 64, 1000], [1, 8, 64])
    most = max(counts)
    bare = await bare_throughput(ctx)
    rates: dict[int, list[float]] = {}
    async with ctx.daemons(store_pool(total, most), relay_pool(most)) as (a, b):
        async with ctx.client(a.addr) as ca, ctx.client(b.addr, pool_size=reader_client_pool(most)) as cb:
            await warm_up_peer(ca, cb, a.addr)
            cpu = CpuMeter({"A": a.pid, "B": b.pid, "client": None})
            for shuffle, streams in enumerate(counts, start=1):
                per = total // streams
                await push(ca, APP, shuffle, shuffle, [per] * streams)
                locations = {a.addr: [shuffle]}
                samples: list[float] = []
                finish: list[float] = []
                for _ in bounded(ctx.repeats, ctx.pick(120.0, 15.0)):
                    t0 = time.perf_counter()
                    with cpu.measure(f"{streams} stream(s)", total):
                        done = await asyncio.gather(
                            *(timed_read(cb, APP, shuffle, p, locations, t0) for p in range(streams))
                        )
                    elapsed = time.perf_counter() - t0
                    got = sum(n for n, _ in done)
                    require(got == per * streams, f"{streams} streams read {got} bytes, {per * streams} were pushed")
                    samples.append(mib_per_s(got, elapsed))
                    finish = sorted(t for _, t in done)
                rates[streams] = samples
                result.notes.append(
                    f"{streams} stream(s) of {per / MiB:.3g} MiB: first finished after {finish[0]:.2f}s, "
                    f"median {median(finish):.2f}s, last {finish[-1]:.2f}s"
                )
                ctx.progress(f"{streams} stream(s): {median(samples):,.0f} MiB/s aggregate")
                await ca.unregister_shuffle(APP, shuffle)

    result.notes.extend(cpu.notes())
    # The same comparison for a bare socket pair whose buffers are spread like the streams' credit windows
    # over the pools: what touching that much memory (instead of one buffer that stays in the CPU cache)
    # costs the kernel's copies alone. A daemon serving N streams cannot do better than this ratio.
    spread: dict[int, Baseline] = {}
    for streams in counts:
        buffers = min(streams * SEGMENTS_PER_READER, MAX_SPREAD)
        ctx.progress(f"bare pair with its buffers spread over {buffers} segments (like {streams} stream(s))")
        spread[streams] = await measure_baseline(ctx, spread=buffers)
    one = median(rates[counts[0]])
    for streams, samples in rates.items():
        result.add(
            f"{streams} stream(s), aggregate",
            median(samples),
            "MiB/s",
            baseline_name=f"{counts[0]} stream",
            baseline=one,
            goal=GOALS.get(streams),
            samples=samples,
        )
    for streams, base in spread.items():
        result.add(
            f"bare pair, buffers spread like {streams} stream(s)",
            base.mib_s,
            "MiB/s",
            baseline_name=f"like {counts[0]} stream",
            baseline=spread[counts[0]].mib_s,
            samples=[x / MiB for x in base.samples],
        )
    result.plots.append(
        Plot(
            "many_streams",
            f"Aggregate read throughput A→B→client, {total // MiB} MiB in total",
            "concurrent reader streams",
            "MiB/s",
            lines={"shuffled": (list(rates), [median(s) for s in rates.values()])},
            hlines={f"bare socket {bare.mib_s:,.0f} MiB/s": bare.mib_s},
            logx=True,
        )
    )
