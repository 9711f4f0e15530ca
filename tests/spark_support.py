"""Fixtures' building blocks for the Spark tests: the plugin jar, daemons for Spark, built-in results."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from shuffled import spark_jar
from shuffled_client import Client
from tests import spark_jobs
from tests.cluster import DaemonProcess, free_port, start_daemon
from tests.jvm import needs_jdk

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[test]')")

needs_spark = needs_jdk

#: Bound of every read/push wait in the plugin during tests (a hang becomes an error, not a stuck test).
PLUGIN_TIMEOUT = "30s"


def plugin_conf(jar: Path, daemons: list[DaemonProcess], daemon_choice: str) -> dict[str, str]:
    conf = spark_jar.spark_conf(jar, [d.addr for d in daemons], daemon_choice)
    conf["spark.shuffled.timeout"] = PLUGIN_TIMEOUT
    return conf


@contextmanager
def spark_daemons(hosts: list[str], pool_size: str = "128M") -> Iterator[list[DaemonProcess]]:
    """Daemons on these loopback addresses, one port, each told about the others."""
    port = free_port(hosts)
    peers = ",".join(f"{h}:{port}" for h in hosts)
    daemons: list[DaemonProcess] = []
    try:
        for host in hosts:
            daemons.append(start_daemon(host, port, pool_size, ["--peers", peers]))
        yield daemons
    finally:
        for d in daemons:
            d.stop()


def restart(daemon: DaemonProcess, peers: list[DaemonProcess]) -> DaemonProcess:
    """A new daemon process on the same address, as systemd or Kubernetes would start after a crash."""
    if daemon.proc.poll() is None:
        daemon.proc.kill()
        daemon.proc.wait(10)
    peer_list = ",".join(d.addr for d in peers)
    return start_daemon(daemon.host, daemon.port, "128M", ["--peers", peer_list])


def daemon_stats(daemon: DaemonProcess) -> dict[str, Any]:
    with Client(daemon.addr, timeout=10) as client:
        return client.stats()


def stage_data(spark: Any) -> list[Any]:
    """Spark's status store entries for every stage attempt so far (task metrics summed per stage)."""
    sc = spark.sparkContext
    gateway = sc._gateway
    no_quantiles = gateway.new_array(gateway.jvm.double, 0)
    empty = gateway.jvm.java.util.Collections.emptyList()
    stages = sc._jsc.sc().statusStore().stageList(None, False, False, no_quantiles, empty)
    return [stages.apply(i) for i in range(stages.size())]


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
