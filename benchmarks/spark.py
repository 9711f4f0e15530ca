"""`spark`: Spark SQL queries with joins and aggregations on generated data, through shuffled and
through Spark's built-in sort shuffle, in the same run.

Each mode runs in a fresh process and JVM (`benchmarks.spark_job`), local[2], 16 shuffle
partitions, with broadcast joins off so every join shuffles both sides. The plugin's tasks are spread
over two daemons (127.0.0.2, 127.0.0.3), so most reads cross the daemon-to-daemon connection. The
modes alternate (built-in, plugin, plugin, built-in in the full run) to keep machine drift out of the
ratio. Every run's query results must be identical; the shuffled bytes are Spark's own shuffle write
metrics. The ratio is plugin time / built-in time (goal ≤ 1.0).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from .common import (
    Context,
    Goal,
    ManagedProcess,
    MiB,
    Plot,
    ScenarioResult,
    Skip,
    median,
    require,
)


def _jar() -> str:
    try:
        from shuffled import spark_jar

        return str(spark_jar.build_jar())
    except Exception as exc:  # no JDK or no pyspark: a skip, not a failure
        raise Skip(f"cannot build the Spark plugin: {exc}") from exc


async def _run_mode(ctx: Context, mode: str, rows: int, addresses: str, jar: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "benchmarks.spark_job", "--mode", mode, "--rows", str(rows)]
    argv += ["--addresses", addresses, "--jar", jar]
    job = ManagedProcess(f"spark {mode}", argv, r"^\{")
    try:
        line = await job.wait_ready(timeout=ctx.time_limit)
        await job.wait_exit(60)
    finally:
        job.stop()
    result: dict[str, Any] = json.loads(line.string)
    return result


async def run(ctx: Context, result: ScenarioResult) -> None:
    jar = await asyncio.to_thread(_jar)
    rows = ctx.pick(20_000_000, 200_000)
    order = ctx.pick(["builtin", "plugin", "plugin", "builtin"], ["builtin", "plugin"])
    runs: list[dict[str, Any]] = []
    async with ctx.daemons(ctx.pick(1536 * MiB, 128 * MiB), ctx.pick(1536 * MiB, 128 * MiB)) as daemons:
        addresses = ",".join(d.node for d in daemons)
        for mode in order:
            out = await _run_mode(ctx, mode, rows, addresses, jar)
            runs.append(out)
            times = ", ".join(f"{q} {v['seconds']:.1f}s" for q, v in out["queries"].items())
            ctx.progress(f"{mode}: {times}")

    queries = list(runs[0]["queries"])
    for q in queries:
        digests = {r["queries"][q]["result"] for r in runs}
        require(len(digests) == 1, f"{q}: results differ between runs/modes ({len(digests)} distinct)")

    def seconds(mode: str, query: str) -> list[float]:
        return [r["queries"][query]["seconds"] for r in runs if r["mode"] == mode]

    plot = Plot("spark.png", "Spark SQL queries: job time", "", "seconds (median)")
    for q in queries:
        plugin, builtin = median(seconds("plugin", q)), median(seconds("builtin", q))
        result.add(f"{q}: plugin time", plugin, "s", baseline_name="built-in", baseline=builtin)
        plot.bars[f"{q}\nbuilt-in"] = builtin
        plot.bars[f"{q}\nshuffled"] = plugin
    totals = {m: [sum(r["queries"][q]["seconds"] for q in queries) for r in runs if r["mode"] == m] for m in order}
    result.add(
        "all queries: plugin time",
        median(totals["plugin"]),
        "s",
        baseline_name="built-in",
        baseline=median(totals["builtin"]),
        goal=Goal("ratio", "<=", 1.0),
        samples=totals["plugin"],
    )
    shuffled = sum(v["shuffle_bytes"] for v in runs[0]["queries"].values())
    result.notes.append(
        f"{rows:,} rows, {shuffled / 2**30:.2f} GiB shuffled per run (Spark's shuffle write bytes, compressed), "
        f"run order {', '.join(order)}; results identical in every run"
    )
    result.plots.append(plot)
