"""Row-based shuffle checksums (Spark 4.1 and later, ``spark.sql.shuffle.orderIndependentChecksum.enabled``).

Spark compares the checksum that each map task's ``MapStatus`` carries across attempts of that task, to
find map output that changed on a retry. The checksum is independent of row order, so the same map task
over the same rows gives the same value whichever shuffle wrote it: shuffled's map statuses must carry
exactly the values Spark's built-in shuffle computes, on the sorted writer path (more partitions than the
bypass threshold) and on the unsorted one. On a line without these checksums the test is skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shuffled import spark_jar
from tests import spark_jobs
from tests.cluster import DaemonProcess
from tests.spark_support import daemons_fixture, needs_spark, plugin_conf

pytestmark = [needs_spark, pytest.mark.timeout(300)]

#: below and above spark.shuffle.sort.bypassMergeThreshold (200): the unsorted and the sorted writer
PARTITIONS = [8, 300]


def _has_row_checksums() -> bool:
    try:
        return spark_jar.has_row_checksums(spark_jar.find_spark().line)
    except spark_jar.JvmBuildError:
        return False


daemons = daemons_fixture(["127.0.0.20"])


@pytest.mark.skipif(not _has_row_checksums(), reason="this Spark line has no row-based shuffle checksums")
def test_map_statuses_carry_the_builtin_shuffles_row_checksums(plugin_jar: Path, daemons: list[DaemonProcess]) -> None:
    builtin = spark_jobs.session("local[2]", {"spark.jars": str(plugin_jar)})
    try:
        expected = {n: spark_jobs.row_checksums(builtin, n) for n in PARTITIONS}
    finally:
        builtin.stop()
    plugin = spark_jobs.session("local[2]", plugin_conf(plugin_jar, daemons, "executor"))
    try:
        got = {n: spark_jobs.row_checksums(plugin, n) for n in PARTITIONS}
    finally:
        plugin.stop()
    for n in PARTITIONS:
        assert expected[n] and all(c != 0 for c in expected[n]), expected
        assert got[n] == expected[n], f"{n} partitions"
