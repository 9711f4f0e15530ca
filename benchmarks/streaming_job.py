"""Helper process of the `streaming` scenario: one Structured Streaming query in a Spark session of its own; one
JSON line of results.

``python -m benchmarks.streaming_job --mode builtin|plugin --batches N --rows-per-batch R --jar JAR [--address A]``.
The query: a stateful windowed aggregation with a watermark over Spark's ``rate-micro-batch`` source (a fixed
number of rows per micro-batch and event time advancing one second per batch, so both shuffles get the same
batches whatever their speed), 200 shuffle partitions (``--partitions``), micro-batches back to back, finished
windows appended to a memory sink. Each micro-batch shuffles its rows to the state store's partitions; Spark
drops the batch's shuffle once the driver has collected its garbage (ContextCleaner), which for the plugin
unregisters it on the daemon. Prints every batch's duration (Spark's ``triggerExecution``), a digest of the
sink's rows, and, with a daemon, the shuffles and bytes it holds at each of ``--checkpoints`` batches (polled as
the query runs: a sample may be a batch or two late) and once the query stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from shuffled import spark_jar
from shuffled_client import Client

#: how often the driver looks at the query's progress (for the checkpoints and the end)
POLL_SECONDS = 0.05


def held(address: str) -> dict[str, int]:
    """Shuffles and bytes the daemon holds now."""
    with Client(address, timeout=10) as client:
        store = client.stats()["store"]
    return {"shuffles": int(store["shuffles"]), "bytes": int(store["stored_bytes"])}


def run(
    mode: str, batches: int, rows: int, jar: Path, address: str, checkpoints: list[int], partitions: int
) -> dict[str, Any]:
    conf: dict[str, str | int | float | bool | None] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.streaming.numRecentProgressUpdates": str(batches + 10),
        "spark.jars": str(jar),
    }
    if mode == "plugin":
        conf.update(spark_jar.spark_conf(jar, [address]))
    spark = SparkSession.builder.master("local[2]").appName(f"shuffled-streaming-{mode}").config(map=conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    out: dict[str, Any] = {"mode": mode, "held": []}
    try:
        events = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", rows)
            .option("numPartitions", 2)
            .option("advanceMillisPerBatch", 1000)
            .load()
            .select("timestamp", (F.col("value") % 1000).alias("key"), "value")
        )
        windows = (
            events.withWatermark("timestamp", "10 seconds")
            .groupBy(F.window("timestamp", "5 seconds"), "key")
            .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
        )
        query = (
            windows.writeStream.outputMode("append")
            .format("memory")
            .queryName("windows")
            .trigger(processingTime="0 seconds")
            .start()
        )
        pending = sorted(checkpoints)
        done = -1
        while done < batches - 1:
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            progress = query.lastProgress
            done = progress["batchId"] if progress else -1
            while pending and done + 1 >= pending[0] and mode == "plugin":
                out["held"].append({"batches": done + 1, **held(address)})
                pending.pop(0)
            time.sleep(POLL_SECONDS)
        query.stop()
        out["seconds"] = [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress][:batches]
        rows_out = sorted(tuple(map(str, r)) for r in spark.sql("select * from windows").collect())
        out["result"] = hashlib.sha256(repr(rows_out).encode()).hexdigest()
        out["windows"] = len(rows_out)
        if mode == "plugin":
            out["held_after_stop"] = held(address)
    finally:
        spark.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.streaming_job")
    parser.add_argument("--mode", choices=["builtin", "plugin"], required=True)
    parser.add_argument("--batches", type=int, required=True)
    parser.add_argument("--rows-per-batch", type=int, required=True)
    parser.add_argument("--jar", type=Path, required=True)
    parser.add_argument("--address", default="", help="the daemon (plugin mode)")
    parser.add_argument("--checkpoints", default="", help="batch counts at which to sample the daemon, comma-separated")
    parser.add_argument("--partitions", type=int, default=200, help="shuffle partitions (the state store's too)")
    args = parser.parse_args(argv)
    checkpoints = [int(c) for c in args.checkpoints.split(",") if c]
    out = run(args.mode, args.batches, args.rows_per_batch, args.jar, args.address, checkpoints, args.partitions)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
