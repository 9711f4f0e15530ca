"""A dozen analytic SQL queries over a generated star schema, for the `scale` scenario's long session.

One fact table (sales) and four dimensions (dates, stores, items, customers), generated from
``spark.range`` so that every run sees the same rows without files. Money is in integer cents and no
query averages floating-point values, so results are exact whatever order Spark adds them in and can
be compared byte for byte between the built-in shuffle and shuffled. One customer key is hot (a tenth
of all sales), so AQE's skew-join handling has something to split.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

DAYS = 1826
STORES = 200
ITEMS = 50_000
CUSTOMERS = 500_000


def sales(spark: SparkSession, rows: int) -> DataFrame:
    i = F.col("id")
    return spark.range(0, rows, numPartitions=16).select(
        i.alias("sale_id"),
        (i % DAYS).alias("date_key"),
        (i * 7_919 % STORES).alias("store_key"),
        (i * 2_654_435_761 % ITEMS).alias("item_key"),
        F.when(i % 10 == 0, F.lit(0)).otherwise(i * 40_503 % CUSTOMERS).alias("customer_key"),
        (i % 10 + 1).alias("quantity"),
        (i * 31 % 10_000 + 99).alias("price_cents"),
    )


def dates(spark: SparkSession) -> DataFrame:
    k = F.col("id")
    return spark.range(0, DAYS, numPartitions=1).select(
        k.alias("date_key"), (k / 365).cast("int").alias("year"), ((k % 365) / 31 + 1).cast("int").alias("month")
    )


def stores(spark: SparkSession) -> DataFrame:
    k = F.col("id")
    return spark.range(0, STORES, numPartitions=1).select(k.alias("store_key"), (k % 10).alias("region"))


def items(spark: SparkSession) -> DataFrame:
    k = F.col("id")
    return spark.range(0, ITEMS, numPartitions=2).select(
        k.alias("item_key"), (k % 40).alias("category"), (k % 500).alias("brand")
    )


def customers(spark: SparkSession) -> DataFrame:
    k = F.col("id")
    return spark.range(0, CUSTOMERS, numPartitions=4).select(
        k.alias("customer_key"),
        (k % 5).alias("segment"),
        (k % 1000).alias("city"),
        F.concat(F.lit("customer-"), k.cast("string")).alias("name"),
    )


def revenue() -> Column:
    return F.col("quantity") * F.col("price_cents")


def revenue_by_year_region(spark: SparkSession, rows: int) -> DataFrame:
    joined = sales(spark, rows).join(dates(spark), "date_key").join(stores(spark), "store_key")
    return joined.groupBy("year", "region").agg(F.sum(revenue()).alias("revenue"), F.count("*").alias("sales"))


def top_items_per_category(spark: SparkSession, rows: int) -> DataFrame:
    per_item = (
        sales(spark, rows)
        .join(items(spark), "item_key")
        .groupBy("category", "item_key")
        .agg(F.sum(revenue()).alias("r"))
    )
    w = Window.partitionBy("category").orderBy(F.col("r").desc(), "item_key")
    return per_item.withColumn("rank", F.row_number().over(w)).where("rank <= 5")


def customer_segments(spark: SparkSession, rows: int) -> DataFrame:
    per_customer = sales(spark, rows).groupBy("customer_key").agg(F.sum(revenue()).alias("spent"))
    joined = per_customer.join(customers(spark), "customer_key")
    return joined.groupBy("segment").agg(F.count("*"), F.sum("spent"), F.max("spent"), F.max("name"))


def distinct_customers_per_month(spark: SparkSession, rows: int) -> DataFrame:
    joined = sales(spark, rows).join(dates(spark), "date_key")
    return joined.groupBy("year", "month").agg(F.countDistinct("customer_key").alias("customers"))


def monthly_growth(spark: SparkSession, rows: int) -> DataFrame:
    monthly = (
        sales(spark, rows).join(dates(spark), "date_key").groupBy("year", "month").agg(F.sum(revenue()).alias("r"))
    )
    w = Window.orderBy("year", "month")
    return monthly.withColumn("growth", F.col("r") - F.lag("r").over(w))


def hot_customer_join(spark: SparkSession, rows: int) -> DataFrame:
    """Joins on the skewed key: a tenth of the sales belong to customer 0."""
    joined = sales(spark, rows).join(customers(spark), "customer_key")
    return joined.groupBy("city").agg(F.count("*"), F.sum(revenue()), F.max("sale_id"))


def basket_sizes(spark: SparkSession, rows: int) -> DataFrame:
    baskets = sales(spark, rows).groupBy("customer_key", "date_key").agg(F.sum("quantity").alias("items"))
    return baskets.groupBy("items").count()


def region_brand_rollup(spark: SparkSession, rows: int) -> DataFrame:
    joined = sales(spark, rows).join(stores(spark), "store_key").join(items(spark), "item_key")
    return joined.rollup("region", "brand").agg(F.sum(revenue()).alias("r"), F.count("*").alias("n"))


def best_sellers(spark: SparkSession, rows: int) -> DataFrame:
    """A global sort (range partitioning) of every item by revenue."""
    per_item = sales(spark, rows).groupBy("item_key").agg(F.sum(revenue()).alias("r"))
    return per_item.orderBy(F.col("r").desc(), "item_key").limit(100)


def repeat_buyers(spark: SparkSession, rows: int) -> DataFrame:
    months = sales(spark, rows).join(dates(spark), "date_key").select("customer_key", "year", "month").distinct()
    loyal = months.groupBy("customer_key").count().where("count > 3")
    return loyal.join(customers(spark), "customer_key").groupBy("segment").agg(F.count("*"), F.sum("count"))


def category_share(spark: SparkSession, rows: int) -> DataFrame:
    per_item = (
        sales(spark, rows)
        .join(items(spark), "item_key")
        .groupBy("category", "item_key")
        .agg(F.sum(revenue()).alias("r"))
    )
    w = Window.partitionBy("category")
    shares = per_item.withColumn("permille", (F.col("r") * 1000 / F.sum("r").over(w)).cast("long"))
    return shares.groupBy("category").agg(F.max("permille"), F.sum("permille"), F.count("*"))


def store_pairs(spark: SparkSession, rows: int) -> DataFrame:
    """Both sides of a join shuffled in full: sales against themselves, a day apart."""
    s = sales(spark, rows).select("sale_id", "store_key", "quantity")
    later = s.select((F.col("sale_id") - DAYS).alias("sale_id"), F.col("quantity").alias("q2"))
    return s.join(later, "sale_id").groupBy("store_key").agg(F.sum(F.col("quantity") * F.col("q2")), F.count("*"))


QUERIES: dict[str, Callable[[SparkSession, int], DataFrame]] = {
    q.__name__: q
    for q in (
        revenue_by_year_region,
        top_items_per_category,
        customer_segments,
        distinct_customers_per_month,
        monthly_growth,
        hot_customer_join,
        basket_sizes,
        region_brand_rollup,
        best_sellers,
        repeat_buyers,
        category_share,
        store_pairs,
    )
}
