"""The image as a sidecar, end to end, with the plugin jar copied out of the image.

First as in an executor pod: a daemon container without a network, its Unix socket in a directory it shares
with the host (as a pod's containers share an emptyDir), and a Spark application on `local-cluster` (two
executors) on the host reaching it at ``unix:…``: every job equals Spark's built-in shuffle, the daemon
committed and served exactly the job's shuffle bytes, and the executors pushed them through a directory of
shared memory the two sides share (as a pod's emptyDir of medium Memory). Then as on a cluster: two daemon
containers, each in a network namespace of its own with a Spark worker beside it (two hosts of
tests/hosts.py), peers of each other with two copies of every map output; reads cross the hosts through the
daemons, and one container killed with `podman kill` after the map stage (and started again, empty) costs
no recomputation.

The image is the session's build (tests/image.py); skipped with the reason where podman, or for the hosts
network namespaces, cannot be had.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled import spark_jar
from tests import spark_jobs, spark_standalone
from tests.cluster import poll_until
from tests.host_faults import PEER_TIMEOUT_S, keyed_sums, resubmitted, settled, stage_attempts, total
from tests.hosts import Hosts, hosts_for_tests
from tests.image import Container, Image, daemon_dir
from tests.spark_support import daemon_stats, job_traffic, needs_spark, plugin_conf

pytestmark = [needs_spark, pytest.mark.timeout(1500)]  # the first test may wait for the image's build

SIDECAR_JOBS = ("groupby_agg", "join_sort_merge", "rdd_group_by_key", "aqe_skew_join")
ROWS = 400_000


@pytest.fixture(scope="module")
def image_jar(image: Image, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin for the installed Spark line, as the image carries it."""
    name = spark_jar.jar_name(spark_jar.find_spark())
    return image.copy_out(f"/opt/shuffled/jars/{name}", tmp_path_factory.mktemp("jar") / name)


@pytest.fixture(scope="module")
def sidecar(image: Image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    sockets = daemon_dir(tmp_path_factory.mktemp("sidecar") / "run")
    # shared memory as a pod's emptyDir (medium: Memory) gives it, at the same path in both (docs/operations.md)
    shm = daemon_dir(tmp_path_factory.mktemp("sidecar") / "shm")
    options = [
        "--network", "none", "--volume", f"{sockets}:/run/shuffled", "--volume", f"{shm}:{shm}",
        "--env", "SHUFFLED_ADVERTISE=127.0.0.1:7337", "--env", "SHUFFLED_POOL_SIZE=128M",
        "--env", f"SHUFFLED_SHM_DIR={shm}",
    ]  # fmt: skip
    container = Container.run(image, f"shuffled-test-{os.getpid()}-sidecar", f"unix:{sockets}/shuffled.sock", options)
    yield container
    container.remove()


@pytest.fixture(scope="module")
def spark(builtin: dict[str, Any], image_jar: Path, sidecar: Container) -> Iterator[Any]:
    session = spark_jobs.session("local-cluster[2,1,1024]", plugin_conf(image_jar, [sidecar], "executor"))
    yield session
    session.stop()


@pytest.mark.parametrize("name", SIDECAR_JOBS)
def test_jobs_through_the_sidecar_match_the_builtin_shuffle(
    spark: Any, builtin: dict[str, Any], sidecar: Container, name: str
) -> None:
    with job_traffic(spark, [sidecar]) as traffic:
        assert spark_jobs.JOBS[name](spark) == builtin[name]
    moved = traffic.daemon_deltas[0]["traffic"]  # the executors pushed and read through the pod's shared memory
    assert moved["placed_buffers"] == moved["pushed_buffers"] > 0 and moved["read_placed_buffers"] > 0, moved


def test_the_application_end_frees_the_sidecar_which_stops_cleanly(spark: Any, sidecar: Container) -> None:
    assert spark.sparkContext._jsc.sc().getExecutorIds().size() == 2
    assert daemon_stats(sidecar)["store"]["applications"] == 1
    spark.stop()
    poll_until(lambda: daemon_stats(sidecar)["store"]["applications"] == 0, 30, "the sidecar dropped the application")
    settled([sidecar])
    assert sidecar.stop() == 0, sidecar.logs()


# -- two hosts, a daemon container on each


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with hosts_for_tests(2) as h:
        yield h


@pytest.fixture(scope="module")
def host_containers(image: Image, hosts: Hosts) -> Iterator[list[Container]]:
    """The image on each host as an operator would run it there: the host's address advertised, every host's
    daemon a peer, two copies of each map output, a data dir on the host."""
    peers = ",".join(h.daemon_addr for h in hosts.hosts)
    containers: list[Container] = []
    try:
        for h in hosts.hosts:
            options = [
                "--network", f"ns:/run/netns/{h.netns}",
                "--volume", f"{daemon_dir(hosts.data_dir(h))}:/var/lib/shuffled",
                "--env", f"SHUFFLED_ADVERTISE={h.daemon_addr}", "--env", f"SHUFFLED_PEERS={peers}",
                "--env", "SHUFFLED_REPLICAS=2", "--env", f"SHUFFLED_PEER_TIMEOUT={PEER_TIMEOUT_S}",
                "--env", "SHUFFLED_POOL_SIZE=64M",
            ]  # fmt: skip
            name = f"shuffled-test-{os.getpid()}-host{h.index}"
            containers.append(Container.run(image, name, h.daemon_addr, options))
        yield containers
    finally:
        for c in containers:
            c.remove()


@pytest.fixture(scope="module")
def spark_on_hosts(hosts: Hosts, image_jar: Path, host_containers: list[Container]) -> Iterator[Any]:
    with hosts.spark_cluster() as master:
        session = spark_standalone.session(master, hosts.spark_conf(image_jar, admin=host_containers[0].addr))
        yield session
        session.stop()


def test_two_container_hosts_relay_reads_and_keep_two_copies(
    spark_on_hosts: Any, host_containers: list[Container]
) -> None:
    job, expected = keyed_sums(spark_on_hosts, ROWS)
    assert sorted(job.collect()) == expected
    for c in host_containers:
        stats = daemon_stats(c)
        assert stats["store"]["commits"] > 0, f"no map output was pushed into {c.name}"
        assert stats["store"]["replica_attempts"] > 0, f"{c.name} holds no copy of the other host's map output"
        assert stats["traffic"]["relayed_bytes"] > 0, f"no read through {c.name} crossed to the other host"
    settled(host_containers)


def test_a_container_killed_after_the_map_stage_costs_no_recomputation(
    spark_on_hosts: Any, host_containers: list[Container]
) -> None:
    """The second host's container is killed once the shuffle is stored (its memory, and the map output it
    held there, are gone) and started again: the reduce stage reads the copies, the result is exact, and
    Spark resubmits no stage (a fetch failure would have)."""
    job, expected = keyed_sums(spark_on_hosts, ROWS)
    assert sorted(job.collect()) == expected
    before = stage_attempts(spark_on_hosts)
    failovers = total(host_containers, "failover.recovered")
    victim = host_containers[1]
    victim.kill()
    assert victim.state("ExitCode") == "137", "not killed: the test would prove nothing"
    victim.start()
    assert sorted(job.collect()) == expected
    assert not resubmitted(spark_on_hosts, before), "a stage was resubmitted: map output was recomputed"
    assert total(host_containers, "failover.recovered") > failovers, "no read failed over: the test proved nothing"
    settled(host_containers)
