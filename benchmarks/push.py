"""`push`: map output from a client into its local daemon, over the Unix socket and over TCP.

This is the executor→sidecar hop of every shuffle, and the only one a Unix
socket can serve. One daemon listens on both. The first push into the fresh
daemon is reported on its own: it is the one that faults the pool's pages in
(the pool is an mmap touched on first use). After it, each repeat pushes the
same bytes over TCP and then over the Unix socket (alternating keeps drift out of
their comparison), unregistering in between so the pool never fills. Ratios are
to the bare-socket baseline.
"""

from __future__ import annotations

import time

from .common import (
    Context,
    CpuMeter,
    Goal,
    MiB,
    ScenarioResult,
    bounded,
    median,
    mib_per_s,
    push,
    store_pool,
)

APP = "bench-push"


#: the issue's goal, 1 GB/s (decimal), in this table's unit
GOAL = Goal("value", ">=", 1e9 / MiB)


async def run(ctx: Context, result: ScenarioResult) -> None:
    nbytes = ctx.pick(512 * MiB, 64 * MiB)
    bare = await ctx.bare_throughput()
    rates: dict[str, list[float]] = {"TCP": [], "Unix socket": []}
    async with ctx.daemons(store_pool(nbytes), unix=True) as (a,):
        cpu = CpuMeter({"daemon": a.pid, "client": None})
        async with ctx.client(a.addr) as tcp, ctx.client(f"unix:{a.ready_field('unix')}") as unix:
            shuffle = 1
            t0 = time.perf_counter()
            await push(tcp, APP, shuffle, shuffle, [nbytes])
            cold = mib_per_s(nbytes, time.perf_counter() - t0)
            await tcp.unregister_shuffle(APP, shuffle)
            ctx.progress(f"first push (cold pool) {cold:,.0f} MiB/s")
            for _ in bounded(ctx.repeats, ctx.pick(120.0, 15.0)):
                for kind, client in (("TCP", tcp), ("Unix socket", unix)):
                    shuffle += 1
                    t0 = time.perf_counter()
                    with cpu.measure(f"push over {kind}", nbytes):
                        await push(client, APP, shuffle, shuffle, [nbytes])
                    rates[kind].append(mib_per_s(nbytes, time.perf_counter() - t0))
                    await client.unregister_shuffle(APP, shuffle)
                ctx.progress(f"TCP {rates['TCP'][-1]:,.0f} MiB/s, Unix socket {rates['Unix socket'][-1]:,.0f} MiB/s")

    result.add(
        "first push over TCP, cold pool", cold, "MiB/s", baseline_name="bare", baseline=bare.mib_s, samples=[cold]
    )
    for kind, samples in rates.items():
        result.add(
            f"push over {kind}, warm pool",
            median(samples),
            "MiB/s",
            baseline_name="bare",
            baseline=bare.mib_s,
            goal=GOAL,
            samples=samples,
        )
    result.notes.append(
        f"{nbytes // MiB} MiB per push into one partition, 1 MiB writes, medians of {len(rates['TCP'])}; "
        f"Unix/TCP = {median(rates['Unix socket']) / median(rates['TCP']):.2f}"
    )
    result.notes.extend(cpu.notes())
