"""Speculation on a Spark standalone cluster whose two workers are two hosts (127.0.0.7, 127.0.0.8),
each executor with its own daemon: a straggling map attempt and its speculative copy both push; Spark
takes one copy's output and kills the other; the result must be exact."""

from __future__ import annotations

import hashlib
import operator
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import spark_jobs, spark_standalone
from tests.cluster import DaemonProcess, poll_until
from tests.spark_support import (
    daemon_stats,
    daemons_fixture,
    job_traffic,
    needs_spark,
    plugin_conf,
    stage_data,
)

pytestmark = [needs_spark, pytest.mark.timeout(600)]

STRAGGLER_S = 30  # the straggler's duration; speculation must finish the stage long before
ROWS = 20_000
STALL_AFTER = 8_000  # of the straggler's 10,000 rows: most of its output is pushed before it stalls


daemons = daemons_fixture(["127.0.0.7", "127.0.0.8"])


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
                # A writer pushes its buffer when it is full: small, so that the straggler pushes as it goes
                # (the default 16m would hold all its output until it ends).
                "spark.shuffled.writerBufferSize": "64k",
            }
        )
        session = spark_standalone.session(url, conf)
        try:
            yield session
        finally:
            session.stop()


def test_speculative_map_attempts_give_exact_results(spark: Any, daemons: list[DaemonProcess]) -> None:
    """The straggler pushes most of its output (its writer's buffer filled and pushed several times) before it
    stalls, so two attempts of one map task really push into the daemons at once; only one of them may count.
    The daemons count data bytes, so what they took beyond what they kept is the straggler's."""
    rows = [(i % 53, hashlib.sha256(str(i).encode()).hexdigest()) for i in range(ROWS)]
    expected: dict[int, int] = {}
    for key, value in rows:
        expected[key] = expected.get(key, 0) + int(value[:8], 16)

    def straggle(index: int, part: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None, "not in a Spark task"
        stall = index == 0 and ctx.attemptNumber() == 0
        for n, row in enumerate(part):
            if stall and n == STALL_AFTER:
                time.sleep(STRAGGLER_S)  # the workload: a slow task, not a synchronisation
            yield row

    # partitionBy streams records into the shuffle as they come (reduceByKey would combine the whole
    # partition first, so the straggler would push nothing before it stalls); the reduceByKey after it
    # keeps that partitioning and adds no shuffle.
    pairs = spark.sparkContext.parallelize(rows, 2).mapPartitionsWithIndex(straggle).partitionBy(2)
    summed = pairs.mapValues(lambda v: int(v[:8], 16)).reduceByKey(operator.add, 2)
    started = time.monotonic()
    with job_traffic(spark, daemons, exact=False) as traffic:
        result = sorted(summed.collect())
    assert result == sorted(expected.items())
    assert time.monotonic() - started < STRAGGLER_S, "the stage waited for the straggler: no speculation"
    store = spark.sparkContext._jsc.sc().statusStore()
    speculative = []
    for s in stage_data(spark):
        tasks = store.taskList(s.stageId(), s.attemptId(), 1000)
        speculative += [t for t in (tasks.apply(i) for i in range(tasks.size())) if t.speculative()]
    assert speculative, "no speculative task ran"
    pushed, committed = traffic.total("traffic.pushed_bytes"), traffic.total("store.committed_bytes")
    assert pushed > committed, f"the straggler pushed nothing before it stalled ({pushed} pushed, {committed} kept)"
    assert committed == traffic.spark_written, traffic
    # The killed straggler's map output was aborted in its daemon, not left behind.
    poll_until(lambda: sum(daemon_stats(d)["store"]["aborts"] for d in daemons) >= 1, 30, "the straggler aborted")


def test_jobs_match_builtin_on_standalone(spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess]) -> None:
    for name in ("groupby_agg", "rdd_group_by_key"):
        with job_traffic(spark, daemons, exact=False):  # speculation is on: a copy may commit too
            assert spark_jobs.JOBS[name](spark) == builtin[name], name
