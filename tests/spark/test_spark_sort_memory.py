"""The serialized path's memory is the task's execution memory. With Spark's default memory a map output of a
few MiB is sorted and written in one fill (each partition one compressed stream), and a join's operators, which
share the task's memory with the writer, spill nothing for it; with a small `spark.shuffled.sortBufferSize` or
little execution memory the same job writes many smaller fills instead of taking heap Spark never granted, and
records larger than all the task may hold still go through. Every row arrives, and no managed memory is left held
when a task ends (Spark fails the task if it is, with `spark.unsafe.exceptionOnMemoryLeak`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled import spark_jar
from tests import spark_jobs
from tests.cluster import DaemonProcess
from tests.jvm import run_checks
from tests.spark_support import (
    daemons_fixture,
    needs_spark,
    plugin_conf,
    serialized_fills,
    serialized_map_outputs,
    stage_data,
)

pytestmark = [needs_spark, pytest.mark.timeout(600)]

ROWS = 300_000
MAPS = 4
#: spark.sql.shuffle.partitions: wide enough for the serialized path (above Spark's 200-partition bypass) and
#: coalesced by AQE, as users' jobs are
PARTITIONS = "2000"
#: the executor's memory in the "tight" session: 0.6 of it (1.2 MiB) for execution and storage, so each of two
#: running tasks may hold about 0.6 MiB
TIGHT_MEMORY = str(2 << 20)
#: what each session changes: Spark's default memory, a fill bound far below a map output, little memory
SESSIONS: dict[str, dict[str, str]] = {
    "default": {},
    "capped": {"spark.shuffled.sortBufferSize": "256k"},
    "tight": {"spark.testing.memory": TIGHT_MEMORY, "spark.testing.reservedMemory": "0"},
}

daemons = daemons_fixture(["127.0.0.24"])


@pytest.fixture(scope="module", params=list(SESSIONS))
def spark(
    request: pytest.FixtureRequest, builtin: dict[str, Any], plugin_jar: Path, daemons: list[DaemonProcess]
) -> Iterator[Any]:
    """`builtin` first: the first session in a process's JVM leaves its settings to every later one."""
    conf = {
        **plugin_conf(plugin_jar, daemons, "executor"),
        "spark.unsafe.exceptionOnMemoryLeak": "true",
        "spark.sql.shuffle.partitions": PARTITIONS,
        **SESSIONS[request.param],
    }
    session = spark_jobs.session("local[2]", conf)
    yield session
    session.stop()


def _session(spark: Any) -> str:
    """Which of SESSIONS `spark` is."""
    chosen = [
        name for name, conf in SESSIONS.items() if conf and all(spark.conf.get(k, None) == v for k, v in conf.items())
    ]
    return chosen[0] if chosen else "default"


def _rows(spark: Any) -> Any:
    return spark.range(0, ROWS, numPartitions=MAPS).selectExpr(
        "id", "id * 7919 % 1000003 AS k", "repeat(cast(id % 97 AS string), 3) AS s"
    )


def test_fills_are_as_large_as_the_tasks_memory_and_the_bound_allow(spark: Any) -> None:
    outputs, fills = serialized_map_outputs(spark), serialized_fills(spark)
    stages_before = {(s.stageId(), s.attemptId()) for s in stage_data(spark)}
    got = (
        _rows(spark)
        .repartition("k")
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
    # the map stage's tasks report the writer's memory as their peak execution memory, as Spark's own writer does
    maps = [
        s for s in stage_data(spark) if (s.stageId(), s.attemptId()) not in stages_before and s.shuffleWriteBytes() > 0
    ]
    peak = sum(s.peakExecutionMemory() for s in maps)
    if _session(spark) == "default":
        assert fills == outputs, "a map output of a few MiB fits in one fill under Spark's default memory"
        assert peak >= MAPS << 20, f"a peak of {peak} bytes for {MAPS} map outputs of about 3 MiB in one fill each"
    else:  # each map output is about 3 MiB of rows
        assert fills > 3 * outputs, f"{fills} fills of {outputs} map outputs of about 3 MiB"
        assert peak > 0, "the writer's memory is each map task's peak execution memory"


def test_records_larger_than_the_tasks_memory_go_through(spark: Any) -> None:
    """Rows of 300-400 KiB, larger than the capped session's bound and, with the array they grow, than what a
    task of the tight session may hold: the bytes array grows midway through one regardless (FillBufferCheck
    checks it shrinks back after the fill); nothing is lost and no task ends holding managed memory."""
    rows = spark.range(0, 64, numPartitions=MAPS).selectExpr("id", "repeat('x', 300000 + 1500 * id) AS s")
    got = rows.repartition(300, "id").selectExpr("count(*) AS n", "sum(length(s)) AS chars").collect()[0]
    assert (got.n, got.chars) == (64, sum(300_000 + 1500 * i for i in range(64)))


@pytest.mark.parametrize("spark", ["default"], indirect=True)
def test_a_growing_writer_makes_no_operator_of_its_task_spill_while_memory_suffices(spark: Any) -> None:
    """A join's reduce tasks sort both sides (Spark's sorters hold task memory until the join ends) and write
    the next wide shuffle from inside it: with the executor's memory ample, the writer's growth spills nothing."""
    stages_before = {(s.stageId(), s.attemptId()) for s in stage_data(spark)}
    left = _rows(spark)
    right = _rows(spark).selectExpr("k", "id AS other")
    got = left.join(right, "k").repartition("other").selectExpr("count(*) AS n", "sum(other) AS others")
    row = got.collect()[0]
    pairs: dict[int, list[int]] = {}
    for i in range(ROWS):
        pairs.setdefault(i * 7919 % 1000003, []).append(i)
    assert (row.n, row.others) == (
        sum(len(v) ** 2 for v in pairs.values()),
        sum(len(v) * sum(v) for v in pairs.values()),
    )
    new = [s for s in stage_data(spark) if (s.stageId(), s.attemptId()) not in stages_before]
    assert new
    assert sum(s.memoryBytesSpilled() for s in new) == 0


def test_fill_buffer_under_sparks_memory_manager(plugin_jar: Path) -> None:
    """FillBufferCheck: the fill against a real TaskMemoryManager over seeded random bounds, memory, partition
    counts and records (records larger than the bound too): every partition's bytes exact and in arrival order,
    one fill when everything fits, many under little memory, the bytes array back within the bound after every
    fill, no memory left held."""
    passed, out = run_checks("io.shuffled.spark.FillBufferCheck", plugin_jar, spark_jar.build_test_classes())
    assert passed == 4, out
