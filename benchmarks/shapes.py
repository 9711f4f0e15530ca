"""`shapes`: the four shuffle-heavy SQL shapes of a TPC-DS-like session (benchmarks/sql_shapes.py) at 200,
2,000 and 10,000 shuffle partitions, through Spark's built-in shuffle and through one daemon, in the same run;
at the widest width, where each reduce task's time goes.

Per width, a session per shuffle, each a process of its own (`benchmarks.spark_job --breakdown`), local[2],
AQE on (Spark's defaults: it coalesces the many small reduce partitions into ranges and splits skewed ones),
broadcast joins off, the four queries in one session with no shuffle cleaned up: first the built-in shuffle,
then the plugin with one daemon on its defaults. Every query's result must be identical in both; the table
reports session time through shuffled over the built-in one per width (the goal: at most 0.8) and per query. With
``SHUFFLED_BENCH_SHAPES_BEFORE_JAR`` naming another plugin jar (an older build), a third session per width runs
it against the same daemon build, for a before/after of the plugin in one run; ``SHUFFLED_BENCH_SHAPES_WIDTHS``
(comma-separated) and ``SHUFFLED_BENCH_SHAPES_ROWS`` choose other widths and sizes. With
``SHUFFLED_BENCH_SHAPES_LOCAL=1`` two more sessions per width reach the daemon at its Unix socket, one pushing
through shared memory and one through the socket (``--shm-dir none``), to compare the two in one run. With
``SHUFFLED_BENCH_SHAPES_FLOOR=1`` one more built-in session per width runs under Java Flight Recorder
(benchmarks/jfr_shares.py): the share of the JVM's samples in the built-in shuffle's own work, and so the least
session time over the built-in one that a shuffle costing nothing could reach (the floor under the goal).

The breakdown (notes, and ``breakdown`` in results.json) puts the two shuffles' reduce stages side by side:
Spark's metrics (tasks, run and CPU time, fetch wait, blocks fetched: the built-in reader fetches an attempt's
consecutive blocks as one batch in a coalesced read), and for the plugin its own counts (read streams, each one
request to the daemon, per reduce task; DATA buffers per stream, bytes and runs per buffer; blocks read as
batches and as pairs) and the daemon's CPU per read stream (planning and feeding a range: the daemon does
little else in these sessions, besides taking the pushes); how AQE read each shuffle (coalesced ranges, parts
of skewed partitions).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from . import jfr_shares, sql_shapes
from .common import Context, Goal, Plot, ScenarioResult, cpu_seconds, require
from .scale import default_pool, session_seconds
from .spark import plugin_jar, run_session

#: fact-table rows of a full run (override with SHUFFLED_BENCH_SHAPES_ROWS)
ROWS_VARIABLE = "SHUFFLED_BENCH_SHAPES_ROWS"
#: another plugin jar to run as a third session per width (before/after in one run)
BEFORE_JAR_VARIABLE = "SHUFFLED_BENCH_SHAPES_BEFORE_JAR"
#: the widths of a full run, comma-separated (default: WIDTHS)
WIDTHS_VARIABLE = "SHUFFLED_BENCH_SHAPES_WIDTHS"
WIDTHS = [200, 2_000, 10_000]
#: set to 1: also the sessions over the Unix socket, with shared memory and without
LOCAL_VARIABLE = "SHUFFLED_BENCH_SHAPES_LOCAL"
#: set to 1: also a built-in session under Java Flight Recorder, for the floor under the goal
FLOOR_VARIABLE = "SHUFFLED_BENCH_SHAPES_FLOOR"
QUICK_WIDTHS = [2_000]
QUICK_QUERIES = ["full_outer_distinct"]
#: the issue's goal: shuffled at most 0.8 of the built-in shuffle's time at every width
GOAL = Goal("ratio", "<=", 0.8)
#: through shared memory against the Unix socket: faster
SHM_GOAL = Goal("ratio", "<", 1.0)
#: six to nine sessions of four heavy queries on 2 cores
TIME_LIMIT = 5400.0
QUICK_TIME_LIMIT = 150.0
BUILTIN, SHUFFLED, BEFORE = "built-in", "shuffled", "shuffled before"
#: the sessions over the Unix socket: the daemon's flags for each
LOCAL = {"shuffled, shared memory": ("--shm-dir", "/dev/shm"), "shuffled, Unix socket": ("--shm-dir", "none")}


async def _plugin(
    ctx: Context, rows: int, jar: str, queries: str, extra: tuple[str, ...], local: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """A session through one daemon on its defaults (`local`: at its Unix socket, with these flags); its JSON
    line gains the daemon's CPU seconds."""
    async with ctx.daemons(default_pool(), unix=local is not None, extra=local or ()) as (daemon,):
        before = cpu_seconds(daemon.pid)
        address = daemon.addr if local is None else f"unix:{daemon.ready_field('unix')}"
        out = await run_session(ctx, "plugin", rows, address, jar, queries, extra)
        out["daemon_cpu"] = cpu_seconds(daemon.pid) - before
    return out


async def local_sessions(
    ctx: Context, result: ScenarioResult, label: str, rows: int, jar: str, queries: str, extra: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """The sessions at the daemon's Unix socket, through shared memory and through the socket alone, and the
    row that judges the one against the other (`label` names the width)."""
    runs = {setup: await _plugin(ctx, rows, jar, queries, extra, flags) for setup, flags in LOCAL.items()}
    shm, socket = (runs[setup] for setup in LOCAL)
    result.add(
        f"{label}: session through shared memory",
        session_seconds(shm),
        "s",
        baseline_name="the Unix socket",
        baseline=session_seconds(socket),
        goal=SHM_GOAL,
    )
    return runs


async def floor(
    ctx: Context, result: ScenarioResult, width: int, rows: int, jar: str, queries: str, extra: tuple[str, ...]
) -> None:
    """A built-in session recorded apart (the recording's cost stays out of the judged ones): about how much of
    the JVM's work was the built-in shuffle's own, and what is left when a shuffle costs nothing. The
    recording stays in the output directory, for a closer look (`jfr print`, JDK Mission Control)."""
    recording = ctx.out_dir / f"shapes-builtin-{width}.jfr"
    whole_stacks = f"--conf=spark.driver.extraJavaOptions={jfr_shares.STACK_DEPTH_OPTION}"  # quick runs' own wins
    await run_session(ctx, "builtin", rows, "", jar, queries, (*extra, whole_stacks, "--record", str(recording)))
    parts = await asyncio.to_thread(jfr_shares.shares, recording)
    shuffle = parts[jfr_shares.OWN_WRITE] + parts[jfr_shares.READ]
    result.add(f"{width:,} partitions: the built-in shuffle's own share of the JVM's samples", shuffle, "ratio")
    result.add(f"{width:,} partitions: a shuffle costing nothing, about", 1 - shuffle, "ratio")
    sampled = parts["samples"] * jfr_shares.SAMPLE_PERIOD
    result.notes.append(
        f"{width:,} partitions, the built-in session's JVM ({parts['samples']:,.0f} samples, {sampled:.0f} thread "
        f"seconds of its {parts['cpu']:.0f} CPU seconds): the writer's own work {parts[jfr_shares.OWN_WRITE]:.1%}, "
        f"rows and partition ids pulled through it {parts[jfr_shares.UPSTREAM_ROWS]:.1%}, the read "
        f"{parts[jfr_shares.READ]:.1%}, the rest {parts[jfr_shares.OTHER]:.1%}"
    )


def _reduce(query: dict[str, Any]) -> dict[str, int]:
    stages: dict[str, int] = query["breakdown"]["stages"]["reduce"]
    return stages


def breakdown_notes(width: int, runs: dict[str, dict[str, Any]]) -> list[str]:
    """One line per query and shuffle: where its reduce stages' time went (see the module)."""
    notes = []
    plugin = runs[SHUFFLED]
    streams_total = sum(q["breakdown"]["plugin"]["streams"] for q in plugin["queries"].values()) or 1
    daemon_ms = 1000 * plugin["daemon_cpu"] / streams_total
    for name in plugin["queries"]:
        for setup, run in runs.items():
            q = run["queries"][name]
            r = _reduce(q)
            blocks = (r["shuffleRemoteBlocksFetched"] + r["shuffleLocalBlocksFetched"]) / (r["numTasks"] or 1)
            line = (
                f"{width:,} partitions, {name}, {setup}: {q['seconds']:.1f}s; reduce stages {r['numTasks']} tasks, "
                f"run {r['executorRunTime'] / 1e3:.1f}s, CPU {r['executorCpuTime'] / 1e9:.1f}s, fetch wait "
                f"{r['shuffleFetchWaitTime'] / 1e3:.2f}s, blocks {blocks:,.0f} per task"
            )
            if "plugin" in q["breakdown"]:
                p = q["breakdown"]["plugin"]
                streams, buffers = p["streams"] or 1, p["buffers"] or 1
                if "open_nanos" in p:
                    outputs = (p["unsorted"] + p["serialized"] + p["sorted"]) or 1
                    line += (
                        f"; per map output {p['open_nanos'] / outputs / 1e6:.1f} ms to open (the daemon's first "
                        f"credit), {p['commit_nanos'] / outputs / 1e6:.1f} ms to commit"
                    )
                line += (
                    f"; {p['streams'] / (p['reads'] or 1):.1f} requests per reduce task, {p['buffers'] / streams:.1f} "
                    f"buffers per request, {p['buffer_bytes'] / buffers / 1024:.1f} KiB and {p['runs'] / buffers:.1f} "
                    f"runs per buffer, blocks {p['batch_blocks']:,} batched / {p['pair_blocks']:,} pairs"
                )
            aqe = q["breakdown"]["aqe_reads"]
            line += "; AQE reads " + (", ".join(f"{n} {k}" for k, n in sorted(aqe.items())) or "none")
            notes.append(line)
    notes.append(
        f"{width:,} partitions: the daemon's CPU in the session per read stream (planning and feeding reads, and "
        f"taking every push): {daemon_ms:.2f} ms"
    )
    return notes


async def run(ctx: Context, result: ScenarioResult) -> None:
    jar = await asyncio.to_thread(plugin_jar)
    before_jar = os.environ.get(BEFORE_JAR_VARIABLE, "")
    rows = ctx.pick(int(os.environ.get(ROWS_VARIABLE, 2_000_000)), 50_000)
    queries = ",".join(ctx.pick(sql_shapes.QUERIES, QUICK_QUERIES))
    chosen = os.environ.get(WIDTHS_VARIABLE, "")
    widths = ctx.pick([int(w) for w in chosen.split(",")] if chosen else WIDTHS, QUICK_WIDTHS)
    times = Plot("shapes", "Shuffle-heavy SQL shapes by shuffle partitions", "", "session seconds")
    breakdown: dict[str, Any] = {}
    for width in widths:
        extra = ("--keep-shuffles", "--breakdown", "--partitions", str(width))
        runs = {BUILTIN: await run_session(ctx, "builtin", rows, "", jar, queries, extra)}
        runs[SHUFFLED] = await _plugin(ctx, rows, jar, queries, extra)
        if before_jar:
            runs[BEFORE] = await _plugin(ctx, rows, before_jar, queries, extra)
        if os.environ.get(LOCAL_VARIABLE) == "1":
            runs.update(await local_sessions(ctx, result, f"{width:,} partitions", rows, jar, queries, extra))
        if os.environ.get(FLOOR_VARIABLE) == "1":
            await floor(ctx, result, width, rows, jar, queries, extra)
        for q in runs[BUILTIN]["queries"]:
            digests = {r["queries"][q]["result"] for r in runs.values()}
            require(len(digests) == 1, f"{width} partitions, {q}: results differ between the shuffles")
        base = session_seconds(runs[BUILTIN])
        for setup in (s for s in runs if s != BUILTIN):
            result.add(
                f"{width:,} partitions: session, {setup}",
                session_seconds(runs[setup]),
                "s",
                baseline_name=BUILTIN,
                baseline=base,
                goal=GOAL if setup == SHUFFLED else None,
            )
            for q, v in runs[setup]["queries"].items():
                result.add(
                    f"{width:,} partitions: {q}, {setup}",
                    v["seconds"],
                    "s",
                    baseline_name=BUILTIN,
                    baseline=runs[BUILTIN]["queries"][q]["seconds"],
                )
        for setup, r in runs.items():
            times.bars[f"{width:,}: {setup}"] = session_seconds(r)
        ctx.progress(", ".join(f"{s} {session_seconds(r):.1f}s" for s, r in runs.items()) + f" at {width:,}")
        breakdown[str(width)] = {s: {q: v.get("breakdown") for q, v in r["queries"].items()} for s, r in runs.items()}
        if width == widths[-1]:
            result.notes.extend(breakdown_notes(width, runs))
    result.notes.append(
        f"{rows:,} rows per fact table, queries {queries}, AQE on, no shuffle cleaned up, one daemon on its defaults; "
        "results identical at every width"
    )
    result.plots.append(times)
    result.extra["breakdown"] = breakdown
