"""`scale`: a long Spark session of a dozen star-schema SQL queries whose shuffles are never cleaned up,
through Spark's built-in shuffle and through shuffled, in the same run.

Each session is a process of its own (`benchmarks.spark_job --keep-shuffles`), local[2], 64 shuffle
partitions, AQE on (Spark's default: coalescing and skew joins), broadcast joins off. Nothing drops a
query's shuffles, as in a notebook whose driver has not collected garbage yet, so the daemons' stored
data grows with every query. Two plugin set-ups, two daemons each with tasks spread over both:
**defaults** (the daemons' default pool, a data directory to spill to) and **small pools**, chosen so
the session shuffles at least eight times the pools and every daemon spills. The results of every query
must be identical in every session; the table reports plugin/built-in time for the whole session (goal
<= 1.0) and each daemon's peak RSS against its pool (goal: at most pool + 100 MiB).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

from shuffled.config import DaemonConfig
from shuffled.launch import DaemonProcess
from shuffled_client import Client

from . import star_schema
from .common import Context, Goal, MiB, Plot, RssSampler, ScenarioResult, require
from .spark import plugin_jar, run_session

#: sales rows of a full run (10 million: about 1.4 GiB shuffled per session)
ROWS_VARIABLE = "SHUFFLED_BENCH_SCALE_ROWS"
BUILTIN, DEFAULTS, SMALL = "built-in", "defaults", "small pools"
OVERHEAD_MIB = 100
#: every session: no shuffle dropped, the 64 shuffle partitions of the workload it models
_EXTRA = ("--keep-shuffles", "--partitions", "64")
#: --quick starts its Spark sessions with the two queries that shuffle most for their time
QUICK_TIME_LIMIT = 90.0
#: three sessions of a dozen queries over 10 million sales rows on 2 cores
TIME_LIMIT = 5400.0
QUICK_QUERIES = ["customer_segments", "hot_customer_join"]


def default_pool() -> int:
    return int(DaemonConfig().pool_size)


def _disk(daemons: list[DaemonProcess]) -> tuple[list[int], list[int]]:
    """Bytes each daemon has written to its spill files so far, and read back from them for readers."""
    spilled, loaded = [], []
    for d in daemons:
        with Client(d.addr, timeout=10) as client:
            disk = client.stats()["disk"]
        spilled.append(int(disk["spilled_bytes"]))
        loaded.append(int(disk["loaded_bytes"]))
    return spilled, loaded


def disk_note(label: str, run: dict[str, Any]) -> str:
    """What a session's daemons spilled and read back (MiB per daemon)."""
    spilled, loaded = (", ".join(f"{b / MiB:,.0f}" for b in run[key]) for key in ("spilled", "loaded"))
    return f"{label}spilled {spilled} MiB, read back {loaded} MiB per daemon"


async def plugin_session(
    ctx: Context,
    setup: str,
    pools: list[int],
    rows: int,
    jar: str,
    queries: str,
    extra: Sequence[str],
    result: ScenarioResult,
) -> dict[str, Any]:
    """A Spark session through one daemon per pool (tasks spread over them), each daemon's RSS sampled:
    its peak is recorded against its pool (goal: at most pool + OVERHEAD_MIB); the session's JSON line
    gains each daemon's spilled and read-back bytes and the RSS series."""
    async with ctx.daemons(*pools) as daemons:
        pids = {f"{setup}: {d.host}": d.pid for d in daemons}
        with RssSampler(pids, 0.5) as rss:
            out = await run_session(ctx, "plugin", rows, ",".join(d.addr for d in daemons), jar, queries, extra)
        out["spilled"], out["loaded"] = await asyncio.to_thread(_disk, daemons)
        for key, pool in zip(pids, pools, strict=True):
            result.add(
                f"peak RSS, {key}",
                rss.peak(key),
                "MiB",
                baseline_name="pool",
                baseline=pool / MiB,
                goal=Goal("value", "<=", pool / MiB + OVERHEAD_MIB),
            )
        out["rss"] = dict(rss.series)
    return out


def session_seconds(run: dict[str, Any]) -> float:
    """A session's time: the sum of its queries' (the JVM's start and stop left out)."""
    return float(sum(q["seconds"] for q in run["queries"].values()))


def compare_sessions(result: ScenarioResult, label: str, runs: dict[str, dict[str, Any]]) -> None:
    """Every query's result must be the same in every session of ``runs`` (the first: the built-in shuffle);
    each other session's time is recorded against the first one's (goal: at most its time)."""
    first, *others = runs
    for q in runs[first]["queries"]:
        digests = {r["queries"][q]["result"] for r in runs.values()}
        require(len(digests) == 1, f"{label}{q}: results differ between the built-in shuffle and shuffled")
    for setup in others:
        result.add(
            f"session time, {setup}",
            session_seconds(runs[setup]),
            "s",
            baseline_name="built-in",
            baseline=session_seconds(runs[first]),
            goal=Goal("ratio", "<=", 1.0),
        )


async def run(ctx: Context, result: ScenarioResult) -> None:
    jar = await asyncio.to_thread(plugin_jar)
    rows = ctx.pick(int(os.environ.get(ROWS_VARIABLE, 10_000_000)), 200_000)
    queries = ",".join(ctx.pick(star_schema.QUERIES, QUICK_QUERIES))
    small_pool = ctx.pick(64 * MiB, 1 * MiB)
    setups = ctx.pick([BUILTIN, DEFAULTS, SMALL], [BUILTIN, SMALL])
    runs: dict[str, dict[str, Any]] = {}
    plot = Plot("scale", "Long Spark session: daemon RSS", "seconds", "RSS (MiB)")
    for setup in setups:
        if setup == BUILTIN:
            out = await run_session(ctx, "builtin", rows, "", jar, queries, _EXTRA)
        else:
            pool = default_pool() if setup == DEFAULTS else small_pool
            out = await plugin_session(ctx, setup, [pool, pool], rows, jar, queries, _EXTRA, result)
            plot.lines.update(out.pop("rss"))
        runs[setup] = out
        ctx.progress(f"{setup}: {len(out['queries'])} queries in {session_seconds(out):.1f}s")

    compare_sessions(result, "", runs)
    shuffled = sum(q["shuffle_bytes"] for q in runs[BUILTIN]["queries"].values())
    for setup in setups[1:]:
        pools = 2 * (default_pool() if setup == DEFAULTS else small_pool)
        spilled = runs[setup]["spilled"]
        result.notes.append(
            disk_note(f"{setup}: shuffle {shuffled / pools:.1f}x the two pools ({pools // MiB} MiB); ", runs[setup])
        )
        if setup == SMALL:
            require(shuffled >= 8 * pools, f"the session shuffled only {shuffled / pools:.1f}x the pools")
            require(all(b > 0 for b in spilled), f"a daemon did not spill: {spilled}")
    result.notes.append(
        f"{rows:,} sales rows, {len(runs[BUILTIN]['queries'])} queries, {shuffled / 2**30:.2f} GiB shuffled per "
        "session (Spark's shuffle write bytes), no shuffle cleaned up; results identical in every session"
    )
    result.plots.append(plot)
