"""`memory`: daemon RSS while ten times its pool moves through it; the goal is peak RSS ≤ pool + 100 MB.

The pool is one fixed mmap that never grows, so a daemon's memory should be its
pool plus a bounded overhead (interpreter, per-connection and per-stream state)
however many bytes pass. Rounds of push into A → read through B →
unregister_shuffle move ten pools' worth of data through both daemons while a
thread samples their RSS. Growth from round to round would show a leak; a peak
far above the pool would show copies outside it.
"""

from __future__ import annotations

import asyncio
import math
import time

from .common import (
    Context,
    CpuMeter,
    Goal,
    MiB,
    Plot,
    RssSampler,
    ScenarioResult,
    bounded,
    drain,
    mib_per_s,
    push,
    reader_client_pool,
    require,
    rss,
)

APP = "bench-memory"
PARTITIONS = 8
#: the allowance on top of the pool: 100 MB (decimal, as the goal is stated), in MiB
OVERHEAD_MIB = 100e6 / MiB
SAMPLE_INTERVAL = 0.02


async def run(ctx: Context, result: ScenarioResult) -> None:
    pool = ctx.pick(64 * MiB, 32 * MiB)
    # Three quarters of the pool per round: as much as fits beside the read reserve
    # (1/8) and the push windows, so the whole pool is in use at every round's peak.
    per = pool * 3 // 4 // PARTITIONS
    rounds = math.ceil(10 * pool / (per * PARTITIONS))
    keys = ("A (stores)", "B (relays)")
    async with ctx.daemons(pool, pool) as (a, b):
        async with ctx.client(a.addr) as ca, ctx.client(b.addr, pool_size=reader_client_pool(PARTITIONS)) as cb:
            idle = {keys[0]: rss(a.pid) / MiB, keys[1]: rss(b.pid) / MiB}
            moved = done = 0
            t0 = time.perf_counter()
            cpu = CpuMeter({keys[0]: a.pid, keys[1]: b.pid, "client": None})
            with (
                cpu.measure("push into A, read through B") as measured,
                RssSampler({keys[0]: a.pid, keys[1]: b.pid}, SAMPLE_INTERVAL) as sampler,
            ):
                for r in bounded(rounds, ctx.pick(240.0, 30.0)):
                    shuffle = r + 1
                    await push(ca, APP, shuffle, shuffle, [per] * PARTITIONS)
                    locations = {a.addr: [shuffle]}
                    got = await asyncio.gather(
                        *(drain(cb.read(APP, shuffle, p, p + 1, locations)) for p in range(PARTITIONS))
                    )
                    require(
                        sum(got) == per * PARTITIONS, f"round {r} read {sum(got)} bytes, {per * PARTITIONS} were pushed"
                    )
                    await ca.unregister_shuffle(APP, shuffle)
                    moved += sum(got)
                    measured[0] = moved
                    done += 1
                    if done == 1:
                        after_first = {keys[0]: rss(a.pid) / MiB, keys[1]: rss(b.pid) / MiB}
                    if (r + 1) % 5 == 0:
                        ctx.progress(
                            f"round {r + 1}/{rounds}: {moved // MiB} MiB moved, RSS A {sampler.peak(keys[0]):.0f} MiB, "
                            f"B {sampler.peak(keys[1]):.0f} MiB (peaks)"
                        )
            elapsed = time.perf_counter() - t0
            at_end = {keys[0]: rss(a.pid) / MiB, keys[1]: rss(b.pid) / MiB}

    pool_mib = pool / MiB
    for key in keys:
        result.add(
            f"peak RSS {key}",
            sampler.peak(key),
            "MiB",
            baseline_name="pool",
            baseline=pool_mib,
            goal=Goal("value", "<=", pool_mib + OVERHEAD_MIB),
        )
    result.notes.extend(cpu.notes())
    result.notes.append(
        f"{moved // MiB} MiB moved ({moved / pool:.1f}x the {pool // MiB} MiB pool) in {done} rounds of "
        f"push, read via B, unregister, at {mib_per_s(moved, elapsed):,.0f} MiB/s; RSS before traffic: "
        + ", ".join(f"{k} {v:.0f} MiB" for k, v in idle.items())
    )
    result.notes.append(
        "RSS after the first round → after the last (growth would mean a leak): "
        + ", ".join(f"{k} {after_first[k]:.1f} → {at_end[k]:.1f} MiB" for k in keys)
    )
    result.plots.append(
        Plot(
            "memory",
            f"Daemon RSS while {moved // MiB} MiB move through a {pool // MiB} MiB pool",
            "seconds",
            "RSS (MiB)",
            lines=dict(sampler.series),
            hlines={"pool": pool_mib, "pool + 100 MB (goal)": pool_mib + OVERHEAD_MIB},
        )
    )
