"""`soak`: Spark jobs in a loop on three simulated hosts, each job hit by a random fault, for
``--minutes N`` (default 10; a few jobs with --quick).

One standalone cluster over three namespace hosts (tests/hosts.py), a daemon on each with a 16 MiB pool
so every daemon spills, and one long Spark session, as a user's notebook would keep. Each job is a
groupByKey over a random number of rows whose exact result is known; before it a fault is drawn at
random from the five the test suite injects one by one (tests/host_faults.py: a daemon killed and
restarted on its data dir, a daemon stopped past the peer timeout, a host's link down, a data disk
full) or none, and a host at random. After every job the pools must settle (only stored data held);
when the session ends every daemon must have dropped the application, with no segment in use and no
file left in any data dir. The table reports jobs, faults, wrong results (goal 0), failed jobs and
why, leaked segments and files (goal 0); the plot shows each daemon's RSS and pool use over time.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from typing import Any

from tests.host_faults import PEER_TIMEOUT_S, HostDaemons, Outcome, acceptable, keyed_sums, run_with_fault
from tests.hosts import DAEMON_PORT, GBIT_10, Hosts, netns_unavailable

from .common import Context, Goal, MiB, Plot, ScenarioResult, Skip, in_thread
from .spark import plugin_jar

POOL = "16M"
#: --quick: the cluster and one job with a fault (the suite's test_hosts covers every fault kind)
QUICK_JOBS = 1
QUICK_TIME_LIMIT = 180.0
#: a soak sets its own length; this only catches a hang
TIME_LIMIT = 24 * 3600.0
FAULTS = ("kill", "stop", "link_down", "disk_full", None)


class UsageSampler:
    """Each daemon's RSS and pool use once a second, from a thread; daemons restarted by faults included."""

    def __init__(self, daemons: HostDaemons) -> None:
        self.daemons = daemons
        self.t0 = time.monotonic()
        self.series: dict[str, tuple[list[float], list[float]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> UsageSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _point(self, key: str, value: float) -> None:
        xs, ys = self.series.setdefault(key, ([], []))
        xs.append(time.monotonic() - self.t0)
        ys.append(value)

    def _run(self) -> None:
        import psutil

        from tests.spark_support import daemon_stats

        while not self._stop.wait(1.0):
            for i, d in enumerate(list(self.daemons.daemons)):
                try:
                    rss = psutil.Process(d.pid).memory_info().rss
                    pool = daemon_stats(d)["pool"]
                    used = pool["used"] * pool["segment_size"]
                except Exception:  # a daemon down by a fault: a gap in its line
                    continue
                self._point(f"host {i + 1} RSS", rss / MiB)
                self._point(f"host {i + 1} pool used", used / MiB)


class _Cancel:
    """What the scenario's cancellation (its time limit, SIGINT) does to the soak's thread: no job after the
    running one, which is cancelled (Spark's jobs cannot be interrupted otherwise)."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.spark: Any = None

    def __call__(self) -> None:
        self.requested.set()
        if self.spark is not None:
            self.spark.sparkContext.cancelAllJobs()


def _session(hosts: Hosts, master: str, jar: str, daemons: HostDaemons) -> Any:
    from tests import spark_standalone

    return spark_standalone.session(
        master,
        {
            "spark.jars": jar,
            "spark.driver.host": hosts.gateway,
            "spark.driver.bindAddress": hosts.gateway,
            "spark.executor.memory": "640m",
            "spark.shuffle.manager": "io.shuffled.spark.ShuffledShuffleManager",
            "spark.shuffle.sort.io.plugin.class": "io.shuffled.spark.ShuffledDataIO",
            "spark.shuffled.address": f"127.0.0.1:{DAEMON_PORT}",
            "spark.shuffled.adminAddress": daemons.daemons[0].addr,
            "spark.shuffled.timeout": f"{10 * PEER_TIMEOUT_S}s",
        },
    )


def _soak(jar: str, seconds: float, max_jobs: int, sizes: list[int], seed: int, cancel: _Cancel) -> dict[str, Any]:
    from tests.cluster import poll_until
    from tests.spark_support import daemon_stats, store_emptied

    rng = random.Random(seed)
    report: dict[str, Any] = {"jobs": 0, "faults": Counter(), "wrong": [], "failed": [], "unsettled": []}
    with Hosts(3, GBIT_10) as hosts:
        daemons = HostDaemons(hosts, POOL)
        with hosts.spark_cluster() as master, UsageSampler(daemons) as usage:
            spark = cancel.spark = _session(hosts, master, jar, daemons)
            deadline = time.monotonic() + seconds
            try:
                while report["jobs"] < max_jobs and time.monotonic() < deadline and not cancel.requested.is_set():
                    kind = FAULTS[report["jobs"] % len(FAULTS)] if max_jobs <= len(FAULTS) else rng.choice(FAULTS)
                    host = rng.randrange(3)
                    job, expected = keyed_sums(spark, rng.choice(sizes))
                    if kind is None:
                        fault_name, ok = "none", sorted(job.collect()) == expected
                        outcome = Outcome(None, "")
                    else:
                        fault = getattr(daemons, kind)(host)
                        fault_name = fault.name
                        outcome = run_with_fault(job, daemons, fault)
                        ok = acceptable(outcome, expected, fault)
                    report["jobs"] += 1
                    report["faults"][fault_name] += 1
                    if outcome.result is None and outcome.error:
                        report["failed"].append(f"{fault_name}: {outcome.error.splitlines()[0][:200]}")
                    if not ok and not outcome.error:
                        report["wrong"].append(fault_name)
                    try:
                        daemons.settled()
                    except AssertionError as exc:
                        report["unsettled"].append(f"{fault_name}: {exc}")
            finally:
                spark.stop()
            for d in daemons.daemons:
                poll_until(store_emptied(d, "applications"), 60, f"{d.addr} dropped the app")
            report["leaked_segments"] = sum(daemon_stats(d)["pool"]["used"] for d in daemons.daemons)
            report["leaked_files"] = [str(p) for h in hosts.hosts for p in hosts.data_dir(h).glob("app-*")]
            report["series"] = usage.series
    return report


async def run(ctx: Context, result: ScenarioResult) -> None:
    why = netns_unavailable()
    if why:
        raise Skip(f"no simulated hosts: {why}")
    jar = await asyncio.to_thread(plugin_jar)
    minutes = ctx.minutes if ctx.minutes is not None else ctx.pick(10.0, 3.0)
    seed = random.randrange(1 << 30)
    ctx.progress(f"{minutes:g} minutes, seed {seed}")
    sizes = ctx.pick([200_000, 600_000, 1_500_000], [100_000])
    cancel = _Cancel()
    jobs = ctx.pick(1 << 30, QUICK_JOBS)
    report = await in_thread(lambda: _soak(jar, minutes * 60, jobs, sizes, seed, cancel), cancel)
    result.add("jobs run", report["jobs"], "jobs")
    result.add("faults injected", sum(n for f, n in report["faults"].items() if f != "none"), "faults")
    result.add("wrong results", len(report["wrong"]), "jobs", goal=Goal("value", "<=", 0))
    result.add("jobs failed", len(report["failed"]), "jobs")
    result.add("pools not settled after a job", len(report["unsettled"]), "jobs", goal=Goal("value", "<=", 0))
    result.add("leaked segments", report["leaked_segments"], "segments", goal=Goal("value", "<=", 0))
    result.add("leaked files", len(report["leaked_files"]), "files", goal=Goal("value", "<=", 0))
    result.notes.append(f"seed {seed}; faults: " + ", ".join(f"{f} {n}" for f, n in sorted(report["faults"].items())))
    result.notes.extend(f"failed: {why}" for why in report["failed"])
    result.notes.extend(f"not settled: {why}" for why in report["unsettled"])
    result.notes.extend(f"left behind: {path}" for path in report["leaked_files"])
    plot = Plot("soak", "Soak: daemon RSS and pool use", "seconds", "MiB")
    plot.lines.update(report["series"])
    result.plots.append(plot)
