"""Runs inside a Python environment with any supported Spark line's pyspark (tests/spark/test_spark_rows.py):
Spark SQL's rows through every path of the plugin's writer, each job's result next to the built-in shuffle's;
prints one JSON line.

``python -m tests.spark.rows_job PLUGIN_JAR TESTS_JAR ADDRESS``. The plugin's shuffle manager is a
``SortShuffleManager``, so Spark SQL hands its writer one mutable row, rewritten for each record, without
the copy it makes for other managers: every path must serialize a row before the next arrives, or copy it.
One session per configuration, each choosing different paths for the same jobs (narrow: at most
``spark.shuffle.sort.bypassMergeThreshold`` partitions; wide: 400, past it, which is all a writer path asks
for; thousands of partitions are the job matrix's):

- ``default``: the unsorted path (narrow) and the serialized one (wide);
- ``io_encryption``: encrypted streams cannot follow each other in a block, so wide shuffles take Spark's sorter;
- ``io_encryption_uncompressed``: the same, the map outputs encrypted but not compressed;
- ``opaque_codec``: a codec Spark does not know to concatenate (the tests jar's ``OpaqueLz4Codec``): the sorter;
- ``java_serializer``: Spark's default serializer is Java's (SQL rows keep their own serializer); map outputs
  uncompressed.

A JVM RDD's ``distinct`` in each takes the map-side combine (the sorter with an aggregator; PySpark's own
``reduceByKey`` combines in Python). Each session reports
its jobs' results, how many map outputs each writer path wrote (``Counts``, executors in this JVM:
``local[2]``), and whether the driver's shuffle manager is a ``SortShuffleManager`` (what Spark SQL checks).
The tests jar is on the driver's class path from the first session on (the codec is loaded there).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from shuffled import spark_jar
from tests import spark_jobs

WIDE = "400"


def jvm_distinct(partitions: int) -> spark_jobs.Job:
    """``distinct`` of a JVM RDD: Spark's own reduceByKey, whose map side combines (PySpark's combines in Python)."""

    def run(spark: SparkSession) -> Any:
        numbers = spark.sparkContext._jsc.parallelize([i * 7919 % 5_003 for i in range(20_000)], 4)
        return sorted(numbers.distinct(partitions).collect())

    return run


#: job name -> (job, shuffle partitions of its SQL)
JOBS: dict[str, tuple[spark_jobs.Job, str]] = {
    "groupby_agg_narrow": (spark_jobs.groupby_agg, "8"),
    "groupby_agg_wide": (spark_jobs.groupby_agg, WIDE),
    "join_wide": (spark_jobs.join_sort_merge, WIDE),
    "combine_narrow": (jvm_distinct(8), "8"),
    "combine_wide": (jvm_distinct(300), "8"),
}
#: uncompressed map outputs (`spark.shuffled.compression=off`) in two: every writer path's, plain and encrypted,
#: read back on every line too
SESSIONS: dict[str, dict[str, str]] = {
    "default": {},
    "io_encryption": {"spark.io.encryption.enabled": "true"},
    "io_encryption_uncompressed": {"spark.io.encryption.enabled": "true", "spark.shuffled.compression": "off"},
    "opaque_codec": {"spark.io.compression.codec": "io.shuffled.spark.OpaqueLz4Codec"},
    "java_serializer": {
        "spark.serializer": "org.apache.spark.serializer.JavaSerializer",
        "spark.shuffled.compression": "off",
    },
}


def run(spark: SparkSession) -> dict[str, Any]:
    out = {}
    for name, (job, partitions) in JOBS.items():
        with spark_jobs.job_conf(spark, {"spark.sql.shuffle.partitions": partitions}):
            out[name] = job(spark)
    return out


def _plugin(spark: SparkSession) -> Any:
    """The plugin's package in the session's JVM (py4j)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "the session's JVM gateway is gone"
    return jvm.io.shuffled.spark


def paths(spark: SparkSession) -> list[int]:
    return [int(n) for n in _plugin(spark).Counts.mapOutputs()]


def sort_manager(spark: SparkSession) -> bool:
    return bool(_plugin(spark).ManagerCheck.sortBased())


def main() -> int:
    jar, tests_jar, address = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    class_path = f"{jar}:{tests_jar}"
    builtin = spark_jobs.session("local[2]", {"spark.jars": str(jar), "spark.driver.extraClassPath": class_path})
    out: dict[str, Any] = {"version": builtin.version, "builtin": run(builtin), "sessions": {}}
    builtin.stop()
    for name, settings in SESSIONS.items():
        conf = {**spark_jar.spark_conf(jar, [address]), "spark.driver.extraClassPath": class_path, **settings}
        spark = spark_jobs.session("local[2]", conf)
        try:
            before = paths(spark)
            results = run(spark)
            after = paths(spark)
            out["sessions"][name] = {
                "results": results,
                "paths": dict(
                    zip(
                        ("unsorted", "serialized", "sorted"),
                        (a - b for a, b in zip(after, before, strict=True)),
                        strict=True,
                    )
                ),
                "sort_manager": sort_manager(spark),
            }
        finally:
            spark.stop()
    print(json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
