"""Spark over three simulated hosts (network namespaces on a bridge, links shaped with tc), each with its
own daemon and Spark worker; the master and the driver outside. The same jobs through Spark's built-in
shuffle and through shuffled give identical results, and faults injected while a job runs (a daemon
killed and restarted on its data dir, a daemon stopped past the peer timeout, a host's link down, a
daemon's disk full) end either in exactly the right result or in a failure that names the cause, within
the configured timeouts; afterwards every pool holds only stored data, and when the application ends no
file is left in any data dir.

Executors reach their host's daemon as 127.0.0.1:7337, as on a real host; daemons reach each other over
the bridge. Skipped where namespaces cannot be created (not root).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import spark_jobs
from tests.cluster import DaemonProcess, poll_until
from tests.host_faults import HostDaemons, acceptable, keyed_sums, run_with_fault
from tests.hosts import DAEMON_PORT, Hosts, netns_unavailable
from tests.spark_support import PLUGIN_TIMEOUT, daemon_stats, job_traffic, needs_spark

_why = netns_unavailable()
pytestmark = [
    needs_spark,
    pytest.mark.skipif(_why is not None, reason=f"no simulated hosts: {_why}"),
    pytest.mark.timeout(900),
]

HOST_JOBS = ("groupby_agg", "join_sort_merge", "rdd_group_by_key", "aqe_skew_join")
FAULT_ROWS = 400_000


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with Hosts(3) as h:
        yield h
    assert not h.leftovers(), f"namespaces or links left behind: {h.leftovers()}"


@pytest.fixture(scope="module")
def host_daemons(hosts: Hosts) -> HostDaemons:
    return HostDaemons(hosts, "32M")


@pytest.fixture(scope="module")
def daemons(host_daemons: HostDaemons) -> list[DaemonProcess]:
    """The live list: a fault that restarts a daemon replaces its entry."""
    return host_daemons.daemons


@pytest.fixture(scope="module")
def master(hosts: Hosts) -> Iterator[str]:
    with hosts.spark_cluster() as url:
        yield url


def session_conf(hosts: Hosts, jar: Path) -> dict[str, str]:
    return {
        "spark.jars": str(jar),
        "spark.driver.host": hosts.gateway,
        "spark.driver.bindAddress": hosts.gateway,
        "spark.executor.memory": "640m",
        "spark.task.maxFailures": "4",
    }


@pytest.fixture(scope="module")
def builtin_over_hosts(hosts: Hosts, master: str, plugin_jar: Path, builtin: dict[str, Any]) -> dict[str, Any]:
    """The jobs through Spark's own shuffle over the same hosts and links."""
    spark = spark_jobs.session(master, session_conf(hosts, plugin_jar))
    try:
        return {name: spark_jobs.JOBS[name](spark) for name in HOST_JOBS}
    finally:
        spark.stop()


@pytest.fixture(scope="module")
def spark(
    hosts: Hosts, master: str, plugin_jar: Path, daemons: list[DaemonProcess], builtin_over_hosts: dict[str, Any]
) -> Iterator[Any]:
    conf = session_conf(hosts, plugin_jar)
    conf.update(
        {
            "spark.shuffle.manager": "io.shuffled.spark.ShuffledShuffleManager",
            "spark.shuffle.sort.io.plugin.class": "io.shuffled.spark.ShuffledDataIO",
            "spark.shuffled.address": f"127.0.0.1:{DAEMON_PORT}",  # each executor: its own host's daemon
            "spark.shuffled.adminAddress": daemons[0].addr,
            "spark.shuffled.timeout": PLUGIN_TIMEOUT,
        }
    )
    session = spark_jobs.session(master, conf)
    yield session
    session.stop()
    for d in daemons:
        poll_until(lambda d=d: daemon_stats(d)["store"]["applications"] == 0, 30, f"{d.addr} dropped the application")
    left = [p for h in hosts.hosts for p in hosts.data_dir(h).glob("app-*")]
    assert not left, f"files left after the application ended: {left}"


@pytest.mark.parametrize("name", HOST_JOBS)
def test_jobs_over_hosts_match_the_builtin_shuffle(
    spark: Any, builtin_over_hosts: dict[str, Any], daemons: list[DaemonProcess], name: str
) -> None:
    with job_traffic(spark, daemons) as traffic:
        assert spark_jobs.JOBS[name](spark) == builtin_over_hosts[name]
    assert sum(1 for d in traffic.daemon_deltas if d["store"]["committed_bytes"] > 0) >= 2, "one host did all"


FAULTS = ("kill", "stop", "link_down", "disk_full")


@pytest.mark.parametrize("kind", FAULTS)
def test_fault_mid_job_gives_the_exact_result_or_names_the_cause(
    spark: Any, host_daemons: HostDaemons, kind: str
) -> None:
    """Host 2 (of 0..2) is hit: a daemon killed once map output is committed and restarted on its data
    dir; stopped, or its host's link down, past the peer timeout while reducers read from it; its disk
    full (a filled tmpfs under a daemon whose quota makes it spill) for a whole job."""
    fault = getattr(host_daemons, kind)(2)
    job, expected = keyed_sums(spark, FAULT_ROWS)
    outcome = run_with_fault(job, host_daemons, fault)
    assert acceptable(outcome, expected, fault), outcome.error or "wrong rows"
    assert fault.seen, f"{fault.name} never took effect: the test proved nothing"
    host_daemons.settled()
