"""Faults injected into simulated hosts while Spark jobs run: shared by tests/spark/test_hosts.py and the
soak benchmark, so both break the daemons the same way and judge the outcome by the same rules.

A fault has a moment. ``before`` a job starts (a daemon restarted onto a tiny full disk), ``mid_map``
once the job's first map output is committed (a daemon killed and restarted on its data dir), or on a
``reread`` of a shuffle already computed, so that the reduce tasks meet the fault for certain (a daemon
stopped, a host's link down: other daemons relay reads to it and must give up after the peer timeout).
A fault is repaired as soon as it took effect (or the job ended); what it changed for the job only (the
tiny disk) is restored after the job. The job must then give exactly the right result, or fail with a
message that names the cause; the pools must settle with nothing leaked.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shuffled.launch import STOP_TIMEOUT
from tests.cluster import DaemonProcess, poll_until
from tests.hosts import Hosts
from tests.spark_support import Daemon, daemon_stats, stage_data

PEER_TIMEOUT_S = 3
#: how long a daemon stopped with SIGTERM may take to hand its data over and let its reads finish
DRAIN_TIMEOUT_S = 60
#: two copies of every map output, handed over on SIGTERM: what a cluster that rolls its daemons runs with
REPLICATED = ["--replicas", "2", "--drain-handoff", "on", "--drain-timeout", str(DRAIN_TIMEOUT_S)]
#: the disk of the `disk_full` fault, and the memory one application may hold there before it spills: four
#: segments, the least a quota may be with push windows of two (packed groups fill their segments, so a fault
#: job's map output on one host stayed under 1M, 32 segments, where a segment per block once made hundreds)
TINY_DISK, SPILL_QUOTA, SPILL_WINDOW = "16m", "128K", "2"
#: what a failed job's message may name when a disk was full
STORAGE_CAUSES = ("STORAGE_ERROR", "No space")


def _nothing() -> None:
    return None


@dataclass
class Fault:
    name: str
    moment: str  # "before", "mid_map" or "reread"
    inject: Callable[[], None]
    took_effect: Callable[[], bool]
    repair: Callable[[], None] = _nothing
    restore: Callable[[], None] = _nothing  # after the job
    seen: bool = False

    def happened(self) -> bool:
        """Whether it took effect; remembered, as a restore may replace what showed it."""
        self.seen = self.seen or self.took_effect()
        return self.seen


@dataclass
class Outcome:
    result: list[Any] | None
    error: str


class HostDaemons:
    """One daemon per simulated host, restartable on its data dir; the faults that can hit each."""

    def __init__(
        self, hosts: Hosts, pool: str = "32M", flags: list[str] | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        self.hosts = hosts
        self.pool = pool
        #: flags every daemon starts with (`reconfigure` changes them), and their environment (None: ours)
        self.flags: list[str] = flags or []
        self.env = env
        self.daemons = [self._start(i) for i in range(len(hosts.hosts))]

    def _start(self, i: int, extra: list[str] | None = None) -> DaemonProcess:
        flags = ["--peer-timeout", str(PEER_TIMEOUT_S), *self.flags, *(extra or [])]
        return self.hosts.start_daemon(self.hosts.hosts[i], self.pool, flags, self.env)

    def restart(self, i: int, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM (a drain, with hand-over if the daemon's flags say so), then a new process on the data dir."""
        self.daemons[i].stop(timeout)
        self.daemons[i] = self._start(i)

    def reconfigure(self, flags: list[str]) -> None:
        """Every daemon restarted with `flags`."""
        self.flags = flags
        for i in range(len(self.daemons)):
            self.restart(i)

    def rolling_restart(self, done: Callable[[], bool]) -> list[DaemonProcess]:
        """Each daemon in turn drained, stopped and started again, as a rolling upgrade does; stops early once
        `done()` (the job ended). Returns the processes stopped while the job still ran."""
        stopped = []
        for i in range(len(self.daemons)):
            if done():
                break
            stopped.append(self.daemons[i])
            self.restart(i, DRAIN_TIMEOUT_S + STOP_TIMEOUT)
        return stopped

    def commits(self) -> int:
        return sum(daemon_stats(d)["store"]["commits"] for d in self.daemons)

    def _logged(self, text: str, among: list[int]) -> Callable[[], bool]:
        return lambda: any(text in line for i in among for line in self.daemons[i].log)

    def kill(self, i: int) -> Fault:
        victim = self.daemons[i]

        def inject() -> None:
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(10)

        return Fault(
            "daemon killed, restarted",
            "mid_map",
            inject,
            lambda: victim.proc.poll() is not None,
            lambda: self.restart(i),
        )

    def stop(self, i: int) -> Fault:
        victim = self.daemons[i]
        others = [j for j in range(len(self.daemons)) if j != i]
        return Fault(
            "daemon stopped past the peer timeout",
            "reread",
            lambda: victim.proc.send_signal(signal.SIGSTOP),
            self._logged("peer timed out", others),
            lambda: victim.proc.send_signal(signal.SIGCONT),
        )

    def link_down(self, i: int) -> Fault:
        host = self.hosts.hosts[i]
        others = [j for j in range(len(self.daemons)) if j != i]
        return Fault(
            "host link down",
            "reread",
            lambda: host.link(False),
            self._logged("peer timed out", others),
            lambda: host.link(True),
        )

    def disk_full(self, i: int) -> Fault:
        """The daemon restarted onto a tmpfs that is then filled, with a per-application memory quota
        that makes it spill: every spill fails with ENOSPC."""
        data_dir = self.hosts.data_dir(self.hosts.hosts[i])

        def inject() -> None:
            self.daemons[i].stop()
            data_dir.mkdir(parents=True, exist_ok=True)
            mount = ["mount", "-t", "tmpfs", "-o", f"size={TINY_DISK}", "tmpfs", str(data_dir)]
            subprocess.run(mount, check=True, capture_output=True, timeout=30)
            self.daemons[i] = self._start(i, extra=["--app-memory-quota", SPILL_QUOTA, "--push-window", SPILL_WINDOW])
            fill(data_dir / "filler")

        def restore() -> None:
            self.daemons[i].stop()
            subprocess.run(["umount", "-l", str(data_dir)], capture_output=True, timeout=30)
            self.daemons[i] = self._start(i)

        def spill_failed() -> bool:
            return any("spill failed" in line for line in self.daemons[i].log)

        return Fault("data disk full", "before", inject, spill_failed, restore=restore)

    def faults(self, i: int) -> list[Fault]:
        return [self.kill(i), self.stop(i), self.link_down(i), self.disk_full(i)]

    def settled(self, timeout: float = 60) -> None:
        settled(self.daemons, timeout)


def settled(daemons: Sequence[Daemon], timeout: float = 60) -> None:
    """Every pool holds exactly its stored data: nothing leaked by the fault."""
    for daemon in daemons:

        def quiet(daemon: Daemon = daemon) -> bool:
            s = daemon_stats(daemon)
            st = s["streams"]
            busy = st["served"] + st["pushing"] + st["remote_channels"] + s["pool"]["local_pools"]
            return bool(busy == 0 and s["pool"]["used"] == s["store"]["stored_segments"])

        poll_until(quiet, timeout, f"{daemon.addr}'s pool settled")


def total(daemons: Sequence[Daemon], path: str) -> int:
    """A stats counter summed over the daemons (a counter by code: all codes)."""
    section, key = path.split(".")
    values = [daemon_stats(d)[section][key] for d in daemons]
    return sum(sum(v.values()) if isinstance(v, dict) else v for v in values)


def fill(path: Path) -> None:
    """Takes every free block of the file system under ``path``."""
    st = os.statvfs(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize)
    finally:
        os.close(fd)


def keyed_sums(spark: Any, rows: int, keys: int = 997) -> tuple[Any, list[tuple[int, int]]]:
    """A groupByKey job over ``rows`` rows (24 map tasks, 12 reducers) and its exact result."""
    data = spark.sparkContext.parallelize(range(rows), 24).map(lambda i: (i % keys, i))
    sums: dict[int, int] = {}
    for i in range(rows):
        sums[i % keys] = sums.get(i % keys, 0) + i
    return data.groupByKey(12).mapValues(sum), sorted(sums.items())


def paced_chain(spark: Any, rows: int, seconds: float, keys: int = 997) -> tuple[Any, list[tuple[int, int]]]:
    """A three-stage job (two shuffles) whose tasks each take at least `seconds`, so that daemons can be
    restarted one by one while it runs; and its exact result."""

    def pace(items: Any) -> Any:
        time.sleep(seconds)  # workload pacing inside a Spark task, not a test synchronisation
        return items

    data = spark.sparkContext.parallelize(range(rows), 12).mapPartitions(pace).map(lambda i: (i % keys, i))
    sums = data.reduceByKey(lambda a, b: a + b, 6).mapPartitions(pace)
    job = sums.map(lambda kv: (kv[1] % 101, kv[0])).reduceByKey(lambda a, b: a + b, 3).mapPartitions(pace)
    totals: dict[int, int] = {}
    for i in range(rows):
        totals[i % keys] = totals.get(i % keys, 0) + i
    expected: dict[int, int] = {}
    for key, total in totals.items():
        expected[total % 101] = expected.get(total % 101, 0) + key
    return job, sorted(expected.items())


def resubmitted(spark: Any, before: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """Stage attempts since `before` that were resubmissions (attempt > 0): what a fetch failure causes."""
    return [
        (s.stageId(), s.attemptId())
        for s in stage_data(spark)
        if (s.stageId(), s.attemptId()) not in before and s.attemptId() > 0
    ]


def drained(daemon: DaemonProcess) -> tuple[bool, int]:
    """Whether a stopped daemon's drain finished in time, and how many copies it handed over."""
    lines = [line for line in daemon.log if "drained" in line or "drain timed out" in line]
    copied = re.search(r"\bcopied=(\d+)", lines[-1]) if lines else None
    return bool(lines) and "drained" in lines[-1], int(copied.group(1)) if copied else 0


def stage_attempts(spark: Any) -> set[tuple[int, int]]:
    return {(s.stageId(), s.attemptId()) for s in stage_data(spark)}


def run_with_fault(job: Any, daemons: HostDaemons, fault: Fault) -> Outcome:
    """Runs ``job`` with ``fault`` injected at its moment; repaired once it took effect or the job ended."""
    if fault.moment == "reread":
        sorted(job.collect())  # the shuffle is computed and stored; the next collect only reads it
    if fault.moment == "before":
        fault.inject()
    commits = daemons.commits()
    try:
        with ThreadPoolExecutor(1) as pool:
            if fault.moment == "reread":
                fault.inject()
            running = pool.submit(lambda: sorted(job.collect()))
            try:
                return _judge(job, daemons, fault, running, commits)
            except BaseException:
                job.context.cancelAllJobs()  # the job ends, so leaving the pool does not wait for it for ever
                raise
    finally:
        fault.happened()
        fault.restore()


def _judge(job: Any, daemons: HostDaemons, fault: Fault, running: Future[list[Any]], commits: int) -> Outcome:
    """The fault injected into the running job (mid-map: once a map output is committed), repaired once it took
    effect; the job's outcome."""
    if fault.moment == "mid_map":
        poll_until(lambda: running.done() or daemons.commits() > commits, 120, "map output committed")
        fault.inject()
    try:
        poll_until(lambda: fault.happened() or running.done(), 60, f"{fault.name}: took effect")
    finally:
        fault.repair()
    try:
        return Outcome(running.result(timeout=300), "")
    except FutureTimeout:
        raise AssertionError(f"the job did not end within 300 s of the fault ({fault.name})") from None
    except Exception as exc:  # the job failed: the caller checks that the message names the cause
        return Outcome(None, str(exc))


def acceptable(outcome: Outcome, expected: list[Any], fault: Fault) -> bool:
    """Exactly the right rows, or (for a full disk only) a failure naming the storage error."""
    if outcome.result is not None:
        return outcome.result == expected
    return fault.moment == "before" and any(c in outcome.error for c in STORAGE_CAUSES)
