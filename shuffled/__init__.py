"""shuffled: a shuffle service for Apache Spark with Flink-style credit-based flow control."""

__version__ = "0.1.0"
