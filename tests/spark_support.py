"""Fixtures' building blocks for the Spark tests: the plugin jar, daemons for Spark, built-in results."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from shuffled import spark_jar
from shuffled_client import Client
from tests import spark_jobs
from tests.cluster import Cluster, DaemonProcess, start_daemon
from tests.jvm import needs_jdk

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[test]')")

needs_spark = needs_jdk


class Daemon(Protocol):
    """What the Spark helpers need of a daemon, a process (`DaemonProcess`) or a container (tests/image.py):
    the address its stats are asked at."""

    @property
    def addr(self) -> str: ...


#: Bound of every read/push wait in the plugin during tests (a hang becomes an error, not a stuck test).
PLUGIN_TIMEOUT = "30s"


def plugin_conf(jar: Path, daemons: Sequence[Daemon], daemon_choice: str) -> dict[str, str]:
    conf = spark_jar.spark_conf(jar, [d.addr for d in daemons], daemon_choice)
    conf["spark.shuffled.timeout"] = PLUGIN_TIMEOUT
    return conf


@contextmanager
def spark_daemons(hosts: list[str], pool_size: str = "128M") -> Iterator[list[DaemonProcess]]:
    """Daemons on these loopback addresses, one port, each told about the others."""
    with Cluster(hosts, pool_size) as cluster:
        yield cluster.daemons


def daemons_fixture(hosts: list[str], pool_size: str = "128M") -> Any:
    """A module-scoped fixture of `spark_daemons`, named by the module's assignment
    (``daemons = daemons_fixture(["127.0.0.2"])``)."""

    @pytest.fixture(scope="module")
    def running() -> Iterator[list[DaemonProcess]]:
        with spark_daemons(hosts, pool_size) as ds:
            yield ds

    return running


def session_fixture(master: str, daemon_choice: str, conf: dict[str, str] | None = None) -> Any:
    """A module-scoped fixture of a Spark session through the plugin and the module's `daemons` (with
    `conf` on top), named by the module's assignment; made after `builtin` (the built-in shuffle's
    results, from a session of its own), since one Python process holds one session at a time."""

    @pytest.fixture(scope="module")
    def session(builtin: dict[str, Any], plugin_jar: Path, daemons: list[DaemonProcess]) -> Iterator[Any]:
        spark = spark_jobs.session(master, {**plugin_conf(plugin_jar, daemons, daemon_choice), **(conf or {})})
        yield spark
        spark.stop()

    return session


def restart(daemon: DaemonProcess, peers: list[DaemonProcess], pool: str = "128M") -> DaemonProcess:
    """A new daemon process on the same address (killed first if still alive: SIGKILL), as systemd or Kubernetes
    would start after a crash; `peers` none for a daemon that has none."""
    if daemon.proc.poll() is None:
        daemon.proc.kill()
        daemon.proc.wait(10)
    extra = ["--peers", ",".join(d.addr for d in peers)] if peers else []
    return start_daemon(daemon.host, daemon.port, pool, extra)


def daemon_stats(daemon: Daemon) -> dict[str, Any]:
    with Client(daemon.addr, timeout=10) as client:
        return client.stats()


def store_emptied(daemon: Daemon, key: str) -> Callable[[], bool]:
    """A check for `poll_until`: the daemon's store counts no `key` any more (`applications`, `stored_segments`)."""
    return lambda: bool(daemon_stats(daemon)["store"][key] == 0)


def stage_data(spark: Any) -> list[Any]:
    """Spark's status store entries for every stage attempt so far (task metrics summed per stage)."""
    sc = spark.sparkContext
    gateway = sc._gateway
    no_quantiles = gateway.new_array(gateway.jvm.double, 0)
    empty = gateway.jvm.java.util.Collections.emptyList()
    stages = sc._jsc.sc().statusStore().stageList(None, False, False, no_quantiles, empty)
    return [stages.apply(i) for i in range(stages.size())]


def writer_paths(spark: Any) -> dict[str, int]:
    """Map outputs this JVM (the driver and its local executors) wrote by each of the plugin writer's paths."""
    counts = spark.sparkContext._jvm.io.shuffled.spark.Counts.mapOutputs()
    return dict(zip(("unsorted", "serialized", "sorted"), (int(c) for c in counts), strict=True))


def read_blocks(spark: Any) -> dict[str, int]:
    """Blocks this JVM's reduce tasks read as one (partition, attempt) pair and as all of an attempt's pairs."""
    counts = spark.sparkContext._jvm.io.shuffled.spark.Counts.blocks()
    return dict(zip(("pair", "batch"), (int(c) for c in counts), strict=True))


def serialized_map_outputs(spark: Any) -> int:
    """Map outputs this JVM (the driver and its local executors) wrote by the plugin's serialized path."""
    return writer_paths(spark)["serialized"]


def serialized_fills(spark: Any) -> int:
    """Fills this JVM's serialized path wrote out: each gives each partition in it a stream (compressed or not)."""
    return int(spark.sparkContext._jvm.io.shuffled.spark.Counts.fills())


def _numbers(tree: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Every number in a stats tree, keyed by its dotted path ("disk.spills")."""
    out: dict[str, float] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_numbers(value, f"{prefix}{key}."))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[prefix + key] = value
    return out


@dataclass
class JobTraffic:
    """What one job moved, by Spark's metrics and by each daemon's counters (deltas over the job)."""

    spark_written: int = 0
    spark_read: int = 0
    daemon_deltas: list[dict[str, Any]] = field(default_factory=list)

    def total(self, path: str) -> float:
        return sum(_numbers(d).get(path, 0) for d in self.daemon_deltas)

    def assert_exact(self) -> None:
        """With no failed or speculative attempt, the daemons committed exactly what Spark's map tasks
        wrote, and served (from their own store, memory or disk) exactly what its reducers read."""
        assert self.total("store.committed_bytes") == self.spark_written, self
        assert self.total("traffic.served_local_bytes") == self.spark_read, self


@contextmanager
def job_traffic(spark: Any, daemons: Sequence[Daemon], exact: bool = True) -> Iterator[JobTraffic]:
    """Run a job inside: afterwards the daemons must have committed and served its shuffle bytes.

    Deltas, not totals, so a test proves its own job went through the daemons, whatever ran before.
    """
    stages_before = {(s.stageId(), s.attemptId()) for s in stage_data(spark)}
    before = [_numbers(daemon_stats(d)) for d in daemons]
    traffic = JobTraffic()
    yield traffic
    for d, old in zip(daemons, before, strict=True):
        new = _numbers(daemon_stats(d))
        delta: dict[str, Any] = {}
        for path, value in new.items():
            node = delta
            *parents, leaf = path.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value - old.get(path, 0)
        traffic.daemon_deltas.append(delta)
    for s in stage_data(spark):
        if (s.stageId(), s.attemptId()) not in stages_before:
            traffic.spark_written += s.shuffleWriteBytes()
            traffic.spark_read += s.shuffleLocalBytesRead() + s.shuffleRemoteBytesRead()
    assert traffic.spark_written > 0, "the job wrote no shuffle data"
    assert traffic.total("store.committed_bytes") >= traffic.spark_written, traffic
    assert traffic.total("traffic.served_local_bytes") >= traffic.spark_read > 0, traffic
    if exact:
        traffic.assert_exact()


def builtin_results(jar: Path) -> dict[str, Any]:
    """Every job of spark_jobs.JOBS on Spark's built-in sort shuffle, in this test run's JVM.

    The plugin jar is on this session's classpath too, so that later sessions in the same JVM (the
    py4j gateway is started once per process) can load the plugin classes.
    """
    spark = spark_jobs.session("local[2]", {"spark.jars": str(jar)})
    try:
        return {name: job(spark) for name, job in spark_jobs.JOBS.items()}
    finally:
        spark.stop()


__all__ = ["needs_spark", "pyspark"]
