"""The four shuffle-heavy SQL shapes of a TPC-DS-like session, over a star schema with two fact tables and
their returns, for the `shapes` scenario.

Where Spark's built-in shuffle keeps its time from 200 to 10,000 shuffle partitions and a shuffle service
must not lose it: a rollup over many grouping columns of the largest fact table (TPC-DS q67's shape), a
join of two fact tables with their returns on several keys (q17/q25/q29), large intermediate aggregates
behind ``IN`` subqueries (q14/q23), and a full outer join of two large distinct sets (q97). Store sales are
benchmarks/star_schema.py's ``sales``; catalog sales are as many rows again with other keys, and each fact
table's returns a tenth of its rows. Integer money and counts only, so results compare exactly between
shuffles.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from .star_schema import CUSTOMERS, DAYS, ITEMS, dates, items, revenue, sales, stores


def catalog_sales(spark: SparkSession, rows: int) -> DataFrame:
    """A second fact table, as many rows as the store sales: every other order is of the customer and item of
    the store sale with its number (customers buy the same things in both channels), the rest of others."""
    i = F.col("id")
    same = i % 2 == 0
    return spark.range(0, rows, numPartitions=16).select(
        i.alias("order_id"),
        (i * 13 % DAYS).alias("date_key"),
        F.when(same, i * 2_654_435_761 % ITEMS).otherwise(i * 40_503 % ITEMS).alias("item_key"),
        F.when(same, i * 40_503 % CUSTOMERS).otherwise(i * 7_919 % CUSTOMERS).alias("customer_key"),
        (i % 7 + 1).alias("quantity"),
        (i * 37 % 20_000 + 199).alias("price_cents"),
    )


def returns_of(facts: DataFrame, key: str) -> DataFrame:
    """Every tenth row of a fact table comes back: its key, customer and item, a quantity returned."""
    return facts.where(F.col(key) % 10 == 3).select(
        key, "customer_key", "item_key", (F.col("quantity") % 3 + 1).alias("returned")
    )


def rollup_many_columns(spark: SparkSession, rows: int) -> DataFrame:
    """q67: the largest fact table with its dimensions, rolled up over five columns (six grouping sets, the
    finest one nearly as many groups as rows), then the top items per category by revenue."""
    joined = (
        sales(spark, rows)
        .join(dates(spark), "date_key")
        .join(stores(spark), "store_key")
        .join(items(spark), "item_key")
    )
    rolled = joined.rollup("category", "year", "region", "brand", "item_key").agg(
        F.sum(revenue()).alias("r"), F.count("*").alias("n")
    )
    w = Window.partitionBy("category").orderBy(F.col("r").desc(), "year", "region", "brand", "item_key")
    return rolled.withColumn("rank", F.rank().over(w)).where("rank <= 100")


def facts_with_returns(spark: SparkSession, rows: int) -> DataFrame:
    """q25/q29: store sales joined with their returns on (sale, customer, item), then with catalog sales of
    the same customer and item: three fact tables shuffled on several keys."""
    store = sales(spark, rows)
    returned = returns_of(store, "sale_id")
    catalog = catalog_sales(spark, rows).select("customer_key", "item_key", F.col("quantity").alias("catalog_quantity"))
    joined = store.join(returned, ["sale_id", "customer_key", "item_key"]).join(catalog, ["customer_key", "item_key"])
    return joined.groupBy("store_key", (F.col("item_key") % 1000).alias("item_group")).agg(
        F.sum("quantity").alias("sold"),
        F.sum("returned").alias("returned"),
        F.sum("catalog_quantity").alias("catalog"),
        F.count("*").alias("n"),
    )


def in_aggregates(spark: SparkSession, rows: int) -> DataFrame:
    """q14/q23: catalog sales of the items sold most in stores and to the customers who spent most there,
    each an aggregate over the whole fact table behind an ``IN`` (which Spark plans as the semi joins
    written here)."""
    store = sales(spark, rows)
    frequent = (
        store.groupBy("item_key", "date_key")
        .count()
        .where("count >= 1")
        .groupBy("item_key")
        .agg(F.count("*").alias("days"))
        .where(F.col("days") > 3)
    )
    best = store.groupBy("customer_key").agg(F.sum(revenue()).alias("spent")).where(F.col("spent") > 5_000)
    catalog = catalog_sales(spark, rows)
    chosen = catalog.join(frequent.select("item_key"), "item_key", "left_semi").join(
        best.select("customer_key"), "customer_key", "left_semi"
    )
    return chosen.groupBy((F.col("date_key") / 365).cast("int").alias("year")).agg(
        F.sum(revenue()).alias("r"), F.count("*").alias("n")
    )


def full_outer_distinct(spark: SparkSession, rows: int) -> DataFrame:
    """q97: the distinct (customer, item) pairs of each fact table, full outer joined: how many only one
    channel sold, and how many both."""
    store = sales(spark, rows).select("customer_key", "item_key").distinct()
    catalog = catalog_sales(spark, rows).select("customer_key", "item_key").distinct()
    joined = store.alias("s").join(
        catalog.alias("c"),
        (F.col("s.customer_key") == F.col("c.customer_key")) & (F.col("s.item_key") == F.col("c.item_key")),
        "full_outer",
    )
    return joined.agg(
        F.sum(F.when(F.col("c.customer_key").isNull(), 1).otherwise(0)).alias("store_only"),
        F.sum(F.when(F.col("s.customer_key").isNull(), 1).otherwise(0)).alias("catalog_only"),
        F.sum(F.when(F.col("s.customer_key").isNotNull() & F.col("c.customer_key").isNotNull(), 1).otherwise(0)).alias(
            "both"
        ),
    )


QUERIES: dict[str, Callable[[SparkSession, int], DataFrame]] = {
    q.__name__: q for q in (rollup_many_columns, facts_with_returns, in_aggregates, full_outer_distinct)
}
