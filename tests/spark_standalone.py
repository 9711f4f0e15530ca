"""A Spark standalone cluster on loopback: one master and workers on distinct addresses.

``local-cluster`` puts every executor on one host, and Spark never runs a speculative copy on a host
that already runs an attempt of the task; workers on 127.0.0.7 and 127.0.0.8 are two hosts to Spark.
The processes are Spark's own Master and Worker classes from the pyspark wheel (``bin/spark-class``).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark

from tests.cluster import free_port
from tests.spark_jobs import SHORT_RUN_JVM

SPARK_HOME = Path(pyspark.__file__).resolve().parent
START_TIMEOUT = 90.0


class SparkProcess:
    """A Spark daemon process whose log is scanned for the line that says it is up."""

    def __init__(self, argv: list[str], ready: str, env: dict[str, str]) -> None:
        self.log: list[str] = []
        self._ready = threading.Event()
        self._pattern = re.compile(ready)
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if self._pattern.search(line):
                self._ready.set()
        self._ready.set()

    def wait_ready(self) -> None:
        if not self._ready.wait(START_TIMEOUT) or self.proc.poll() is not None:
            raise RuntimeError("Spark process did not start:\n" + "".join(self.log[-40:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(20)


@contextmanager
def standalone_cluster(
    worker_hosts: list[str], master_host: str = "127.0.0.6", netns: list[str] | None = None
) -> Iterator[str]:
    """Yields the master URL once every worker has registered; stops everything on the way out.

    With ``netns``, worker i runs in network namespace ``netns[i]`` (a simulated host, tests/hosts.py).
    """
    import os

    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = free_port([master_host])
    url = f"spark://{master_host}:{port}"
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_NO_DAEMONIZE": "1",
        "SPARK_DAEMON_JAVA_OPTS": SHORT_RUN_JVM,
    }
    procs: list[SparkProcess] = []
    with tempfile.TemporaryDirectory(prefix="shuffled-spark-workers-") as work:
        try:
            master = SparkProcess(
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    master_host,
                    "--port",
                    str(port),
                    "--webui-port",
                    "0",
                ],
                r"I have been elected leader|Starting Spark master",
                env,
            )
            procs.append(master)
            master.wait_ready()
            for i, host in enumerate(worker_hosts):
                inside = ["ip", "netns", "exec", netns[i]] if netns else []
                worker = SparkProcess(
                    [
                        *inside,
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        host,
                        "--webui-port",
                        "0",
                        "--cores",
                        "1",
                        "--memory",
                        "1g",
                        "--work-dir",
                        work,
                        url,
                    ],
                    r"Successfully registered with master",
                    {**env, "SPARK_LOCAL_IP": host},
                )
                procs.append(worker)
            for p in procs[1:]:
                p.wait_ready()
            yield url
        finally:
            for p in reversed(procs):
                p.stop()
