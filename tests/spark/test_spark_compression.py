"""`spark.shuffled.compression=auto`: under a local master, a map output goes through Spark's codec only when its
daemon has half its pool in use or other daemons, and its map status says which, so one shuffle may hold both
kinds and reads back exactly what was written.

Two daemons that are not each other's peers (without authentication a daemon relays a read to any daemon), the
first with more than half its pool held by another application before the session starts; each task picks one
by its task id (`daemonChoice=task`), so every map stage writes compressed outputs into the first and
uncompressed ones into the second, and most reads relay across.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled_client import Client
from tests import spark_jobs
from tests.cluster import DaemonProcess, free_port, start_daemon
from tests.spark_support import daemon_stats, needs_spark, plugin_conf, restart, stage_data

pytestmark = [needs_spark, pytest.mark.timeout(600)]

POOL = "16M"
#: the other application's map outputs that fill the first daemon's pool: 1 MiB each, at most this many
FILL_OUTPUTS = 16


def _used_share(daemon: DaemonProcess) -> float:
    pool = daemon_stats(daemon)["pool"]
    return float(pool["used"]) / float(pool["total"])


def _fill_past_half(daemon: DaemonProcess) -> None:
    """Commits another application's map outputs into `daemon` until more than 55 % of its pool is in use
    (below where it starts to spill, 77.5 %)."""
    with Client(daemon.addr) as client:
        for attempt in range(FILL_OUTPUTS):
            if _used_share(daemon) > 0.55:
                return
            writer = client.open_writer("another-application", 1, attempt, attempt, 1)
            writer.write(0, bytes(1 << 20))
            writer.commit()
    raise AssertionError(f"{FILL_OUTPUTS} MiB left the pool at {_used_share(daemon):.0%} in use")


@pytest.fixture(scope="module")
def daemons() -> Iterator[list[DaemonProcess]]:
    hosts = ["127.0.0.25", "127.0.0.26"]
    port = free_port(hosts)
    started: list[DaemonProcess] = []
    try:
        for host in hosts:
            started.append(start_daemon(host, port, POOL))
        _fill_past_half(started[0])
        yield started
    finally:
        for d in started:
            d.stop()


@pytest.fixture(scope="module")
def spark(builtin: dict[str, Any], plugin_jar: Path, daemons: list[DaemonProcess]) -> Iterator[Any]:
    conf = {**plugin_conf(plugin_jar, daemons, "task"), "spark.shuffled.compression": "auto"}
    session = spark_jobs.session("local[2]", conf)
    yield session
    session.stop()


def _compression(spark: Any) -> tuple[int, int]:
    """Map outputs this JVM wrote {compressed, uncompressed} so far."""
    counts = spark.sparkContext._jvm.io.shuffled.spark.Counts.compression()
    return int(counts[0]), int(counts[1])


def _retried_stages(spark: Any) -> int:
    return sum(1 for stage in stage_data(spark) if stage.attemptId() > 0)


@pytest.mark.parametrize(
    "name",
    # the writer's three paths (unsorted, serialized with batched reads of coalesced ranges, Spark's sorter with
    # map-side combine) and a join that reads two shuffles of both kinds
    ["join_sort_merge", "wide_aqe_coalesce", "rdd_reduce_by_key", "wide_aqe_skew_join"],
)
def test_a_shuffle_of_compressed_and_uncompressed_outputs_reads_back_exact(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess], name: str
) -> None:
    """Read on the first try: uncompressed bytes read through the codec fail as a fetch failure, after which Spark
    would write the outputs again (maybe all into one daemon) and the result could still be right."""
    assert _used_share(daemons[0]) >= 0.5 and _used_share(daemons[1]) < 0.5
    compressed, uncompressed = _compression(spark)
    retried = _retried_stages(spark)
    assert spark_jobs.JOBS[name](spark) == builtin[name]
    assert _retried_stages(spark) == retried, "a stage ran again"
    after = _compression(spark)
    compressed, uncompressed = after[0] - compressed, after[1] - uncompressed
    assert compressed > 0 and uncompressed > 0, f"{compressed} compressed, {uncompressed} uncompressed"


def test_uncompressed_outputs_hold_more_bytes(spark: Any, daemons: list[DaemonProcess]) -> None:
    """The same map output, of rows that compress well, takes more of the pool uncompressed: what `auto` trades
    (and why it compresses once the pool is half full)."""
    committed = [daemon_stats(d)["store"]["committed_bytes"] for d in daemons]
    df = spark.range(0, 40_000, numPartitions=2).selectExpr("id % 7 AS k", "repeat('shuffled', 8) AS v")
    assert df.repartition(4, "k").selectExpr("sum(length(v))").collect()[0][0] == 40_000 * 64
    grown = [daemon_stats(d)["store"]["committed_bytes"] - c for d, c in zip(daemons, committed, strict=True)]
    assert grown[1] > 3 * grown[0] > 0, f"compressed {grown[0]} bytes, uncompressed {grown[1]}"


def test_a_daemon_lost_before_the_reduce_is_written_again_and_read_exact(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess]
) -> None:
    """The daemon that holds the uncompressed outputs dies (SIGKILL) once a shuffle's map stage is done and is
    started again on its address, empty, as systemd or Kubernetes would: the next job reading the shuffle finds
    those outputs gone, Spark runs their map tasks again once (uncompressed again into the restarted daemon) and
    the result is exact; the outputs written again then read on the first try."""
    data = spark.sparkContext.parallelize([(i % 53, i) for i in range(20_000)], 4)
    summed = data.reduceByKey(lambda a, b: a + b)
    assert sorted(summed.collect()) == builtin["rdd_reduce_by_key"]
    victim = daemons[1]
    assert daemon_stats(victim)["store"]["stored_bytes"] > 0
    daemons[1] = restart(victim, [], POOL)
    retried = _retried_stages(spark)
    before = _compression(spark)
    assert sorted(summed.collect()) == builtin["rdd_reduce_by_key"]
    assert _retried_stages(spark) > retried, "no stage ran again after the daemon was lost"
    # one rerun: a rewritten output that failed to read would fail the stage again (attempt 2)
    assert max(stage.attemptId() for stage in stage_data(spark)) == 1
    after = _compression(spark)
    assert after[1] > before[1], "no map output was written again uncompressed into the restarted daemon"
    assert daemon_stats(daemons[1])["store"]["stored_bytes"] > 0
    retried = _retried_stages(spark)
    assert sorted(summed.collect()) == builtin["rdd_reduce_by_key"]
    assert _retried_stages(spark) == retried, "the outputs written again did not read on the first try"


def test_a_daemon_that_fills_up_holds_both_kinds_of_one_shuffle(spark: Any, daemons: list[DaemonProcess]) -> None:
    """Last (it leaves the second daemon more than half full): a map stage pushes enough into the second daemon to
    take its pool past half, so its first map outputs are uncompressed and its later ones compressed. Each of the
    four reduce tasks then reads three locations (the first daemon's, and each kind of the second's), each as
    written; the shuffle is the only one in the window, read into Python."""
    assert _used_share(daemons[1]) < 0.5
    n = 24 * 8_000
    expected = (
        n,
        n * (n - 1) // 2,
        sum(zlib.crc32(hashlib.sha512(str(i).encode()).hexdigest().encode()) for i in range(n)),
    )
    reads = [int(x) for x in spark.sparkContext._jvm.io.shuffled.spark.Counts.reads()]
    retried = _retried_stages(spark)
    # 24 map tasks of 1 MiB of incompressible rows each, half of them into each daemon, into 4 reduce partitions
    rows = spark.range(0, n, numPartitions=24).selectExpr("id", "sha2(cast(id AS string), 512) AS v")
    got = rows.repartition(4, "id").rdd.map(lambda r: (1, r.id, zlib.crc32(r.v.encode()))).collect()
    assert tuple(sum(column) for column in zip(*got, strict=True)) == expected
    assert _retried_stages(spark) == retried, "a stage ran again"
    assert _used_share(daemons[1]) >= 0.5
    after = [int(x) for x in spark.sparkContext._jvm.io.shuffled.spark.Counts.reads()]
    tasks, streams = after[0] - reads[0], after[1] - reads[1]
    assert tasks == 4 and streams == 3 * tasks, f"{streams} read streams for {tasks} reduce tasks: want 3 each"
