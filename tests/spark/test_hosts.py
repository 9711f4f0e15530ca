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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests import spark_jobs, spark_standalone
from tests.cluster import DaemonProcess, poll_until
from tests.host_faults import (
    REPLICATED,
    HostDaemons,
    acceptable,
    drained,
    keyed_sums,
    paced_chain,
    resubmitted,
    run_with_fault,
    stage_attempts,
    total,
)
from tests.hosts import Hosts, hosts_for_tests, netns_unavailable
from tests.spark_support import job_traffic, needs_spark, store_emptied

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
    with hosts_for_tests(3) as h:
        yield h


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


@pytest.fixture(scope="module")
def spark(
    hosts: Hosts, master: str, plugin_jar: Path, daemons: list[DaemonProcess], builtin: dict[str, Any]
) -> Iterator[Any]:
    conf = hosts.spark_conf(plugin_jar, admin=daemons[0].addr)
    session = spark_standalone.session(master, conf)
    yield session
    session.stop()
    for d in daemons:
        poll_until(store_emptied(d, "applications"), 30, f"{d.addr} dropped the application")
    left = [p for h in hosts.hosts for p in hosts.data_dir(h).glob("app-*")]
    assert not left, f"files left after the application ended: {left}"


@pytest.mark.parametrize("name", HOST_JOBS)
def test_jobs_over_hosts_match_the_builtin_shuffle(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess], name: str
) -> None:
    with job_traffic(spark, daemons) as traffic:
        assert spark_jobs.JOBS[name](spark) == builtin[name]  # the built-in shuffle's, in a local session
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


# Replicated map output. These run last: they restart every daemon with two copies of each map output and
# hand-over on SIGTERM, the settings of a cluster that must lose hosts and roll upgrades without recomputing.


@pytest.fixture(scope="module")
def replicated(host_daemons: HostDaemons) -> HostDaemons:
    host_daemons.reconfigure(REPLICATED)
    return host_daemons


def test_a_daemon_killed_after_the_map_stage_costs_no_recomputation(spark: Any, replicated: HostDaemons) -> None:
    """Host 2's daemon is SIGKILLed once the shuffle is stored (its memory, and the map output it held, are
    gone) and restarted: the reduce stage reads the replicas, the result is exact, and Spark resubmits no
    stage (a fetch failure would have)."""
    job, expected = keyed_sums(spark, FAULT_ROWS)
    assert sorted(job.collect()) == expected
    assert total(replicated.daemons, "store.replica_attempts") > 0, "no map output was replicated"
    before = stage_attempts(spark)
    recovered = total(replicated.daemons, "failover.recovered")
    fault = replicated.kill(2)
    fault.inject()
    fault.repair()
    assert sorted(job.collect()) == expected
    assert not resubmitted(spark, before), "a stage was resubmitted: map output was recomputed"
    assert total(replicated.daemons, "failover.recovered") > recovered, "no read failed over: the test proved nothing"
    replicated.settled()


def test_a_daemon_killed_during_the_map_stage_gives_the_exact_result(spark: Any, replicated: HostDaemons) -> None:
    """Map output not yet replicated when host 2's daemon dies is pushed again by Spark's task retries."""
    fault = replicated.kill(2)
    job, expected = keyed_sums(spark, FAULT_ROWS)
    outcome = run_with_fault(job, replicated, fault)
    assert outcome.result == expected, outcome.error or "wrong rows"
    assert fault.seen
    replicated.settled()


def test_rolling_restart_of_every_daemon_during_a_multi_stage_job(spark: Any, replicated: HostDaemons) -> None:
    """Each daemon in turn is drained (refuses new pushes, hands its data over, lets reads finish), stopped
    and started again on its data dir while a three-stage job runs: exact result, no stage resubmitted."""
    job, expected = paced_chain(spark, FAULT_ROWS, seconds=1.5)
    before = stage_attempts(spark)
    commits = replicated.commits()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(lambda: sorted(job.collect()))
        poll_until(lambda: running.done() or replicated.commits() > commits, 120, "map output committed")
        stopped = replicated.rolling_restart(running.done)
        result = running.result(timeout=300)
    assert result == expected
    assert len(stopped) == len(replicated.daemons), f"the job ended after {len(stopped)} restarts: it proved less"
    drains = [drained(d) for d in stopped]
    assert all(finished for finished, _ in drains), f"a drain timed out: {drains}"
    assert sum(copies for _, copies in drains) > 0, "no drain handed anything over: the test proved less"
    assert not resubmitted(spark, before), "a stage was resubmitted during the rolling restart"
    replicated.settled()
