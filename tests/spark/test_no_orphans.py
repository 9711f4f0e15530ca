"""Nothing a run starts outlives it, however it ends: a quick benchmark run of the `hosts` scenario and a Spark
test session, each killed with SIGKILL while everything they start is running (daemons, a Spark master,
workers, executors, network namespaces and links), leave none of it 10 s later.

Each child is a run of its own (tests/reaper.py): what it made is found by its owner's mark in the processes'
environments and by its run's file, read before the kill; the test first checks that these were there, so a
run that had started nothing yet cannot pass. That a run which ends normally leaves nothing is checked by
every test session at its end (tests/conftest.py).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shuffled import children
from tests import reaper
from tests.hosts import netns_unavailable
from tests.spark_support import needs_spark

REPO = Path(__file__).resolve().parents[2]
#: what the issue that asked for this allows: everything gone 10 s after the kill
GONE_WITHIN = 10.0
#: how long a child may take to have everything running (a cluster of JVMs on a busy 2-core machine)
MID_RUN_TIMEOUT = 300.0

pytestmark = [
    needs_spark,
    pytest.mark.skipif(netns_unavailable() is not None, reason=f"no simulated hosts: {netns_unavailable()}"),
    pytest.mark.timeout(MID_RUN_TIMEOUT + 120),
]


class Child:
    """A run started as a child process, its output read line by line; `wait_for` a line, `kill` it."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = children.spawn(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.owner = reaper.owner_of(self.proc.pid)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # the end of its output
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float) -> None:
        def seen() -> bool:
            return any(text in line for line in self.lines)

        with self._changed:
            if not self._changed.wait_for(lambda: seen() or "" in self.lines, timeout):
                pytest.fail(f"no {text!r} within {timeout:.0f}s; its output:\n{''.join(self.lines[-60:])}")
            if not seen():
                pytest.fail(f"it ended (code {self.proc.wait(10)}) before {text!r}:\n{''.join(self.lines[-60:])}")

    def running(self, what: str) -> Callable[[], bool]:
        """A check: one of its processes has ``what`` in its command line."""
        return lambda: any(what in line for line in reaper.commands(self.owner))


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.2)  # polling /proc: a process's start offers nothing to wait on


def _kill_and_check(child: Child) -> None:
    """SIGKILL, then every process of the run and everything its file listed is gone within `GONE_WITHIN`."""
    made = reaper.things(child.owner)
    before = reaper.leftovers(child.owner, made)
    for kind in ("process", "netns", "link"):
        assert any(line.startswith(f"{kind} ") for line in before), f"no {kind} of the run before the kill: {before}"
    child.proc.send_signal(signal.SIGKILL)
    child.proc.wait(10)
    deadline = time.monotonic() + GONE_WITHIN
    while left := reaper.leftovers(child.owner, made):
        if time.monotonic() > deadline:
            pytest.fail(f"{GONE_WITHIN:.0f}s after the kill, still there:\n" + "\n".join(left))
        time.sleep(0.2)  # polling /proc and ip: the reaper's progress offers nothing to wait on


def test_a_benchmark_run_killed_mid_session_leaves_nothing(tmp_path: Path) -> None:
    child = Child([sys.executable, "-m", "benchmarks", "--quick", "hosts", "--out", str(tmp_path)])
    child.wait_for("3 hosts, links", MID_RUN_TIMEOUT)  # the hosts, their daemons and the Spark cluster are up
    _until(child.running("CoarseGrainedExecutorBackend"), MID_RUN_TIMEOUT, "a session's executor runs")
    _kill_and_check(child)


def test_a_spark_test_session_killed_mid_job_leaves_nothing() -> None:
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "tests/spark/held_session.py",
        "-s",
        "-q",
        "-p",
        "no:cacheprovider",
        "-n",
        "0",
    ]
    child = Child(argv)
    child.wait_for("holding", MID_RUN_TIMEOUT)  # its session has its executors
    _until(child.running("pyspark.daemon"), MID_RUN_TIMEOUT, "a task's Python worker runs")
    _kill_and_check(child)
