"""`hosts`: the star-schema queries on a Spark standalone cluster of three simulated hosts (network
namespaces on a bridge of their own, each link shaped with ``tc``), through Spark's built-in shuffle
and through shuffled, per link profile.

Every host runs a Spark worker (one core, one executor) and a daemon with the default pool; executors
push to and read from their own host's daemon at ``127.0.0.1:7337``, and daemons relay reads to each
other over the bridge, as on a real cluster. The built-in shuffle fetches over the same links. Sessions
alternate built-in, shuffled, and shuffled with two copies of every map output
(``spark.shuffled.replicas=2``; twice each in the full run); every query's results must be identical.
The ratios are shuffled's session time over the built-in one (goal <= 1.0), two copies over one (goal
<= 1.3), and the peak RSS of any daemon during the replicated sessions (goal <= pool + 100 MiB). Where the kernel has no
``sch_netem`` the links are rate-limited only (``tbf``) and no delay is emulated; the notes say which.
Skipped where network namespaces cannot be made (not root).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from shuffled.config import DaemonConfig
from tests.hosts import DAEMON_PORT, GBIT_1, GBIT_10, Hosts, LinkProfile, netns_unavailable

from . import star_schema
from .common import Context, Goal, MiB, Plot, RssSampler, ScenarioResult, Skip, median, require
from .spark import plugin_jar, run_session

BUILTIN, PLUGIN, REPLICATED = "built-in", "shuffled", "shuffled, 2 copies"
#: --quick: one profile, one session each, two queries (cluster start-up is most of it)
QUICK_TIME_LIMIT = 150.0
TIME_LIMIT = 3600.0
QUICK_QUERIES = ["customer_segments", "hot_customer_join"]
#: every daemon's pool: the default, which is what the RSS goal (pool + 100 MB) is judged against
POOL = DaemonConfig().pool_size
SAMPLE_INTERVAL = 0.2


@contextlib.contextmanager
def _cluster(profile: LinkProfile) -> Iterator[tuple[Hosts, str, dict[str, int]]]:
    """Three hosts with a daemon (default pool) each, and a standalone cluster over them; the daemons' pids."""
    with Hosts(3, profile) as hosts:
        pool = f"{POOL >> 20}M"
        pids = {f"daemon {host.index}": hosts.start_daemon(host, pool).pid for host in hosts.hosts}
        with hosts.spark_cluster() as master:
            yield hosts, master, pids


def _settings(hosts: Hosts, setup: str) -> list[str]:
    mode = "builtin" if setup == BUILTIN else "plugin"
    conf = {
        "spark.driver.host": hosts.gateway,
        "spark.driver.bindAddress": hosts.gateway,
        "spark.executor.memory": "640m",
    }
    if mode == "plugin":
        conf["spark.shuffled.address"] = f"127.0.0.1:{DAEMON_PORT}"  # every executor: its host's daemon
        conf["spark.shuffled.daemonChoice"] = "executor"
        conf["spark.shuffled.adminAddress"] = hosts.hosts[0].daemon_addr
    if setup == REPLICATED:
        conf["spark.shuffled.replicas"] = "2"  # each daemon forwards what it takes to one other host's daemon
    return [arg for k, v in conf.items() for arg in ("--conf", f"{k}={v}")]


async def _profile_runs(
    ctx: Context, profile: LinkProfile, rows: int, jar: str, queries: str, order: list[str]
) -> tuple[str, list[dict[str, Any]]]:
    stack = contextlib.ExitStack()
    hosts, master, pids = await asyncio.to_thread(lambda: stack.enter_context(_cluster(profile)))
    runs = []
    try:
        ctx.progress(f"{profile.name}: 3 hosts, links {hosts.shaping}")
        for setup in order:
            mode = "builtin" if setup == BUILTIN else "plugin"
            extra = ["--master", master, "--partitions", "24", *_settings(hosts, setup)]
            with RssSampler(pids, SAMPLE_INTERVAL) as sampler:
                out = await run_session(ctx, mode, rows, "", jar, queries, extra)
            out["setup"] = setup
            out["rss_peak"] = max(sampler.peak(k) for k in pids)
            runs.append(out)
            ctx.progress(f"{profile.name}, {setup}: {sum(q['seconds'] for q in out['queries'].values()):.1f}s")
    finally:
        await asyncio.to_thread(stack.close)
    return hosts.shaping, runs


async def run(ctx: Context, result: ScenarioResult) -> None:
    why = netns_unavailable()
    if why:
        raise Skip(f"no simulated hosts: {why}")
    jar = await asyncio.to_thread(plugin_jar)
    rows = ctx.pick(3_000_000, 100_000)
    queries = ",".join(ctx.pick(star_schema.QUERIES, QUICK_QUERIES))
    order = ctx.pick([BUILTIN, PLUGIN, REPLICATED, REPLICATED, PLUGIN, BUILTIN], [BUILTIN, PLUGIN, REPLICATED])
    plot = Plot("hosts", "Three hosts: Spark session time per link", "", "seconds (median)")
    digests: dict[str, set[str]] = {}
    for profile in ctx.pick([GBIT_1, GBIT_10], [GBIT_10]):
        shaping, runs = await _profile_runs(ctx, profile, rows, jar, queries, order)
        for r in runs:
            for q, v in r["queries"].items():
                digests.setdefault(q, set()).add(v["result"])
        times = {s: [sum(q["seconds"] for q in r["queries"].values()) for r in runs if r["setup"] == s] for s in order}
        result.add(
            f"session time, {profile.name}",
            median(times[PLUGIN]),
            "s",
            baseline_name="built-in",
            baseline=median(times[BUILTIN]),
            goal=Goal("ratio", "<=", 1.0),
            samples=times[PLUGIN],
        )
        result.add(
            f"session time with 2 copies, {profile.name}",
            median(times[REPLICATED]),
            "s",
            baseline_name="1 copy",
            baseline=median(times[PLUGIN]),
            goal=Goal("ratio", "<=", 1.3),
            samples=times[REPLICATED],
        )
        peak = max(r["rss_peak"] for r in runs if r["setup"] == REPLICATED)
        result.add(
            f"peak daemon RSS with 2 copies, {profile.name}",
            peak,
            "MiB",
            baseline_name="pool",
            baseline=POOL / MiB,
            goal=Goal("value", "<=", POOL / MiB + 100),
        )
        for setup in order:
            plot.bars[f"{profile.name}: {setup}"] = median(times[setup])
        result.notes.append(f"{profile.name}: links {shaping}; run order {', '.join(order)}")
    different = [q for q, d in digests.items() if len(d) != 1]
    require(not different, f"results differ between sessions: {different}")
    result.notes.append(f"{rows:,} sales rows, 24 shuffle partitions, 3 executors of one core; results identical")
    result.plots.append(plot)
