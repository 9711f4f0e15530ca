"""Helper process of the `spark` scenario: SQL queries in one Spark session; one JSON line of results.

Run as ``python -m benchmarks.spark_job --mode builtin|plugin --rows N ...``. Each mode runs in a
process (and JVM) of its own, so neither inherits the other's JIT warm-up or heap. Every query's
shuffles are dropped after it (as Spark's ContextCleaner would after garbage collection), so the
daemons hold one query's data at a time; with ``--keep-shuffles`` they are not, as in a long session
whose driver has not collected garbage yet (the `scale` scenario), and the daemons must spill.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from py4j.java_gateway import JavaClass
from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from shuffled import spark_jar
from tests.spark_jobs import shuffle_reads

from . import sql_shapes, star_schema


def _facts(spark: SparkSession, rows: int) -> DataFrame:
    return spark.range(0, rows, numPartitions=8).select(
        F.col("id"),
        (F.col("id") % 100_000).alias("k"),
        (F.col("id") * 2_654_435_761 % 1_000_003).alias("v"),
        F.concat(F.lit("customer-"), (F.col("id") % 5_000).cast("string")).alias("name"),
    )


def join_then_aggregate(spark: SparkSession, rows: int) -> DataFrame:
    dims = spark.range(0, 100_000, numPartitions=2).select(F.col("id").alias("k"), (F.col("id") % 100).alias("g"))
    return _facts(spark, rows).join(dims, "k").groupBy("g").agg(F.count("*"), F.sum("v"), F.max("name"))


def wide_aggregate(spark: SparkSession, rows: int) -> DataFrame:
    per_key = _facts(spark, rows).groupBy((F.col("id") % 2_000_000).alias("key")).agg(F.sum("v").alias("s"))
    return per_key.agg(F.count("*"), F.sum("s"), F.max("s"))


def self_join(spark: SparkSession, rows: int) -> DataFrame:
    """Both sides shuffled in full: every row of the table crosses the shuffle twice."""
    facts = _facts(spark, rows)
    other = facts.select(F.col("id"), (F.col("v") % 7).alias("m"))
    return facts.join(other, "id").groupBy("m").agg(F.count("*"), F.sum("v"), F.max("name"))


def window_rank(spark: SparkSession, rows: int) -> DataFrame:
    w = Window.partitionBy((F.col("k") % 1000).alias("bucket")).orderBy(F.col("v").desc(), "id")
    ranked = _facts(spark, rows).withColumn("r", F.rank().over(w))
    return ranked.agg(F.count("*"), F.sum(F.col("r") * (F.col("v") % 3)))


QUERIES: dict[str, Callable[[SparkSession, int], DataFrame]] = {
    q.__name__: q for q in (join_then_aggregate, wide_aggregate, self_join, window_rank)
}
#: what --queries may name: these, the star-schema session's and the four shuffle-heavy shapes
ALL_QUERIES = {**QUERIES, **star_schema.QUERIES, **sql_shapes.QUERIES}

#: per stage, Spark's metrics summed by `--breakdown` (times: run, GC and fetch wait in ms, CPU and write in ns)
STAGE_METRICS = (
    "numTasks",
    "executorRunTime",
    "executorCpuTime",
    "jvmGcTime",
    "shuffleFetchWaitTime",
    "shuffleRemoteBlocksFetched",
    "shuffleLocalBlocksFetched",
    "shuffleReadBytes",
    "shuffleReadRecords",
    "shuffleWriteBytes",
    "shuffleWriteTime",
    "memoryBytesSpilled",
    "diskBytesSpilled",
)


def _stages(spark: SparkSession) -> list[Any]:
    """Every stage of the session so far (Spark's status store, StageData through py4j)."""
    sc = spark.sparkContext
    gateway = sc._gateway
    assert gateway is not None, "the session's JVM gateway is gone"
    stages = (
        sc._jsc.sc()
        .statusStore()
        .stageList(
            None, False, False, gateway.new_array(gateway.jvm.double, 0), gateway.jvm.java.util.Collections.emptyList()
        )
    )
    return [stages.apply(i) for i in range(stages.size())]


def _shuffle_write_bytes(spark: SparkSession) -> int:
    return int(sum(stage.shuffleWriteBytes() for stage in _stages(spark)))


def _stage_sums(stages: list[Any]) -> dict[str, dict[str, int]]:
    """Spark's metrics of `stages` summed, split into the stages that read a shuffle ("reduce": reduce
    tasks, which may write the next shuffle too) and those that only write one ("map")."""
    out: dict[str, dict[str, int]] = {"map": dict.fromkeys(STAGE_METRICS, 0), "reduce": dict.fromkeys(STAGE_METRICS, 0)}
    for stage in stages:
        side = out["reduce" if stage.shuffleReadBytes() > 0 else "map"]
        for metric in STAGE_METRICS:
            side[metric] += int(getattr(stage, metric)())
    return out


def _plugin_counts(spark: SparkSession) -> dict[str, int] | None:
    """The plugin's counts in this JVM (local masters: the executors' too): io.shuffled.spark.Counts; None for
    a plugin jar built before it counted (a before/after run)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "the session's JVM gateway is gone"
    counts = jvm.io.shuffled.spark.Counts
    if not isinstance(counts, JavaClass):
        return None
    names = "unsorted serialized sorted pair_blocks batch_blocks reads streams buffers buffer_bytes runs".split()
    values = [*counts.mapOutputs(), *counts.blocks(), *counts.reads()]
    try:  # a jar of the run before this one counted no writer waits
        names += ["open_nanos", "commit_nanos"]
        values += [*counts.writerWaits()]
    except Py4JError:
        names = names[:-2]
    return {name: int(v) for name, v in zip(names, values, strict=True)}


def _aqe_reads(df: DataFrame) -> dict[str, int]:
    """How AQE read the query's shuffles: the partition specs of its final plan, by kind (a coalesced range of
    reduce partitions, a part of a skewed one, ...)."""
    kinds: dict[str, int] = {}
    for _, specs in shuffle_reads(df):
        for spec in specs:
            kind = str(spec.getClass().getSimpleName())
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def _breakdown(spark: SparkSession, df: DataFrame, seen: int, counts: dict[str, int] | None) -> dict[str, Any]:
    """Where a query's time went: its stages' metrics (stage ids above `seen`), its AQE reads and, through the
    plugin, the plugin's counts since `counts`."""
    out: dict[str, Any] = {"stages": _stage_sums([s for s in _stages(spark) if s.stageId() > seen])}
    out["aqe_reads"] = _aqe_reads(df)
    now = _plugin_counts(spark) if counts is not None else None
    if counts is not None and now is not None:
        out["plugin"] = {k: now[k] - counts[k] for k in now}
    return out


def _drop_shuffles(spark: SparkSession) -> None:
    sc = spark.sparkContext._jsc.sc()
    cleaner = sc.cleaner().get()
    for shuffle_id in range(sc.newShuffleId()):
        cleaner.doCleanupShuffle(shuffle_id, True)


#: how long a session on a cluster may wait for its executors (JVMs its workers start; slow on a busy machine)
EXECUTORS_TIMEOUT = 150.0


def _wait_for_executors(spark: SparkSession, want: int) -> None:
    """Until the cluster runs `want` executors for the session: a cluster that gives it none fails here, saying
    so, instead of leaving the first query pending until the caller's time limit."""
    deadline = time.monotonic() + EXECUTORS_TIMEOUT
    while (have := spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1) < want:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{have} of {want} executors registered within {EXECUTORS_TIMEOUT:.0f}s")
        time.sleep(0.2)  # polling the driver's executor list: Spark offers nothing to block on


def run(
    mode: str,
    rows: int,
    partitions: int,
    addresses: list[str],
    jar: Path,
    queries: list[str],
    keep_shuffles: bool,
    master: str = "local[2]",
    settings: dict[str, str] | None = None,
    executors: int = 0,
    breakdown: bool = False,
    record: Path | None = None,
) -> dict[str, Any]:
    conf: dict[str, str | int | float | bool | None] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "4g",
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.autoBroadcastJoinThreshold": "-1",
        "spark.jars": str(jar),
    }
    if mode == "plugin":
        conf.update(spark_jar.spark_conf(jar, addresses, daemon_choice="task"))
    conf.update(settings or {})
    spark = SparkSession.builder.master(master).appName(f"shuffled-bench-{mode}").config(map=conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    out: dict[str, Any] = {"mode": mode, "queries": {}}
    try:
        _wait_for_executors(spark, executors)
        recording = _recording(spark) if record is not None else None
        for name in queries:
            before = _shuffle_write_bytes(spark)
            seen = max((s.stageId() for s in _stages(spark)), default=-1) if breakdown else -1
            counts = _plugin_counts(spark) if breakdown and mode == "plugin" else None
            df = ALL_QUERIES[name](spark, rows)
            t0 = time.perf_counter()
            result = [tuple(r) for r in df.collect()]
            seconds = time.perf_counter() - t0
            out["queries"][name] = {
                "seconds": seconds,
                "shuffle_bytes": _shuffle_write_bytes(spark) - before,
                "result": hashlib.sha256(repr(sorted(result, key=repr)).encode()).hexdigest(),
            }
            if breakdown:
                out["queries"][name]["breakdown"] = _breakdown(spark, df, seen, counts)
            if not keep_shuffles:
                _drop_shuffles(spark)
        if recording is not None:
            recording.stop()
            recording.dump(spark.sparkContext._jvm.java.io.File(str(record)).toPath())  # type: ignore[union-attr]
            recording.close()
    finally:
        spark.stop()
    return out


def _recording(spark: SparkSession) -> Any:
    """A Java Flight Recorder recording of the driver's JVM (executors too in local mode), started now with the
    JDK's "profile" settings: written before the session ends, unlike one the JVM writes at its exit."""
    jfr = spark.sparkContext._jvm.jdk.jfr  # type: ignore[union-attr]
    recording = jfr.Recording(jfr.Configuration.getConfiguration("profile"))
    recording.start()
    return recording


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spark_job")
    parser.add_argument("--mode", choices=["builtin", "plugin"], required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--addresses", default="", help="daemons, comma-separated (plugin mode)")
    parser.add_argument("--jar", type=Path, required=True)
    parser.add_argument("--queries", default=",".join(QUERIES), help="which queries, comma-separated")
    parser.add_argument("--keep-shuffles", action="store_true", help="do not drop each query's shuffles after it")
    parser.add_argument("--master", default="local[2]", help="Spark master URL")
    parser.add_argument("--executors", type=int, default=0, help="wait for this many executors before the queries")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (last wins)")
    parser.add_argument(
        "--breakdown", action="store_true", help="per query: its stages' metrics, AQE's reads and the plugin's counts"
    )
    parser.add_argument("--record", type=Path, help="write a Java Flight Recorder file of the queries here")
    args = parser.parse_args(argv)
    if any("=" not in c for c in args.conf):
        parser.error("--conf takes KEY=VALUE")
    settings = dict(c.split("=", 1) for c in args.conf)
    addresses = [a for a in args.addresses.split(",") if a]
    queries = [q for q in args.queries.split(",") if q]
    unknown = set(queries) - set(ALL_QUERIES)
    if unknown:
        parser.error(f"unknown queries {', '.join(sorted(unknown))}; choose from {', '.join(ALL_QUERIES)}")
    out = run(
        args.mode,
        args.rows,
        args.partitions,
        addresses,
        args.jar,
        queries,
        args.keep_shuffles,
        args.master,
        settings,
        args.executors,
        args.breakdown,
        args.record,
    )
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
