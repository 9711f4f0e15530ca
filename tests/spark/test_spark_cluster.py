"""PySpark on ``local-cluster[2,1,1024]``: two executor JVMs, each with its own daemon (127.0.0.4 and
127.0.0.5, chosen by executor id), Kryo serialization, Spark's IO encryption and dynamic allocation
without Spark's external shuffle service.

The tests run in file order on one session: the built-in comparisons first, then dynamic allocation
(executors go idle and exit while their map output stays in the daemons), and last the application's
end, which must free both daemons.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import spark_jobs
from tests.cluster import DaemonProcess, poll_until
from tests.spark_support import (
    daemon_stats,
    daemons_fixture,
    job_traffic,
    needs_spark,
    session_fixture,
    store_emptied,
)

pytestmark = [needs_spark, pytest.mark.timeout(600)]

IDLE_TIMEOUT_S = 2


daemons = daemons_fixture(["127.0.0.4", "127.0.0.5"])

spark = session_fixture(
    "local-cluster[2,1,1024]",
    "executor",
    {
        "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
        # Shuffle blocks encrypted by Spark: the daemons store and relay ciphertext.
        "spark.io.encryption.enabled": "true",
        "spark.dynamicAllocation.enabled": "true",
        "spark.shuffle.service.enabled": "false",
        "spark.dynamicAllocation.shuffleTracking.enabled": "false",
        "spark.dynamicAllocation.minExecutors": "0",
        "spark.dynamicAllocation.initialExecutors": "2",
        "spark.dynamicAllocation.maxExecutors": "2",
        "spark.dynamicAllocation.executorIdleTimeout": f"{IDLE_TIMEOUT_S}s",
    },
)


@pytest.mark.parametrize("name", ["groupby_agg", "join_sort_merge", "window", "rdd_reduce_by_key", "rdd_sort_by_key"])
def test_job_matches_builtin_shuffle(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess], name: str
) -> None:
    with job_traffic(spark, daemons):
        assert spark_jobs.JOBS[name](spark) == builtin[name]


def test_each_executor_pushes_into_its_own_daemon(spark: Any, daemons: list[DaemonProcess]) -> None:
    spark_jobs.rdd_reduce_by_key(spark)
    for d in daemons:
        assert daemon_stats(d)["store"]["commits"] > 0, f"no map output reached {d.addr}"


def test_map_output_outlives_its_executors(spark: Any, builtin: dict[str, Any]) -> None:
    """Dynamic allocation without the external shuffle service is allowed (the driver plugin reports
    reliable storage) and the executors that wrote a shuffle may exit: a later job reads it from the
    daemons without rerunning the map stage."""
    sc = spark.sparkContext
    map_runs = sc.accumulator(0)

    def count_map(row: Any) -> Any:
        map_runs.add(1)
        return row

    data = sc.parallelize([(i % 53, i) for i in range(20_000)], 4).map(count_map)
    summed = data.reduceByKey(lambda a, b: a + b)
    assert sorted(summed.collect()) == builtin["rdd_reduce_by_key"]
    assert map_runs.value == 20_000
    jsc = sc._jsc.sc()
    poll_until(lambda: jsc.getExecutorIds().size() == 0, 60, "idle executors were removed")
    assert sorted(summed.collect()) == builtin["rdd_reduce_by_key"]
    assert map_runs.value == 20_000, "the map stage ran again: its output was lost with the executors"


def test_application_end_frees_every_daemon(spark: Any, daemons: list[DaemonProcess]) -> None:
    app = spark.sparkContext.applicationId
    assert any(daemon_stats(d)["store"]["stored_segments"] > 0 for d in daemons)
    spark.stop()
    for d in daemons:
        poll_until(store_emptied(d, "applications"), 20, f"{d.addr} dropped {app}")
        assert daemon_stats(d)["store"]["stored_segments"] == 0
