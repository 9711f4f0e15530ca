"""Row-based shuffle checksums (Spark 4.1 and later, ``spark.sql.shuffle.orderIndependentChecksum.enabled``).

Spark compares the checksum that each map task's ``MapStatus`` carries across attempts of that task, to
find map output that changed on a retry. The checksum is independent of row order, so the same map task
over the same rows gives the same value whichever shuffle wrote it: shuffled's map statuses must carry
exactly the values Spark's built-in shuffle computes, on the sorted writer path (more partitions than the
bypass threshold) and on the unsorted one. On a line without these checksums the test is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled import spark_jar
from tests import spark_jobs
from tests.cluster import DaemonProcess
from tests.spark_support import needs_spark, plugin_conf, spark_daemons

pytestmark = [needs_spark, pytest.mark.timeout(300)]

CHECKSUMS = {"spark.sql.shuffle.orderIndependentChecksum.enabled": "true", "spark.sql.adaptive.enabled": "false"}
#: below and above spark.shuffle.sort.bypassMergeThreshold (200): the unsorted and the sorted writer
PARTITIONS = [8, 300]


def _has_row_checksums() -> bool:
    try:
        return "checksums-rows" in spark_jar.LINES[spark_jar.find_spark().line]
    except spark_jar.JvmBuildError:
        return False


def map_checksums(spark: Any, partitions: int) -> list[list[int]]:
    """Run a groupBy with ``partitions`` reduce partitions; the checksum of every map status of each shuffle."""
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    spark_jobs.facts(spark).groupBy("k").agg({"v": "sum", "s": "max"}).collect()
    # The driver's MapOutputTrackerMaster, through the DAG scheduler's field: py4j cannot look up methods on
    # SparkEnv in pyspark 4.3 (one of its signatures names a class pyspark does not ship).
    dag = spark.sparkContext._jsc.sc().dagScheduler()
    field = dag.getClass().getDeclaredField("mapOutputTracker")
    field.setAccessible(True)
    statuses = field.get(dag).shuffleStatuses()
    found = []
    for shuffle in sorted(int(key) for key in statuses.keySet().toList().mkString(",").split(",")):
        maps = statuses.get(shuffle).get().mapStatuses()
        found.append([maps[i].checksumValue() for i in range(len(maps))])
    return found


@pytest.fixture(scope="module")
def daemons() -> Iterator[list[DaemonProcess]]:
    with spark_daemons(["127.0.0.20"]) as ds:
        yield ds


@pytest.mark.skipif(not _has_row_checksums(), reason="this Spark line has no row-based shuffle checksums")
@pytest.mark.parametrize("partitions", PARTITIONS)
def test_map_statuses_carry_the_builtin_shuffles_row_checksums(
    plugin_jar: Path, daemons: list[DaemonProcess], partitions: int
) -> None:
    builtin = spark_jobs.session("local[2]", {"spark.jars": str(plugin_jar), **CHECKSUMS})
    try:
        expected = map_checksums(builtin, partitions)
    finally:
        builtin.stop()
    plugin = spark_jobs.session("local[2]", {**plugin_conf(plugin_jar, daemons, "executor"), **CHECKSUMS})
    try:
        got = map_checksums(plugin, partitions)
    finally:
        plugin.stop()
    assert expected and all(all(c != 0 for c in shuffle) for shuffle in expected), expected
    assert got == expected
