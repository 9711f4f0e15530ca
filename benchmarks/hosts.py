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

Then healing: map outputs with two copies are pushed to every daemon (the Python client, from the bridge),
host 3's daemon is killed (-9) for good, and the survivors copy what lost a copy to each other over the
shaped links: the time from the kill until no daemon counts a map output lacking a copy (healing rounds
every 2 s, so detection is part of it), and the bytes copied. Skipped where network namespaces cannot be
made (not root).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any

from shuffled.config import DaemonConfig
from shuffled.launch import DaemonProcess
from shuffled_client import AsyncClient
from tests.hosts import DAEMON_PORT, GBIT_1, GBIT_10, Hosts, LinkProfile, netns_unavailable
from tests.spark_standalone import cluster

from . import star_schema
from .common import (
    BenchmarkFailure,
    Context,
    Goal,
    MiB,
    Plot,
    RssSampler,
    ScenarioResult,
    Skip,
    entered_in_thread,
    median,
    require,
)
from .spark import plugin_jar, run_session

BUILTIN, PLUGIN, REPLICATED = "built-in", "shuffled", "shuffled, 2 copies"
#: --quick: one profile, one session each, two queries. Start-up is most of it: the cluster 35-40 s and each
#: session about 50 s (its JVM, then three executors) on a 2-core machine at a load of 7-8, so 205 s in all
QUICK_TIME_LIMIT = 300.0
TIME_LIMIT = 3600.0
QUICK_QUERIES = ["customer_segments", "hot_customer_join"]
#: every daemon's pool: the default, which is what the RSS goal (pool + 100 MB) is judged against
POOL = DaemonConfig().pool_size
SAMPLE_INTERVAL = 0.2
#: healing rounds (seconds) and the map outputs healing copies
HEAL_INTERVAL = 2
HEAL_ATTEMPT = 4 * MiB


@contextlib.contextmanager
def _cluster(profile: LinkProfile) -> Iterator[tuple[Hosts, str, list[DaemonProcess]]]:
    """Three hosts with a daemon (default pool) each, and a standalone cluster over them; the daemons."""
    with Hosts(3, profile) as hosts:
        pool = f"{POOL >> 20}M"
        daemons = [hosts.start_daemon(host, pool, ["--heal-interval", str(HEAL_INTERVAL)]) for host in hosts.hosts]
        with hosts.spark_cluster() as master:
            yield hosts, master, daemons


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
) -> tuple[str, list[dict[str, Any]], dict[str, float]]:
    runs = []
    async with entered_in_thread(_cluster(profile)) as (hosts, master, daemons):
        pids = {f"daemon {i + 1}": d.pid for i, d in enumerate(daemons)}
        ctx.progress(f"{profile.name}: 3 hosts, links {hosts.shaping}")
        for setup in order:
            mode = "builtin" if setup == BUILTIN else "plugin"
            extra = ["--master", master, "--partitions", "24", "--executors", "3", *_settings(hosts, setup)]
            with RssSampler(pids, SAMPLE_INTERVAL) as sampler:
                try:
                    out = await run_session(ctx, mode, rows, "", jar, queries, extra)
                except RuntimeError as exc:  # say what the cluster did: its processes' and executors' logs
                    raise BenchmarkFailure(f"{exc}\nthe cluster's logs:\n{cluster(master).diagnosis()}") from exc
            out["setup"] = setup
            out["rss_peak"] = max(sampler.peak(k) for k in pids)
            runs.append(out)
            ctx.progress(f"{profile.name}, {setup}: {sum(q['seconds'] for q in out['queries'].values()):.1f}s")
        heal = await _healing(ctx, daemons)
    return hosts.shaping, runs, heal


async def _healing(ctx: Context, daemons: list[DaemonProcess]) -> dict[str, float]:
    """Two copies of map outputs pushed to every daemon; the last daemon killed; how long until no survivor
    counts a map output lacking a copy, and what healing copied."""
    per_daemon = ctx.pick(256 * MiB, 32 * MiB)
    sizes = [HEAL_ATTEMPT // 16] * 16
    clients = [await AsyncClient.connect(d.addr) for d in daemons]
    attempt = 0
    for c in clients:
        for _ in range(per_daemon // HEAL_ATTEMPT):
            attempt += 1
            w = await c.open_writer("heal", 1, attempt, attempt, len(sizes), replicas=2)
            for p, n in enumerate(sizes):
                await w.write(p, bytes([attempt % 251]) * n)
            await w.commit()
    victim = daemons[-1]
    await clients[-1].close()
    victim.proc.send_signal(signal.SIGKILL)
    await asyncio.to_thread(victim.proc.wait, 10)
    t0 = time.monotonic()
    survivors = clients[:-1]
    while True:
        stats = [await c.stats() for c in survivors]
        if all(
            s["store"]["attempts"] == attempt and s["heal"]["missing"] == 0 and s["store"]["under_replicated"] == 0
            for s in stats
        ):
            break
        require(time.monotonic() - t0 < 300, f"healing did not finish: {[s['heal'] for s in stats]}")
        await asyncio.sleep(0.1)  # polling the daemons' stats, not a synchronisation
    seconds = time.monotonic() - t0
    copied = sum(s["heal"]["copied_bytes"] for s in stats)
    for c in survivors:
        await c.remove_application("heal", propagate=False)
        await c.close()
    return {"seconds": seconds, "copied": copied, "copies": sum(s["heal"]["copied"] for s in stats), "held": attempt}


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
        shaping, runs, heal = await _profile_runs(ctx, profile, rows, jar, queries, order)
        result.add(f"healing after a host loss, {profile.name}: time to no copy missing", heal["seconds"], "s")
        result.add(f"healing after a host loss, {profile.name}: bytes copied", heal["copied"] / MiB, "MiB")
        result.notes.append(
            f"{profile.name} healing: {heal['held']:.0f} map outputs of {HEAL_ATTEMPT // MiB} MiB with 2 copies on 3 "
            f"daemons, one killed; {heal['copies']:.0f} copies made ({heal['copied'] / MiB:,.0f} MiB) in "
            f"{heal['seconds']:.1f} s (rounds every {HEAL_INTERVAL} s, heal-bandwidth 64 MiB/s per daemon)"
        )
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
