"""The serialized path's memory is the task's execution memory: with Spark's default memory a map output of a
few MiB is sorted and written in one fill (each partition one compressed stream), and with a few MiB of
execution memory for the whole executor the same job writes many smaller fills instead of taking heap Spark
never granted; either way every row arrives and no managed memory is left held when a task ends (Spark fails
the task if it is, with `spark.unsafe.exceptionOnMemoryLeak`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import spark_jobs
from tests.cluster import DaemonProcess
from tests.spark_support import daemons_fixture, needs_spark, plugin_conf, serialized_fills, serialized_map_outputs

pytestmark = [needs_spark, pytest.mark.timeout(600)]

ROWS = 300_000
MAPS = 4
#: spark.sql.shuffle.partitions: wide enough for the serialized path (above Spark's 200-partition bypass) and
#: coalesced by AQE, as users' jobs are
PARTITIONS = "2000"
#: execution and storage memory of the whole executor (two tasks): about 1 MiB a task can be granted
TIGHT_MEMORY = str(2 << 20)

daemons = daemons_fixture(["127.0.0.24"])


@pytest.fixture(scope="module", params=["default", "tight"])
def spark(request: pytest.FixtureRequest, plugin_jar: Path, daemons: list[DaemonProcess]) -> Iterator[Any]:
    conf = {
        **plugin_conf(plugin_jar, daemons, "executor"),
        "spark.unsafe.exceptionOnMemoryLeak": "true",
        "spark.sql.shuffle.partitions": PARTITIONS,
    }
    if request.param == "tight":
        conf |= {"spark.testing.memory": TIGHT_MEMORY, "spark.testing.reservedMemory": "0"}
    session = spark_jobs.session("local[2]", conf)
    yield session
    session.stop()


def test_fills_are_as_large_as_the_tasks_memory_allows(spark: Any) -> None:
    rows = spark.range(0, ROWS, numPartitions=MAPS).selectExpr(
        "id", "id * 7919 % 1000003 AS k", "repeat(cast(id % 97 AS string), 3) AS s"
    )
    outputs, fills = serialized_map_outputs(spark), serialized_fills(spark)
    got = (
        rows.repartition("k")
        .selectExpr("count(*) AS n", "sum(id) AS ids", "sum(k) AS ks", "sum(length(s)) AS chars")
        .collect()[0]
    )
    ids = range(ROWS)
    assert (got.n, got.ids, got.ks, got.chars) == (
        ROWS,
        sum(ids),
        sum(i * 7919 % 1000003 for i in ids),
        sum(3 * len(str(i % 97)) for i in ids),
    )
    outputs, fills = serialized_map_outputs(spark) - outputs, serialized_fills(spark) - fills
    assert outputs == MAPS
    if spark.conf.get("spark.testing.memory", None) is None:
        assert fills == outputs, "a map output of a few MiB fits in one fill under Spark's default memory"
    else:
        assert fills > 3 * outputs, f"{fills} fills of {outputs} map outputs in about 1 MiB a task"
