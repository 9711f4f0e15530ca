"""`star_wide`: the star-schema session at 200, 2,000 and 10,000 shuffle partitions, through one daemon on its
defaults and through Spark's built-in shuffle, in the same run.

Per width, two sessions, each a process of its own (`benchmarks.spark_job --keep-shuffles`), local[2],
AQE on (Spark's default: it coalesces the thousands of small reduce partitions and splits the hot
customer's), broadcast joins off: first the built-in shuffle, then the plugin with one daemon started
with the default pool and a data dir (nothing else set). The wider the shuffle, the more and the smaller
the blocks of every map output, and the more of each map output a coalesced reduce task reads as one
range. Every query's result must be identical in both sessions of a width; the table reports, per
width, plugin/built-in time for the whole session (goal <= 1.0) and the daemon's peak RSS against its
pool (goal: at most pool + 100 MiB).
"""

from __future__ import annotations

import asyncio
import os

from . import star_schema
from .common import Context, MiB, Plot, ScenarioResult
from .scale import BUILTIN, compare_sessions, default_pool, disk_note, plugin_session, session_seconds
from .shapes import local_sessions
from .spark import plugin_jar, run_session

#: sales rows of a full run (override with SHUFFLED_BENCH_STAR_WIDE_ROWS)
ROWS_VARIABLE = "SHUFFLED_BENCH_STAR_WIDE_ROWS"
#: the widths of a full run, comma-separated (default: WIDTHS)
WIDTHS_VARIABLE = "SHUFFLED_BENCH_STAR_WIDE_WIDTHS"
#: set to 1: also the sessions at the daemon's Unix socket, with shared memory and without (as `shapes`)
LOCAL_VARIABLE = "SHUFFLED_BENCH_STAR_WIDE_LOCAL"
WIDTHS = [200, 2_000, 10_000]
#: --quick (part of the test suite): the two sessions of one wide width, of the skewed join alone
QUICK_WIDTHS = [2_000]
QUICK_QUERIES = ["hot_customer_join"]
#: six sessions of a dozen queries on 2 cores (10-16 minutes at the default rows on a shared machine)
TIME_LIMIT = 2400.0
QUICK_TIME_LIMIT = 120.0


async def run(ctx: Context, result: ScenarioResult) -> None:
    jar = await asyncio.to_thread(plugin_jar)
    rows = ctx.pick(int(os.environ.get(ROWS_VARIABLE, 2_000_000)), 100_000)
    queries = ",".join(ctx.pick(star_schema.QUERIES, QUICK_QUERIES))
    pool = default_pool()
    chosen = os.environ.get(WIDTHS_VARIABLE, "")
    widths = ctx.pick([int(w) for w in chosen.split(",")] if chosen else WIDTHS, QUICK_WIDTHS)
    times = Plot("star_wide", "Star-schema session by shuffle partitions", "", "session seconds")
    memory = Plot("star_wide_rss", "Star-schema session: daemon RSS", "seconds", "RSS (MiB)")
    memory.hlines[f"pool + 100 MiB ({pool // MiB + 100} MiB)"] = pool / MiB + 100
    shuffled_bytes: dict[int, int] = {}
    for width in widths:
        extra = ("--keep-shuffles", "--partitions", str(width))
        builtin = await run_session(ctx, "builtin", rows, "", jar, queries, extra)
        plugin = await plugin_session(ctx, f"{width:,} partitions", [pool], rows, jar, queries, extra, result)
        memory.lines.update(plugin.pop("rss"))
        result.notes.append(disk_note(f"{width:,} partitions: ", plugin))
        runs = {BUILTIN: builtin, f"{width:,} partitions": plugin}
        if os.environ.get(LOCAL_VARIABLE) == "1":
            local = await local_sessions(ctx, result, f"{width:,} partitions", rows, jar, queries, extra)
            runs.update({f"{width:,} partitions, {setup}": run for setup, run in local.items()})
        compare_sessions(result, f"{width:,} partitions: ", runs)
        times.bars[f"{width:,}: built-in"] = session_seconds(builtin)
        times.bars[f"{width:,}: shuffled"] = session_seconds(plugin)
        shuffled_bytes[width] = sum(q["shuffle_bytes"] for q in builtin["queries"].values())
        worst_first = sorted(
            plugin["queries"],
            key=lambda q: plugin["queries"][q]["seconds"] / builtin["queries"][q]["seconds"],
            reverse=True,
        )
        ctx.progress(
            f"{width} partitions: built-in {session_seconds(builtin):.1f}s, shuffled {session_seconds(plugin):.1f}s; "
            "per query, seconds shuffled against built-in, worst ratio first: "
            + ", ".join(
                f"{q} {plugin['queries'][q]['seconds']:.1f}/{builtin['queries'][q]['seconds']:.1f}s"
                for q in worst_first
            )
        )
    result.notes.append(
        f"{rows:,} sales rows, {len(queries.split(','))} queries, AQE on, no shuffle cleaned up; one daemon "
        f"({pool // MiB} MiB pool, a data dir); Spark's shuffle write bytes per session: "
        + ", ".join(f"{b / MiB:,.0f} MiB at {w:,}" for w, b in shuffled_bytes.items())
        + "; results identical at every width"
    )
    result.plots += [times, memory]
