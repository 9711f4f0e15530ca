"""`spark`: Spark SQL queries with joins and aggregations on generated data, through shuffled and
through Spark's built-in sort shuffle, in the same run.

Each run is a fresh process and JVM (`benchmarks.spark_job`), local[2], 16 shuffle partitions, with
broadcast joins off so every join shuffles both sides. Two plugin set-ups: one daemon (what one host
runs: the executor pushes into and reads from its own daemon, as the built-in shuffle reads its own
files) and two daemons (127.0.0.2, 127.0.0.3) with tasks spread over both, so half the reads are
relayed over the daemon-to-daemon connection (what a cluster adds, and the built-in shuffle would
fetch over the network too). Runs alternate (built-in, one, two, one, built-in in the full run) to
keep machine drift out of the ratios. Every run's query results must be identical; the shuffled bytes
are Spark's own shuffle write metrics. Ratios are plugin time / built-in time (goal ≤ 1.0).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from tests.spark_jobs import SHORT_RUN_JVM

from .common import (
    Context,
    CpuMeter,
    Goal,
    ManagedProcess,
    MiB,
    Plot,
    ScenarioResult,
    Skip,
    median,
    require,
)


def plugin_jar() -> str:
    try:
        from shuffled import spark_jar

        return str(spark_jar.build_jar())
    except Exception as exc:  # no JDK or no pyspark: a skip, not a failure
        raise Skip(f"cannot build the Spark plugin: {exc}") from exc


BUILTIN, ONE, TWO = "built-in", "one daemon", "two daemons"
#: --quick still starts two Spark sessions (about 15 s each on a busy 2-core machine)
QUICK_TIME_LIMIT = 90.0


async def run_session(
    ctx: Context, mode: str, rows: int, addresses: str, jar: str, queries: str, extra: Sequence[str] = ()
) -> dict[str, Any]:
    """One `benchmarks.spark_job` process (a Spark session of its own); its JSON line of results."""
    argv = [sys.executable, "-m", "benchmarks.spark_job", "--mode", mode, "--rows", str(rows)]
    argv += ["--addresses", addresses, "--jar", jar, *extra] + (["--queries", queries] if queries else [])
    if ctx.quick:  # its numbers are not read, only that it runs: start and finish the JVMs sooner
        argv += [f"--conf=spark.{side}.extraJavaOptions={SHORT_RUN_JVM}" for side in ("driver", "executor")]
    return await json_job(ctx, f"spark {mode}", argv)


async def json_job(ctx: Context, name: str, argv: list[str]) -> dict[str, Any]:
    """A job process's results: the JSON object it prints on a line of its own before it exits."""
    job = ManagedProcess(name, argv, r"^\{")
    try:
        line = await job.wait_ready(timeout=ctx.scenario_limit)
        await job.wait_exit(60)
    finally:
        job.stop()
    result: dict[str, Any] = json.loads(line.string)
    return result


async def run(ctx: Context, result: ScenarioResult) -> None:
    jar = await asyncio.to_thread(plugin_jar)
    rows = ctx.pick(20_000_000, 100_000)
    order = ctx.pick([BUILTIN, ONE, TWO, ONE, BUILTIN], [BUILTIN, ONE])
    chosen = ctx.pick("", "join_then_aggregate,window_rank")  # "": every query of spark_job
    runs: list[dict[str, Any]] = []
    pool = ctx.pick(1536 * MiB, 128 * MiB)
    async with ctx.daemons(pool, pool) as daemons:
        # The daemons' CPU per GiB Spark shuffled (its shuffle write bytes): A serves every read in the
        # one-daemon runs; in the two-daemon runs A and B each store and serve, and relay half the reads.
        cpu = CpuMeter({"A": daemons[0].pid, "B": daemons[1].pid})
        for setup in order:
            used = daemons[: {BUILTIN: 0, ONE: 1, TWO: 2}[setup]]
            mode = "builtin" if setup == BUILTIN else "plugin"
            with cpu.measure(setup) as measured:
                out = await run_session(ctx, mode, rows, ",".join(d.addr for d in used), jar, chosen)
                measured[0] = sum(v["shuffle_bytes"] for v in out["queries"].values()) if used else 0
            out["setup"] = setup
            runs.append(out)
            times = ", ".join(f"{q} {v['seconds']:.1f}s" for q, v in out["queries"].items())
            ctx.progress(f"{setup}: {times}")

    queries = list(runs[0]["queries"])
    for q in queries:
        digests = {r["queries"][q]["result"] for r in runs}
        require(len(digests) == 1, f"{q}: results differ between runs/modes ({len(digests)} distinct)")

    def seconds(setup: str, query: str) -> float:
        return median([r["queries"][query]["seconds"] for r in runs if r["setup"] == setup])

    plot = Plot("spark", "Spark SQL queries: job time", "", "seconds (median)")
    for q in queries:
        builtin = seconds(BUILTIN, q)
        plot.bars[f"{q}: built-in"] = builtin
        for setup in (s for s in (ONE, TWO) if s in order):
            result.add(f"{q}: plugin, {setup}", seconds(setup, q), "s", baseline_name="built-in", baseline=builtin)
            plot.bars[f"{q}: shuffled, {setup}"] = seconds(setup, q)
    totals = {s: [sum(r["queries"][q]["seconds"] for q in queries) for r in runs if r["setup"] == s] for s in order}
    for setup in (s for s in (ONE, TWO) if s in order):
        result.add(
            f"all queries: plugin, {setup}",
            median(totals[setup]),
            "s",
            baseline_name="built-in",
            baseline=median(totals[BUILTIN]),
            goal=Goal("ratio", "<=", 1.0),
            samples=totals[setup],
        )
    shuffled = sum(v["shuffle_bytes"] for v in runs[0]["queries"].values())
    result.notes.append(
        f"{rows:,} rows, {shuffled / 2**30:.2f} GiB shuffled per run (Spark's shuffle write bytes, compressed), "
        f"run order {', '.join(order)}; results identical in every run"
    )
    result.notes.extend(cpu.notes())
    result.plots.append(plot)
