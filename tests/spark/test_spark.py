"""PySpark through shuffled in local[2]: results equal Spark's built-in shuffle, metrics, cleanup, failures.

Two daemons run on 127.0.0.2 and 127.0.0.3 and each task picks one by its task id
(``spark.shuffled.daemonChoice=task``), so map output lands on both and most reads cross the
daemon-to-daemon connection. ``local[2,4]`` allows four attempts per task, as a cluster would.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from shuffled_client import Client
from tests import spark_jobs
from tests.cluster import DaemonProcess, poll_until
from tests.spark_support import (
    daemon_stats,
    daemons_fixture,
    job_traffic,
    needs_spark,
    read_blocks,
    restart,
    serialized_map_outputs,
    session_fixture,
    stage_data,
    store_emptied,
)

pytestmark = [needs_spark, pytest.mark.timeout(600)]


daemons = daemons_fixture(["127.0.0.2", "127.0.0.3"])

spark = session_fixture("local[2,4]", "task")


@pytest.mark.parametrize("name", list(spark_jobs.JOBS))
def test_job_matches_builtin_shuffle(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess], name: str
) -> None:
    with job_traffic(spark, daemons):
        assert spark_jobs.JOBS[name](spark) == builtin[name]


def test_map_output_lands_in_both_daemons(spark: Any, daemons: list[DaemonProcess]) -> None:
    spark_jobs.rdd_reduce_by_key(spark)
    for d in daemons:
        store = daemon_stats(d)["store"]
        assert store["commits"] > 0 and store["stored_bytes"] > 0, f"{d.addr} received nothing: {store}"


def test_shuffle_metrics_are_reported(spark: Any) -> None:
    """AQE and the UI read these: records and bytes written by map tasks, records read by reducers."""
    result = spark.range(0, 6_000, numPartitions=3).repartition(2, "id").collect()
    assert len(result) == 6_000
    stages = stage_data(spark)
    writer = next(s for s in stages if s.shuffleWriteRecords() == 6_000)
    assert writer.shuffleWriteBytes() > 0
    reader = next(s for s in stages if s.shuffleReadRecords() == 6_000 and s.stageId() > writer.stageId())
    assert reader.shuffleLocalBytesRead() + reader.shuffleRemoteBytesRead() == writer.shuffleWriteBytes()


def test_map_task_failing_once_gives_exactly_once_results(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess]
) -> None:
    def fail_first_attempt(index: int, rows: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        yield from rows
        ctx = TaskContext.get()
        assert ctx is not None, "not in a Spark task"
        if index == 1 and ctx.attemptNumber() == 0:
            raise RuntimeError("injected failure of the first attempt")

    data = spark.sparkContext.parallelize([(i % 53, i) for i in range(20_000)], 4)
    with job_traffic(spark, daemons, exact=False):  # the failed attempt pushed too, and was aborted
        result = sorted(data.mapPartitionsWithIndex(fail_first_attempt).reduceByKey(lambda a, b: a + b).collect())
    assert result == builtin["rdd_reduce_by_key"]


def test_reduce_task_failing_once_gives_exactly_once_results(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess]
) -> None:
    def fail_first_attempt(index: int, rows: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        out = list(rows)
        ctx = TaskContext.get()
        assert ctx is not None, "not in a Spark task"
        if index == 0 and ctx.attemptNumber() == 0:
            raise RuntimeError("injected failure of the first attempt")
        return iter(out)

    data = spark.sparkContext.parallelize([(i % 53, i) for i in range(20_000)], 4)
    summed = data.reduceByKey(lambda a, b: a + b).mapPartitionsWithIndex(fail_first_attempt)
    with job_traffic(spark, daemons, exact=False):  # the failed reduce attempt read its partition too
        assert sorted(summed.collect()) == builtin["rdd_reduce_by_key"]


def test_removed_shuffles_are_freed_in_every_daemon(spark: Any, daemons: list[DaemonProcess]) -> None:
    """Spark's ContextCleaner drops a shuffle → the driver plugin frees it in the daemons (told to one,
    which passes it on to its peer)."""
    spark_jobs.rdd_reduce_by_key(spark)
    sc = spark.sparkContext._jsc.sc()
    cleaner = sc.cleaner().get()
    for shuffle_id in range(sc.newShuffleId()):  # every id handed out so far (newShuffleId takes one more)
        cleaner.doCleanupShuffle(shuffle_id, True)
    for d in daemons:
        poll_until(store_emptied(d, "stored_segments"), 20, f"{d.addr} freed its shuffles")


def test_daemon_killed_before_reduce_is_recomputed(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess]
) -> None:
    """A daemon that held map output dies (SIGKILL) between a shuffle's map stage and a job reading it:
    reads of its data fail as fetch failures, Spark reruns the lost map tasks into the surviving daemon,
    and the result is still exact. Then the daemon is restarted on its address for the other tests."""
    data = spark.sparkContext.parallelize([(i % 53, i) for i in range(20_000)], 4)
    summed = data.reduceByKey(lambda a, b: a + b)
    assert sorted(summed.collect()) == builtin["rdd_reduce_by_key"]
    victim = daemons[1]
    assert daemon_stats(victim)["store"]["stored_bytes"] > 0
    attempts_before = {(s.stageId(), s.attemptId()) for s in stage_data(spark)}
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    try:
        assert sorted(summed.collect()) == builtin["rdd_reduce_by_key"]
        retried = [s for s in stage_data(spark) if (s.stageId(), s.attemptId()) not in attempts_before]
        assert any(s.attemptId() > 0 for s in retried), "no stage was resubmitted after the fetch failure"
    finally:
        daemons[1] = restart(victim, daemons)


def test_a_shuffle_the_daemons_dropped_is_recomputed_never_read_empty(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess]
) -> None:
    """The daemons drop a finished map stage's data while Spark still counts on it (what an operator's
    `remove_application`, or `app-ttl` for a driver that looked gone, does): the next job reading the
    shuffle gets PARTITION_NOT_FOUND saying why, a fetch failure, and Spark reruns the map stage. The
    result is exact: a dropped shuffle never reads as empty."""
    data = spark.sparkContext.parallelize([(i % 61, i) for i in range(20_000)], 4)
    summed = data.reduceByKey(lambda a, b: a + b)
    want = sorted(summed.collect())
    assert len(want) == 61
    attempts_before = {(s.stageId(), s.attemptId()) for s in stage_data(spark)}
    with Client(daemons[0].addr, timeout=10) as client:
        answer = client.remove_application(spark.sparkContext.applicationId)
    assert all(v == "ok" for v in answer["peers"].values()), answer
    for d in daemons:
        assert daemon_stats(d)["store"]["stored_bytes"] == 0, f"{d.addr} still holds the application"
    assert sorted(summed.collect()) == want
    retried = [s for s in stage_data(spark) if (s.stageId(), s.attemptId()) not in attempts_before]
    assert any(s.attemptId() > 0 for s in retried), "no stage was resubmitted after the fetch failure"


def test_wide_sql_shuffle_is_sorted_serialized(spark: Any, builtin: dict[str, Any]) -> None:
    """Spark SQL's rows can be relocated once serialized, so a shuffle wider than the bypass threshold skips
    Spark's object sorter: every map task of the job writes by the serialized path, with exact results. AQE
    reads the 2,000 partitions as a few coalesced ranges, each attempt's pairs in a range as one block (what
    Spark's own reader fetches as one batch), never a block per pair."""
    before, blocks = serialized_map_outputs(spark), read_blocks(spark)
    assert spark_jobs.wide_aqe_coalesce(spark) == builtin["wide_aqe_coalesce"]
    assert serialized_map_outputs(spark) - before >= 4  # the map tasks of spark_jobs.facts
    after = read_blocks(spark)
    assert after["batch"] > blocks["batch"] and after["pair"] == blocks["pair"], (blocks, after)


def test_skew_split_reads_take_a_block_per_pair(spark: Any, builtin: dict[str, Any]) -> None:
    """A skewed partition's split reads are of one partition each (a range of map outputs): no batch, as in
    Spark's reader."""
    blocks = read_blocks(spark)
    assert spark_jobs.wide_aqe_skew_join(spark) == builtin["wide_aqe_skew_join"]
    assert read_blocks(spark)["pair"] > blocks["pair"]


def test_wide_shuffle_without_relocation_uses_the_sorter(spark: Any) -> None:
    """Java serialization cannot relocate records, so a wide shuffle of it keeps Spark's sorter, and every
    record lands whole in the partition its key hashes to. (PySpark's own RDD shuffles are of (long, bytes)
    pairs, for which Spark picks Kryo; pairs made in the JVM through the Java API have no class tags, so
    they get the session's serializer, Java's.)"""
    jvm = spark.sparkContext._jvm
    pairs = [(i * 7919 % 20_011, i) for i in range(2_000)]
    jpairs = spark.sparkContext._jsc.parallelizePairs([jvm.scala.Tuple2(k, v) for k, v in pairs], 4)
    before = serialized_map_outputs(spark)
    parts = jpairs.partitionBy(jvm.org.apache.spark.HashPartitioner(210)).glom().collect()
    assert serialized_map_outputs(spark) == before
    got = [[(t._1(), t._2()) for t in part] for part in parts]
    assert len(got) == 210
    assert sorted(p for part in got for p in part) == sorted(pairs)
    assert all(k % 210 == n for n, part in enumerate(got) for k, _ in part)  # an Integer hashes to itself
