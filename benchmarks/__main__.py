"""`python -m benchmarks [NAMES...] [--quick] [--out DIR]`: run scenarios, print a table, write JSON and PNGs.

Scenarios run one after another (never in parallel: on a 2-core machine they
would measure each other). A scenario that fails is recorded with its error and
the run goes on, so one broken path does not hide the numbers of the others;
the exit code is 1 if any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import cProfile
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType

from tests import reaper

from . import (
    bare,
    hol,
    hosts,
    iperf3,
    latency,
    many_streams,
    memory,
    objectstore,
    objtier,
    one_stream,
    push,
    scale,
    scale_wide,
    shapes,
    soak,
    spark,
    spill,
    star_wide,
    streaming,
    wide,
)
from .common import (
    BASELINE_MAX_AGE,
    BenchmarkFailure,
    Context,
    MachineLoad,
    ScenarioResult,
    Skip,
    format_table,
    progress,
    run_metadata,
    stop_all,
    write_json,
    write_plots,
)

#: in run order: the bare baseline first, so the others find it already measured
SCENARIOS: dict[str, ModuleType] = {
    "bare": bare,
    "iperf3": iperf3,
    "one_stream": one_stream,
    "many_streams": many_streams,
    "hol": hol,
    "push": push,
    "memory": memory,
    "latency": latency,
    "spill": spill,
    "wide": wide,
    "scale_wide": scale_wide,
    "objectstore": objectstore,
    "objtier": objtier,
    "spark": spark,
    "scale": scale,
    "star_wide": star_wide,
    "shapes": shapes,
    "streaming": streaming,
    "hosts": hosts,
    "soak": soak,
}

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _fmt_rate(mib_s: float) -> str:
    return f"{mib_s:,.0f} MiB/s"


def _description(module: ModuleType) -> str:
    doc = (module.__doc__ or "").strip()
    return doc.split("\n\n")[0].replace("\n", " ")


async def _run_one(ctx: Context, name: str, results: list[ScenarioResult]) -> None:
    """Run one scenario into a result already in `results`, so an interrupted run still reports it."""
    module = SCENARIOS[name]
    result = ScenarioResult(name, _description(module))
    results.append(result)
    runner: Callable[[Context, ScenarioResult], Awaitable[None]] = module.run
    ctx.scenario = name
    ctx.progress("start")
    t0 = time.monotonic()
    # A scenario that starts JVMs may need longer than the defaults; it says so in (QUICK_)TIME_LIMIT.
    seconds = getattr(module, "QUICK_TIME_LIMIT" if ctx.quick else "TIME_LIMIT", ctx.time_limit) * ctx.limit_scale
    ctx.scenario_limit = seconds
    limit = asyncio.timeout(seconds)
    profiler = cProfile.Profile() if ctx.profile else None
    try:
        async with limit:
            if profiler is not None:
                profiler.enable()
            try:
                await runner(ctx, result)
            finally:
                if profiler is not None:
                    profiler.disable()
                    profiler.dump_stats(ctx.out_dir / f"{name}-client.prof")
    except Skip as exc:
        result.status, result.error = "skipped", str(exc)
    except TimeoutError as exc:
        if limit.expired():
            result.status, result.error = "failed", f"did not finish within its {seconds:.0f}s limit"
        else:
            result.status, result.error = "failed", f"an operation timed out {exc}".strip()
            traceback.print_exc(file=sys.stderr)
    except BenchmarkFailure as exc:
        result.status, result.error = "failed", str(exc)
    except Exception as exc:
        result.status, result.error = "failed", f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
    except asyncio.CancelledError:
        result.status, result.error = "interrupted", "the run was interrupted (SIGINT/SIGTERM)"
        raise
    finally:
        result.seconds = round(time.monotonic() - t0, 2)
    ctx.progress(f"{result.status} in {result.seconds:.1f}s" + (f": {result.error}" if result.error else ""))


async def _run_all(ctx: Context, names: list[str], results: list[ScenarioResult]) -> None:
    # SIGINT/SIGTERM cancel the run: the running scenario unwinds through its
    # `finally` blocks (stopping its daemons) instead of dying inside a callback.
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    for name in names:
        await _run_one(ctx, name, results)
        stop_all()  # nothing a scenario started outlives it, even if its own cleanup was skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmarks for shuffled on loopback: real daemon processes, baselines measured in the same run.",
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"scenarios to run (default: all): {', '.join(SCENARIOS)}"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, single shots: well under a minute")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run daemons (and this process's client side) under cProfile; writes <scenario>-<who>.prof to --out",
    )
    parser.add_argument("--minutes", type=float, default=None, help="how long the soak runs (default 10)")
    parser.add_argument(
        "--limits",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="multiply every scenario's time limit (default 1: an idle machine; a busy one needs 2 or 3)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    names = [n for n in SCENARIOS if n in args.names] if args.names else list(SCENARIOS)

    atexit.register(stop_all)  # last resort; the normal paths stop every child themselves
    if reaper.supported():
        reaper.current()  # and should this process be killed, its watcher removes what the run left
    args.out.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix="shuffled-bench-"))
    if args.minutes is not None and args.minutes <= 0:
        parser.error("--minutes must be positive")
    ctx = Context(args.quick, args.out, tmp_dir, profile=args.profile, minutes=args.minutes)
    ctx.limit_scale = args.limits
    t0 = time.monotonic()
    load = MachineLoad()
    progress(f"running {', '.join(names)} ({'quick' if args.quick else 'full'}), results in {args.out}")
    results: list[ScenarioResult] = []
    interrupted = False
    try:
        import uvloop

        uvloop.run(_run_all(ctx, names, results))
    except (asyncio.CancelledError, KeyboardInterrupt):
        interrupted = True
        progress("interrupted: daemons stopped, writing the results gathered so far")
    finally:
        stop_all()
        shutil.rmtree(tmp_dir, ignore_errors=True)

    if len(ctx.bare_history) > 1:
        for r in results:
            if r.name == "bare":
                r.notes.append(
                    f"measured again once older than {BASELINE_MAX_AGE:.0f}s, each scenario comparing with the "
                    "latest: " + ", ".join(f"{_fmt_rate(v)} in {name}" for name, v in ctx.bare_history)
                )
    plots = write_plots(args.out, results)
    meta = run_metadata(args.quick, time.monotonic() - t0, sys.argv if argv is None else argv, load)
    write_json(args.out / "results.json", meta, results)
    print(format_table(results))
    print(
        f"\nmachine: {meta['cpus']} cpus, {meta['cpu_steal_percent']}% cpu stolen by the hypervisor during the run, "
        f"1-min load {meta['loadavg_1m_start']} at start, {meta['loadavg_1m_end']} at end"
    )
    print(f"\nwrote {args.out / 'results.json'} and {len(plots)} plot(s) in {args.out} ({meta['seconds']:.0f}s)")
    if interrupted:
        return 130
    return 1 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
