"""Runs inside a Python environment with another Spark line's pyspark (tests/spark/test_spark_lines.py): a job
matrix through Spark's built-in shuffle, then through shuffled; prints one JSON line.

``python -m tests.spark.spark_line_job JAR ADDRESS``. The jobs: a SQL join and an aggregation with AQE,
2,000-partition shuffles that AQE coalesces into ranges and whose skewed partition it splits by map ranges,
a join AQE turns into a broadcast join whose other side's shuffle it reads by map ranges (the local reader),
TPC-DS-style star-schema queries (benchmarks/star_schema.py), an RDD groupByKey, the row-based shuffle
checksums of every map status (Spark 4.1 on; on both writer paths), a map task that fails
once and is retried, and a shuffle read again after its daemon was killed and replaced by one without
its data (the test does that between the two reads: this script prints ``{"ready": true}`` and waits
for a line on stdin), which must end in a fetch failure and a recompute. The plugin runs on
``local-cluster``: executors in JVMs of their own, as on a cluster. Only pyspark is imported besides
tests.spark_jobs, benchmarks.star_schema and shuffled.spark_jar (standard library only), so any pyspark
line can run it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pyspark import TaskContext
from pyspark.sql import SparkSession

from benchmarks import star_schema
from shuffled import spark_jar
from tests import spark_jobs


def _fail_first_attempt(rows: Any) -> Any:
    ctx = TaskContext.get()
    if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
        raise RuntimeError("the first attempt of map task 0 fails on purpose")
    return rows


def retried_map_task(spark: SparkSession) -> Any:
    data = spark.sparkContext.parallelize([(i % 13, i) for i in range(5_000)], 4).mapPartitions(_fail_first_attempt)
    return sorted(data.reduceByKey(lambda a, b: a + b).collect())


#: TPC-DS-style queries over the benchmarks' star schema: joins of a fact table with its dimensions and
#: an aggregate, and a skewed join (one hot customer) for AQE to split
STAR_QUERIES = ["revenue_by_year_region", "hot_customer_join"]
STAR_ROWS = 60_000


def star_query(name: str) -> Any:
    def run(spark: SparkSession) -> list[list[Any]]:
        return sorted([list(row) for row in star_schema.QUERIES[name](spark, STAR_ROWS).collect()], key=repr)

    return run


JOBS = {
    "groupby_agg": spark_jobs.groupby_agg,
    "join_sort_merge": spark_jobs.join_sort_merge,
    "rdd_group_by_key": spark_jobs.rdd_group_by_key,
    "aqe_local_read": spark_jobs.aqe_local_read,
    "wide_aqe_coalesce": spark_jobs.wide_aqe_coalesce,
    "wide_aqe_skew_join": spark_jobs.wide_aqe_skew_join,
    "retried_map_task": retried_map_task,
    **{name: star_query(name) for name in STAR_QUERIES},
}


def run(spark: SparkSession) -> dict[str, Any]:
    out = {name: job(spark) for name, job in JOBS.items()}
    if spark_jar.has_row_checksums(".".join(spark.version.split(".")[:2])):
        out["row_checksums"] = [spark_jobs.row_checksums(spark, n) for n in (8, 300)]
    return out


def main() -> int:
    jar, address = sys.argv[1], sys.argv[2]
    builtin = spark_jobs.session("local[2,4]", {"spark.jars": jar})
    out: dict[str, Any] = {"version": builtin.version, "builtin": run(builtin)}
    builtin.stop()
    # Executor JVMs of their own: they must load the shuffle manager from what spark_conf() sets for
    # this line (Spark 3.5 creates it before spark.jars are loaded).
    conf = {**spark_jar.spark_conf(Path(jar), [address]), "spark.shuffled.timeout": "10s"}
    spark = spark_jobs.session("local-cluster[2,1,1024]", conf)
    try:
        out["plugin"] = run(spark)
        sums = spark.sparkContext.parallelize([(i % 53, i) for i in range(20_000)], 4).reduceByKey(lambda a, b: a + b)
        first = sorted(sums.collect())
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
        out["reread"] = [first, sorted(sums.collect())]
    finally:
        spark.stop()
    print(json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
