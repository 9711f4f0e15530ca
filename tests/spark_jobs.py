"""The PySpark jobs the Spark tests run twice, through shuffled and through Spark's built-in shuffle.

Each job returns plain Python values that compare exactly: sorted rows where the job's output order is
not defined, rows in order where it is (orderBy, sortByKey, partition sizes of repartition). The data is
generated, deterministic and small, so a whole run takes seconds; every job shuffles at least once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

Job = Callable[[SparkSession], Any]

#: JVM options for Spark JVMs that run short jobs on small data (test sessions, --quick benchmarks, the
#: standalone master and workers): the JIT's first tier and the serial collector start and finish them
#: sooner than the server defaults tuned for long jobs, and change no result. Here, not in a module that
#: imports pytest: each Spark line's venv (tests/spark/spark_line_job.py) imports this module and has only
#: pyspark.
SHORT_RUN_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: Settings both kinds of session share: joins always shuffle (no broadcast), few partitions (fast).
COMMON_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.sql.shuffle.partitions": "8",
    "spark.default.parallelism": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.driver.extraJavaOptions": SHORT_RUN_JVM,  # test jobs are short and small
    "spark.executor.extraJavaOptions": SHORT_RUN_JVM,
}


def facts(spark: SparkSession, rows: int = 20_000) -> DataFrame:
    return spark.range(0, rows, numPartitions=4).select(
        F.col("id"),
        (F.col("id") % 101).alias("k"),
        (F.col("id") * 7919 % 1000).alias("v"),
        F.concat(F.lit("name-"), (F.col("id") % 37).cast("string")).alias("s"),
    )


def dims(spark: SparkSession) -> DataFrame:
    return spark.range(0, 303, numPartitions=2).select((F.col("id") % 101).alias("k"), F.col("id").alias("w"))


def rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in df.collect()]


def executed_plan(df: DataFrame) -> str:
    """The final physical plan (after AQE re-planning), to check which operators really ran."""
    return str(df._jdf.queryExecution().executedPlan().toString())


def planned_rows(df: DataFrame, marker: str, what: str) -> list[tuple[Any, ...]]:
    """The sorted rows of ``df``, whose final plan must show ``marker`` (what AQE did: ``what``)."""
    result = sorted(rows(df))
    plan = executed_plan(df)
    assert marker in plan, f"AQE did not {what}:\n{plan}"
    return result


@contextmanager
def job_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """Session settings for one job; afterwards each is back to the session's (COMMON_CONF or Spark's default),
    so the jobs after it run as if it never had them."""
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in settings:
            if key in COMMON_CONF:
                spark.conf.set(key, COMMON_CONF[key])
            else:
                spark.conf.unset(key)


def groupby_agg(spark: SparkSession) -> Any:
    out = facts(spark).groupBy("k").agg(F.sum("v"), F.count("*"), F.max("id"), F.countDistinct("s"))
    return sorted(rows(out))


def _join(spark: SparkSession, hint: str, operator: str) -> Any:
    df = facts(spark, 5_000).join(dims(spark).hint(hint), "k").select("id", "k", "v", "w")
    result = sorted(rows(df))
    plan = executed_plan(df)
    assert operator in plan, f"expected {operator} in the plan:\n{plan}"
    return result


def join_sort_merge(spark: SparkSession) -> Any:
    return _join(spark, "merge", "SortMergeJoin")


def join_shuffled_hash(spark: SparkSession) -> Any:
    return _join(spark, "shuffle_hash", "ShuffledHashJoin")


def order_by(spark: SparkSession) -> Any:
    return rows(facts(spark).orderBy(F.col("v").desc(), "id"))


def window(spark: SparkSession) -> Any:
    w = Window.partitionBy("k").orderBy("v", "id")
    df = facts(spark).select("id", "k", F.row_number().over(w).alias("n"), F.sum("v").over(w).alias("running"))
    return sorted(rows(df))


def distinct(spark: SparkSession) -> Any:
    return sorted(rows(facts(spark).select("s", "k").distinct()))


def _pairs(spark: SparkSession) -> Any:
    return spark.sparkContext.parallelize([(i % 53, i) for i in range(20_000)], 4)


def rdd_reduce_by_key(spark: SparkSession) -> Any:
    return sorted(_pairs(spark).reduceByKey(lambda a, b: a + b).collect())


def rdd_group_by_key(spark: SparkSession) -> Any:
    return sorted((k, sorted(vs)) for k, vs in _pairs(spark).groupByKey().collect())


def rdd_sort_by_key(spark: SparkSession) -> Any:
    data = spark.sparkContext.parallelize([(i * 7919 % 20_011, i) for i in range(20_000)], 4)
    return data.sortByKey(numPartitions=3).collect()


def rdd_repartition(spark: SparkSession) -> Any:
    data = spark.sparkContext.parallelize(range(10_000), 3).repartition(5)
    return data.glom().map(len).collect(), sorted(data.collect())


def aqe_coalesce(spark: SparkSession) -> Any:
    """200 shuffle partitions of a small aggregate: AQE must coalesce them from the map output sizes."""
    with job_conf(spark, {"spark.sql.shuffle.partitions": "200"}):
        return planned_rows(facts(spark).groupBy("k").agg(F.sum("v").alias("total")), "coalesced", "coalesce")


SKEW_CONF = {
    "spark.sql.adaptive.skewJoin.enabled": "true",
    "spark.sql.adaptive.skewJoin.skewedPartitionFactor": "2",
    "spark.sql.adaptive.skewJoin.skewedPartitionThresholdInBytes": "4k",
    "spark.sql.adaptive.advisoryPartitionSizeInBytes": "4k",
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
}


def aqe_skew_join(spark: SparkSession) -> Any:
    """Most rows share key 0: AQE must split that partition, using the per-partition sizes of the map output."""
    with job_conf(spark, SKEW_CONF):
        left = spark.range(0, 40_000, numPartitions=4).select(
            F.when(F.col("id") % 10 < 8, F.lit(0)).otherwise(F.col("id") % 50).alias("k"), F.col("id")
        )
        joined = left.join(dims(spark).hint("merge"), "k")
        # Grouped by another column: the join's own partitioning is not needed afterwards, so AQE may split.
        df = joined.groupBy((F.col("id") % 7).alias("g")).agg(F.count("*"), F.sum("k"), F.sum("w"))
        return planned_rows(df, "skew=true", "split the skewed partition")


def aqe_local_read(spark: SparkSession) -> Any:
    """A sort-merge join that AQE turns into a broadcast join once its shuffles ran, one side being small then
    (Spark's default, here with the static threshold off): the other side's shuffle is read by the local
    shuffle reader, each task every reduce partition of a range of map outputs. Two reduce partitions, not
    coalesced, so that the reader splits the four map outputs of the large side in two ranges whatever their
    sizes (one range of all of them would not tell a reader that ignores the range)."""
    local_read = {
        "spark.sql.adaptive.autoBroadcastJoinThreshold": "1m",
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
    }
    with job_conf(spark, local_read):
        small = dims(spark).where(F.col("w") % 3 == 0)
        joined = facts(spark).join(small, "k")
        df = joined.groupBy((F.col("id") % 7).alias("g")).agg(F.count("*"), F.sum("v"), F.sum("w"))
        result = planned_rows(df, "AQEShuffleRead local", "read a shuffle with the local shuffle reader")
        reads = [[_spec(spec) for spec in specs] for _, specs in shuffle_reads(df)]
    ranges = [specs for specs in reads if specs and specs[0][0] == "CoalescedMapperPartitionSpec"]
    assert any(len(specs) > 1 for specs in ranges), f"no local read split the map outputs into ranges: {reads}"
    return result


# -- wide: thousands of reduce partitions of small data, so every map output is thousands of tiny blocks

#: reduce partitions of the wide jobs (few map tasks each write this many blocks)
WIDE_PARTITIONS = 2_000
#: AQE sizes coalesced partitions by the advisory size (not by the default parallelism, nor at least 1 MiB),
#: so a wide shuffle of small data is read as a dozen or so ranges of over a hundred partitions each
WIDE_AQE = {
    "spark.sql.shuffle.partitions": str(WIDE_PARTITIONS),
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.parallelismFirst": "false",
    "spark.sql.adaptive.advisoryPartitionSizeInBytes": "64k",
    "spark.sql.adaptive.coalescePartitions.minPartitionSize": "1k",
}


def _scala_list(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def shuffle_reads(df: DataFrame) -> list[tuple[int, list[Any]]]:
    """Every AQEShuffleRead of ``df``'s final plan: the reduce partitions of the shuffle it reads, and the
    partition specs it read them by (Spark's ShufflePartitionSpec objects, through py4j)."""
    found: list[tuple[int, list[Any]]] = []
    pending = [df._jdf.queryExecution().executedPlan()]
    while pending:
        node = pending.pop()
        kind = node.getClass().getSimpleName()
        if kind == "AdaptiveSparkPlanExec":
            pending.append(node.executedPlan())
            continue
        if kind.endswith("QueryStageExec"):  # a shuffle's, a broadcast's, (Spark 4) the result's
            pending.append(node.plan())
            continue
        if kind.startswith("AQEShuffleRead"):  # AQEShuffleReadExec
            found.append((node.child().outputPartitioning().numPartitions(), _scala_list(node.partitionSpecs())))
        pending.extend(_scala_list(node.children()))
    return found


def _spec(spec: Any) -> tuple[str, ...]:
    """A partition spec as (kind, its indexes as text): CoalescedPartitionSpec(start, end) reads reduce
    partitions [start, end) of every map output; PartialReducerPartitionSpec(reducer, start, end) reads one
    reduce partition of map outputs [start, end) only: a part of a skewed partition;
    CoalescedMapperPartitionSpec(start, end) reads every reduce partition of map outputs [start, end): the
    local shuffle reader's."""
    kind = spec.getClass().getSimpleName()
    if kind == "CoalescedPartitionSpec":
        return kind, str(spec.startReducerIndex()), str(spec.endReducerIndex())
    if kind == "PartialReducerPartitionSpec":
        return kind, str(spec.reducerIndex()), str(spec.startMapIndex()), str(spec.endMapIndex())
    if kind == "CoalescedMapperPartitionSpec":
        return kind, str(spec.startMapIndex()), str(spec.endMapIndex())
    return (kind,)


def wide_aqe_coalesce(spark: SparkSession) -> Any:
    """2,000 reduce partitions from 4 map tasks: AQE must read them as fewer, wider ranges that still cover
    every partition once, from the map output sizes the shuffle reported."""
    with job_conf(spark, WIDE_AQE):
        df = facts(spark).groupBy((F.col("id") % 4_999).alias("g")).agg(F.sum("v"), F.max("s"), F.count("*"))
        result = sorted(rows(df))
        reads = shuffle_reads(df)
    assert reads, f"no AQEShuffleRead in the plan:\n{executed_plan(df)}"
    for width, specs in reads:
        assert width == WIDE_PARTITIONS, f"the shuffle has {width} partitions"
        ranges = [_spec(s) for s in specs]
        assert all(r[0] == "CoalescedPartitionSpec" for r in ranges), ranges
        bounds = [(int(r[1]), int(r[2])) for r in ranges]
        assert 1 < len(bounds) < WIDE_PARTITIONS / 10, f"AQE did not coalesce into a few ranges: {bounds}"
        assert [b[0] for b in bounds] == [0] + [b[1] for b in bounds[:-1]] and bounds[-1][1] == width, bounds
    return result


def wide_aqe_skew_join(spark: SparkSession) -> Any:
    """A join into 2,000 partitions, one of them holding most rows: AQE must split that one into reads of
    parts of the map outputs (one reduce partition, a sub-range of the map tasks each) and coalesce the rest."""
    with job_conf(spark, {**WIDE_AQE, **{k: v for k, v in SKEW_CONF.items() if "skewJoin" in k}}):
        left = spark.range(0, 40_000, numPartitions=4).select(
            F.when(F.col("id") % 10 < 8, F.lit(0)).otherwise(F.col("id") % 3_001).alias("k"), F.col("id")
        )
        right = spark.range(0, 6_002, numPartitions=2).select((F.col("id") % 3_001).alias("k"), F.col("id").alias("w"))
        joined = left.join(right.hint("merge"), "k")
        df = joined.groupBy((F.col("id") % 7).alias("g")).agg(F.count("*"), F.sum("k"), F.sum("w"))
        result = sorted(rows(df))
        reads = shuffle_reads(df)
    split: dict[str, set[tuple[str, str]]] = {}
    for _, specs in reads:
        for kind, *indexes in map(_spec, specs):
            if kind == "PartialReducerPartitionSpec":
                split.setdefault(indexes[0], set()).add((indexes[1], indexes[2]))
    assert any(len(parts) > 1 for parts in split.values()), f"AQE split no partition by map ranges: {split}"
    assert {w for w, _ in reads} == {WIDE_PARTITIONS}, reads
    return result


#: Every job both shuffles run; the tests compare their results one by one.
JOBS: dict[str, Job] = {
    job.__name__: job
    for job in (
        groupby_agg,
        join_sort_merge,
        join_shuffled_hash,
        order_by,
        window,
        distinct,
        rdd_reduce_by_key,
        rdd_group_by_key,
        rdd_sort_by_key,
        rdd_repartition,
        aqe_coalesce,
        aqe_skew_join,
        aqe_local_read,
        wide_aqe_coalesce,
        wide_aqe_skew_join,
    )
}


# -- at scale: shuffles of tens of megabytes (many times small daemon pools) with small, exact results


def wide(spark: SparkSession, rows: int, parts: int = 8) -> DataFrame:
    """Rows of ~100 bytes that compress little (a SHA-256 in hex), so shuffled bytes stay large."""
    return spark.range(0, rows, numPartitions=parts).select(
        F.col("id"),
        (F.col("id") % 1009).alias("k"),
        (F.col("id") * 7919 % 100_003).alias("v"),
        F.sha2(F.col("id").cast("string"), 256).alias("h"),
    )


def digests(df: DataFrame, *keys: str) -> DataFrame:
    """Per group: row count and order-independent sums of every row's hash (equal digests: equal rows)."""
    low32 = F.xxhash64(*df.columns).bitwiseAND(0xFFFFFFFF)  # summed as 64-bit: no overflow (ANSI mode)
    return df.groupBy(*keys).agg(F.count("*"), F.sum(F.hash(*df.columns)), F.sum(low32))


def digest(df: DataFrame, *keys: str) -> Any:
    return sorted(rows(digests(df, *keys)))


SCALE_ROWS = 1_000_000


def scale_join_aggregate(spark: SparkSession) -> Any:
    """A sort-merge join into 64 shuffle partitions, which AQE coalesces from the map output sizes the
    daemons reported at commit (every partition is far below its advisory size)."""
    with job_conf(spark, {"spark.sql.shuffle.partitions": "64"}):
        left = wide(spark, SCALE_ROWS)
        right = wide(spark, SCALE_ROWS).select("id", F.col("h").alias("h2"), F.col("v").alias("v2"))
        return planned_rows(digests(left.join(right.hint("merge"), "id"), "k"), "coalesced", "coalesce")


def scale_window(spark: SparkSession) -> Any:
    # Ordered by the wide column, so it crosses the shuffle: Spark 4.3 computes a column that is only
    # passed through a window after the exchange.
    w = Window.partitionBy("k").orderBy("v", "h")
    ranked = wide(spark, SCALE_ROWS).select("k", "v", "h", F.row_number().over(w).alias("n"))
    return digest(ranked, "k")


def scale_distinct_sort(spark: SparkSession) -> Any:
    """A distinct of unique values (no map-side reduction), then a global sort checked in order."""
    unique = wide(spark, SCALE_ROWS).select("h", "k").distinct()
    ordered = unique.orderBy("h").select("h", F.monotonically_increasing_id().alias("pos"))
    ordered = ordered.withColumn("rank", F.row_number().over(Window.partitionBy(F.lit(0)).orderBy("pos")))
    return digest(ordered.select("h", "rank"))


def scale_skew_join(spark: SparkSession) -> Any:
    """Most rows share key 0: AQE splits that partition, reading map ranges of spilled map outputs."""
    scale_skew = {
        **SKEW_CONF,
        "spark.sql.adaptive.skewJoin.skewedPartitionThresholdInBytes": "1m",
        "spark.sql.adaptive.advisoryPartitionSizeInBytes": "1m",
    }
    with job_conf(spark, scale_skew):
        left = wide(spark, SCALE_ROWS).withColumn("k", F.when(F.col("id") % 10 < 8, F.lit(0)).otherwise(F.col("k")))
        joined = left.join(dims(spark).hint("merge"), "k").select("id", "k", "h", "w")
        df = digests(joined.withColumn("g", F.col("id") % 7), "g")
        return planned_rows(df, "skew=true", "split the skewed partition")


def scale_rdd_group_by_key(spark: SparkSession) -> Any:
    def record(i: int) -> tuple[int, str]:
        import hashlib

        return i % 101, hashlib.sha256(str(i).encode()).hexdigest() * 2

    def summary(values: Any) -> tuple[int, int]:
        import zlib

        return len(values), sum(zlib.crc32(v.encode()) for v in values)

    data = spark.sparkContext.parallelize(range(1_000_000), 8).map(record)
    return sorted(data.groupByKey(numPartitions=8).mapValues(summary).collect())


SCALE_JOBS: dict[str, Job] = {
    job.__name__: job
    for job in (scale_join_aggregate, scale_window, scale_distinct_sort, scale_skew_join, scale_rdd_group_by_key)
}


#: Spark 4.1's row-based (order-independent) shuffle checksums, with AQE off so a groupBy is one shuffle
ROW_CHECKSUMS = {"spark.sql.shuffle.orderIndependentChecksum.enabled": "true", "spark.sql.adaptive.enabled": "false"}


def row_checksums(spark: SparkSession, partitions: int) -> list[int]:
    """A groupBy into ``partitions`` reduce partitions with row checksums on; the checksum in each of its map
    statuses. The same map task over the same rows gives the same value whichever shuffle wrote it."""
    with job_conf(spark, {**ROW_CHECKSUMS, "spark.sql.shuffle.partitions": str(partitions)}):
        facts(spark).groupBy("k").agg(F.sum("v"), F.max("s")).collect()
    # The driver's MapOutputTrackerMaster, through the DAG scheduler's field: py4j cannot look up methods on
    # SparkEnv in pyspark 4.3 (one of its signatures names a class pyspark does not ship).
    dag = spark.sparkContext._jsc.sc().dagScheduler()
    field = dag.getClass().getDeclaredField("mapOutputTracker")
    field.setAccessible(True)
    statuses = field.get(dag).shuffleStatuses()
    newest = max(int(key) for key in statuses.keySet().toList().mkString(",").split(","))
    maps = statuses.get(newest).get().mapStatuses()
    return [maps[i].checksumValue() for i in range(len(maps))]


def session(master: str, conf: dict[str, str]) -> SparkSession:
    return (
        SparkSession.builder.master(master).appName("shuffled-tests").config(map={**COMMON_CONF, **conf}).getOrCreate()
    )
