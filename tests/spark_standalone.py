"""A Spark standalone cluster on loopback: one master and workers on distinct addresses.

``local-cluster`` puts every executor on one host, and Spark never runs a speculative copy on a host
that already runs an attempt of the task; workers on 127.0.0.7 and 127.0.0.8 are two hosts to Spark.
The processes are Spark's own Master and Worker classes from the pyspark wheel (``bin/spark-class``),
started through `shuffled.children` (a process group each, so stopping a worker stops the executors it
launched; and gone with the run, tests/reaper.py).

A session on such a cluster (`session`) waits until every worker runs an executor for it: a cluster that
gives it none fails there, naming what it waited for and showing the tails of the master's, the workers'
and the executors' logs, instead of leaving the first job pending until an outer timeout.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyspark

from shuffled import children
from tests import reaper, spark_jobs
from tests.cluster import free_port
from tests.spark_jobs import SHORT_RUN_JVM

SPARK_HOME = Path(pyspark.__file__).resolve().parent
START_TIMEOUT = 90.0
#: how long a new session may wait for its executors (each a JVM a worker starts; slow on a busy machine)
EXECUTORS_TIMEOUT = 150.0
#: lines of each log a failure shows
TAIL = 25


class SparkProcess:
    """A Spark daemon process whose log is scanned for the line that says it is up."""

    def __init__(self, name: str, argv: list[str], ready: str, env: dict[str, str]) -> None:
        self.name = name
        self.log: deque[str] = deque(maxlen=400)
        self._ready = threading.Event()
        self._pattern = re.compile(ready)
        self.proc = children.spawn(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        )
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if self._pattern.search(line):
                self._ready.set()
        self._ready.set()

    def tail(self) -> str:
        return "".join(list(self.log)[-TAIL:])

    def wait_ready(self) -> None:
        if not self._ready.wait(START_TIMEOUT):
            raise RuntimeError(
                f"{self.name} did not log /{self._pattern.pattern}/ within {START_TIMEOUT:.0f}s:\n{self.tail()}"
            )
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}:\n{self.tail()}")

    def stop(self) -> None:
        children.stop(self.proc, 20)


class StandaloneCluster:
    """The running master and workers; what a session waiting for executors reports when none come."""

    def __init__(self, url: str, work: Path) -> None:
        self.url = url
        self.work = work
        self.procs: list[SparkProcess] = []

    def diagnosis(self) -> str:
        """The tails of every process's log and of every executor's stderr (in the workers' work dir)."""
        parts = [f"--- {p.name} (pid {p.proc.pid}, {_state(p)}):\n{p.tail()}" for p in self.procs]
        for stderr in sorted(self.work.glob("app-*/*/stderr")):
            lines = stderr.read_text(errors="replace").splitlines()[-TAIL:]
            parts.append(f"--- executor {stderr.parent.relative_to(self.work)}:\n" + "\n".join(lines))
        if not list(self.work.glob("app-*")):
            parts.append(f"--- no executor was ever launched (nothing in {self.work})")
        return "\n".join(parts)

    def wait_for_executors(self, spark: Any, timeout: float = EXECUTORS_TIMEOUT) -> None:
        """Until the session has one executor per worker; else an error that says why it might not."""
        want = len(self.procs) - 1
        deadline = time.monotonic() + timeout
        while (have := _executors(spark)) < want:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the session on {self.url} has {have} of {want} executors after {timeout:.0f}s; "
                    f"the cluster's logs:\n{self.diagnosis()}"
                )
            time.sleep(0.2)  # polling the driver's executor list: Spark offers nothing to block on


def _state(p: SparkProcess) -> str:
    code = p.proc.poll()
    return "running" if code is None else f"exited with code {code}"


def _executors(spark: Any) -> int:
    """Executors registered with the session's driver (its block managers, less the driver's own)."""
    return int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1


#: the running clusters by master URL, so that `session` finds the one it is given
_CLUSTERS: dict[str, StandaloneCluster] = {}


def cluster(master: str) -> StandaloneCluster:
    """The running cluster of this master URL."""
    return _CLUSTERS[master]


def session(master: str, conf: dict[str, str]) -> Any:
    """`spark_jobs.session` on a cluster of `standalone_cluster`, returned once every worker runs an executor
    for it (a session that got none is stopped and the error shows the cluster's logs)."""
    spark = spark_jobs.session(master, conf)
    try:
        cluster(master).wait_for_executors(spark)
    except BaseException:
        spark.stop()
        raise
    return spark


@contextmanager
def standalone_cluster(
    worker_hosts: list[str], master_host: str = "127.0.0.6", netns: list[str] | None = None
) -> Iterator[str]:
    """Yields the master URL once every worker has registered; stops everything on the way out.

    With ``netns``, worker i runs in network namespace ``netns[i]`` (a simulated host, tests/hosts.py).
    """
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = free_port([master_host])
    url = f"spark://{master_host}:{port}"
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_NO_DAEMONIZE": "1",
        "SPARK_DAEMON_JAVA_OPTS": SHORT_RUN_JVM,
    }
    run = reaper.current()
    with tempfile.TemporaryDirectory(prefix="shuffled-spark-workers-") as work:
        running = StandaloneCluster(url, Path(work))
        _CLUSTERS[url] = running
        run.add("dir", work)  # a run killed mid-job leaves no executors' logs behind either
        try:
            master_argv = [spark_class, "org.apache.spark.deploy.master.Master", "--host", master_host]
            master_argv += ["--port", str(port), "--webui-port", "0"]
            master = SparkProcess("the master", master_argv, r"I have been elected leader|Starting Spark master", env)
            running.procs.append(master)
            master.wait_ready()
            for i, host in enumerate(worker_hosts):
                inside = ["ip", "netns", "exec", netns[i]] if netns else []
                argv = [*inside, spark_class, "org.apache.spark.deploy.worker.Worker", "--host", host]
                argv += ["--webui-port", "0", "--cores", "1", "--memory", "1g", "--work-dir", work, url]
                worker_env = {**env, "SPARK_LOCAL_IP": host}
                ready = r"Successfully registered with master"
                running.procs.append(SparkProcess(f"worker {i + 1} ({host})", argv, ready, worker_env))
            for p in running.procs[1:]:
                p.wait_ready()
            yield url
        finally:
            for p in reversed(running.procs):
                p.stop()
            del _CLUSTERS[url]
            run.remove("dir", work)
