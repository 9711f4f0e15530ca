"""The writer's serialized path (SerializedSortWriter) with a fill far smaller than each map output, so
every map task sorts and writes many fills and most partitions get several compressed streams back to back:
Spark SQL's wide jobs and a (Kryo-serialized) PySpark RDD shuffle still read back exactly what was written, under
each codec Spark ships (all of them read concatenated streams)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import spark_jobs
from tests.cluster import DaemonProcess
from tests.spark_support import daemons_fixture, needs_spark, plugin_conf, serialized_fills, serialized_map_outputs

pytestmark = [needs_spark, pytest.mark.timeout(600)]

#: the fill (spark.shuffled.sortBufferSize): a wide job's map task writes a few hundred KiB of rows
FILL = "16k"


daemons = daemons_fixture(["127.0.0.21"])


@pytest.fixture(scope="module", params=["lz4", "zstd"])
def spark(request: pytest.FixtureRequest, plugin_jar: Path, daemons: list[DaemonProcess]) -> Iterator[Any]:
    conf = {
        **plugin_conf(plugin_jar, daemons, "executor"),
        "spark.shuffled.sortBufferSize": FILL,
        "spark.io.compression.codec": request.param,
    }
    session = spark_jobs.session("local[2]", conf)
    yield session
    session.stop()


@pytest.mark.parametrize("name", ["wide_aqe_coalesce", "wide_aqe_skew_join"])
def test_wide_sql_jobs_in_many_fills_match_builtin(spark: Any, builtin: dict[str, Any], name: str) -> None:
    if name == "wide_aqe_skew_join" and spark.conf.get("spark.io.compression.codec") == "zstd":
        # the job asserts that AQE splits its skewed partition, which under zstd it does not do with Spark's
        # built-in shuffle either (the block sizes zstd gives miss the job's skew settings)
        pytest.skip("under zstd AQE splits no partition of this job, with the built-in shuffle too")
    outputs, fills = serialized_map_outputs(spark), serialized_fills(spark)
    assert spark_jobs.JOBS[name](spark) == builtin[name]
    outputs, fills = serialized_map_outputs(spark) - outputs, serialized_fills(spark) - fills
    assert outputs > 0
    assert fills > 2 * outputs, f"{fills} fills of {outputs} map outputs"


def test_wide_kryo_rdd_shuffle_in_many_fills_is_exact(spark: Any) -> None:
    """PySpark's RDD shuffles are of (long, bytes) pairs, for which Spark picks Kryo, which relocates records,
    so they take the serialized path too; every record lands once, in the partition its key hashes to."""
    pairs = [(i * 7919 % 20_011, i) for i in range(40_000)]
    before = serialized_map_outputs(spark)
    parts = spark.sparkContext.parallelize(pairs, 4).partitionBy(210).glom().collect()
    assert serialized_map_outputs(spark) - before >= 4
    assert sorted(p for part in parts for p in part) == sorted(pairs)
    assert all(k % 210 == n for n, part in enumerate(parts) for k, _ in part)  # an int hashes to itself
