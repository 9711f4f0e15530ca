"""Speculation on a Spark standalone cluster whose two workers are two hosts (127.0.0.7, 127.0.0.8),
each executor with its own daemon: a straggling map attempt and its speculative copy both push; Spark
takes one copy's output and kills the other; the result must be exact."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import spark_jobs
from tests.cluster import DaemonProcess, poll_until
from tests.spark_support import daemon_stats, needs_spark, plugin_conf, spark_daemons, stage_data

pytestmark = [needs_spark, pytest.mark.timeout(600)]

STRAGGLER_S = 30  # the straggler's duration; speculation must finish the stage long before


@pytest.fixture(scope="module")
def daemons() -> Iterator[list[DaemonProcess]]:
    with spark_daemons(["127.0.0.7", "127.0.0.8"]) as ds:
        yield ds


@pytest.fixture(scope="module")
def spark(builtin: dict[str, Any], plugin_jar: Path, daemons: list[DaemonProcess]) -> Iterator[Any]:
    from tests.spark_standalone import standalone_cluster

    with standalone_cluster(["127.0.0.7", "127.0.0.8"]) as url:
        conf = plugin_conf(plugin_jar, daemons, "executor")
        conf.update(
            {
                "spark.executor.memory": "768m",
                "spark.speculation": "true",
                "spark.speculation.interval": "100ms",
                "spark.speculation.quantile": "0.5",
                "spark.speculation.multiplier": "2",
                # Judge stragglers by duration alone: the straggler here reads no input to rate it by.
                "spark.speculation.efficiency.enabled": "false",
            }
        )
        session = spark_jobs.session(url, conf)
        try:
            yield session
        finally:
            session.stop()


def test_speculative_map_attempts_give_exact_results(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess]
) -> None:
    def straggle(index: int, rows: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        if index == 0 and TaskContext.get().attemptNumber() == 0:
            time.sleep(STRAGGLER_S)  # the workload: a slow task, not a synchronisation
        return rows

    data = spark.sparkContext.parallelize([(i % 53, i) for i in range(20_000)], 2)
    started = time.monotonic()
    result = sorted(data.mapPartitionsWithIndex(straggle).reduceByKey(lambda a, b: a + b).collect())
    assert result == builtin["rdd_reduce_by_key"]
    assert time.monotonic() - started < STRAGGLER_S, "the stage waited for the straggler: no speculation"
    store = spark.sparkContext._jsc.sc().statusStore()
    speculative = []
    for s in stage_data(spark):
        tasks = store.taskList(s.stageId(), s.attemptId(), 1000)
        speculative += [t for t in (tasks.apply(i) for i in range(tasks.size())) if t.speculative()]
    assert speculative, "no speculative task ran"
    # The killed straggler's map output was aborted in its daemon, not left behind.
    poll_until(lambda: sum(daemon_stats(d)["store"]["aborts"] for d in daemons) >= 1, 30, "the straggler aborted")


def test_jobs_match_builtin_on_standalone(spark: Any, builtin: dict[str, Any]) -> None:
    for name in ("groupby_agg", "rdd_group_by_key"):
        assert spark_jobs.JOBS[name](spark) == builtin[name], name
