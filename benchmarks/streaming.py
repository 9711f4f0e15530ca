"""`streaming`: a long Structured Streaming query, a stateful windowed aggregation with a watermark over 200
shuffle partitions, micro-batch after micro-batch, through Spark's built-in shuffle and through one daemon, in
the same run (each a process of its own, `benchmarks.streaming_job`).

Per micro-batch: its time (Spark's ``triggerExecution``), p50 and p90 over the run, shuffled against built-in
(goal: p50 at most 1.0). And what the daemon holds after 10, 100 and 1,000 batches and once the query stopped:
Spark drops each batch's shuffle when the driver collects its garbage, and the daemon must free them, so the
shuffles it holds stay bounded however long the query runs (goal: at most ``HELD_GOAL`` at every sample). Both
queries' sinks must end with the same rows.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from .common import Context, Goal, Plot, ScenarioResult, percentile, require
from .scale import default_pool
from .spark import json_job, plugin_jar

#: micro-batches of a full run (override with SHUFFLED_BENCH_STREAMING_BATCHES: a batch of 200 partitions of
#: state takes seconds on 2 shared cores, so 1,000 take hours per session)
BATCHES_VARIABLE = "SHUFFLED_BENCH_STREAMING_BATCHES"
#: shuffle partitions of a full run (override with SHUFFLED_BENCH_STREAMING_PARTITIONS: fewer make a batch
#: cheaper, for the held-shuffle bound over many batches in less time)
PARTITIONS_VARIABLE = "SHUFFLED_BENCH_STREAMING_PARTITIONS"
BATCHES = 1_000
QUICK_BATCHES = 5
ROWS_PER_BATCH = 20_000
QUICK_ROWS_PER_BATCH = 2_000
CHECKPOINTS = [10, 100, 1_000]
QUICK_CHECKPOINTS = [3]
#: --quick (part of the test suite) checks the plumbing only: few partitions, so a batch takes a second
PARTITIONS = 200
QUICK_PARTITIONS = 8
#: shuffles the daemon may hold at a sample: those of the batches whose plans the driver still references and
#: of those it has not collected yet (Spark's ContextCleaner drops a shuffle after the driver's garbage
#: collection found its dependency unreachable, not at once: 10, then 3, 11 and 21 held at batches 10-40 of a
#: trial run)
HELD_GOAL = 50
TIME_LIMIT = 3600.0
QUICK_TIME_LIMIT = 150.0


async def _session(ctx: Context, mode: str, batches: int, rows: int, jar: str, address: str = "") -> dict[str, Any]:
    checkpoints = ",".join(str(c) for c in ctx.pick(CHECKPOINTS, QUICK_CHECKPOINTS) if c <= batches)
    argv = [sys.executable, "-m", "benchmarks.streaming_job", "--mode", mode, "--batches", str(batches)]
    argv += ["--rows-per-batch", str(rows), "--jar", jar, "--address", address, "--checkpoints", checkpoints]
    argv += ["--partitions", str(_partitions(ctx))]
    return await json_job(ctx, f"streaming {mode}", argv)


def _partitions(ctx: Context) -> int:
    partitions: int = ctx.pick(int(os.environ.get(PARTITIONS_VARIABLE, PARTITIONS)), QUICK_PARTITIONS)
    return partitions


async def run(ctx: Context, result: ScenarioResult) -> None:
    jar = await asyncio.to_thread(plugin_jar)
    batches = ctx.pick(int(os.environ.get(BATCHES_VARIABLE, BATCHES)), QUICK_BATCHES)
    rows = ctx.pick(ROWS_PER_BATCH, QUICK_ROWS_PER_BATCH)
    builtin = await _session(ctx, "builtin", batches, rows, jar)
    ctx.progress(f"built-in: {batches} batches, p50 {percentile(builtin['seconds'], 50):.3f}s")
    async with ctx.daemons(default_pool()) as (daemon,):
        plugin = await _session(ctx, "plugin", batches, rows, jar, daemon.addr)
    ctx.progress(f"shuffled: {batches} batches, p50 {percentile(plugin['seconds'], 50):.3f}s")
    require(builtin["result"] == plugin["result"], "the two queries' sinks hold different rows")
    require(len(plugin["seconds"]) == batches, f"{len(plugin['seconds'])} batch times for {batches} batches")
    for q, goal in ((50, Goal("ratio", "<=", 1.0)), (90, None)):
        result.add(
            f"per batch, p{q}",
            percentile(plugin["seconds"], q),
            "s",
            baseline_name="built-in",
            baseline=percentile(builtin["seconds"], q),
            goal=goal,
        )
    for sample in [*plugin["held"], {"batches": "stop", **plugin["held_after_stop"]}]:
        held_goal = Goal("value", "<=", HELD_GOAL)
        result.add(f"shuffles held after {sample['batches']} batches", sample["shuffles"], "", goal=held_goal)
        result.add(f"bytes held after {sample['batches']} batches", sample["bytes"] / 2**20, "MiB")
    plot = Plot("streaming", "Structured Streaming: time per micro-batch", "batch", "seconds")
    for name, run_ in (("built-in", builtin), ("shuffled", plugin)):
        plot.lines[name] = (list(range(len(run_["seconds"]))), run_["seconds"])
    result.plots.append(plot)
    result.notes.append(
        f"{batches} micro-batches of {rows:,} rows, windows of 5 s with a 10 s watermark over 1,000 keys, "
        f"{_partitions(ctx)} shuffle partitions, local[2], one daemon on its defaults; "
        f"{plugin['windows']:,} finished windows, identical in both sinks"
    )
