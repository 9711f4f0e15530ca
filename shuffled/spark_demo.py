"""`shuffled demo --spark`: a PySpark job whose shuffles go through the demo's two daemons."""

from __future__ import annotations

from collections import Counter
from typing import Any

from shuffled_client import Client

from . import spark_jar

ROWS = 1_000_000
CUSTOMERS = 1000


def _expected_top(n: int) -> list[tuple[int, int]]:
    totals: Counter[int] = Counter()
    for i in range(ROWS):
        totals[i % CUSTOMERS] += i % 97
    return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def run_spark_demo(addrs: list[str]) -> None:
    """Group, join and sort a million generated rows in local[2]; check the answer; show the daemons' share."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    jar = spark_jar.build_jar()
    conf: dict[str, Any] = {
        **spark_jar.spark_conf(jar, addrs, daemon_choice="task"),  # tasks spread over both daemons
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.autoBroadcastJoinThreshold": "-1",
    }
    print("spark conf:\n" + "\n".join(f"  {k} {v}" for k, v in conf.items()))
    spark = SparkSession.builder.master("local[2]").appName("shuffled-demo").config(map=conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        orders = spark.range(0, ROWS, numPartitions=4).select(
            (F.col("id") % CUSTOMERS).alias("customer"), (F.col("id") % 97).alias("amount")
        )
        names = spark.range(0, CUSTOMERS, numPartitions=2).select(
            F.col("id").alias("customer"), F.concat(F.lit("customer-"), F.col("id").cast("string")).alias("name")
        )
        totals = orders.groupBy("customer").agg(F.sum("amount").alias("total"))
        top = totals.join(names, "customer").orderBy(F.desc("total"), "customer").limit(5).collect()
        print(f"top customers by total of {ROWS} orders (groupBy + join + orderBy through shuffled):")
        for row in top:
            print(f"  {row['name']:<14} {row['total']:>8}")
        if [(r["customer"], r["total"]) for r in top] != _expected_top(5):
            raise SystemExit("spark demo: wrong result")
        for addr in addrs:
            with Client(addr) as client:
                store = client.stats()["store"]
            print(f"  daemon {addr}: {store['commits']} map outputs committed, {store['stored_bytes']} bytes held")
    finally:
        spark.stop()
    print("spark demo ok (the application's shuffle data was freed when the session stopped)")
