"""Shuffles far larger than the daemons' memory, through real Spark: every daemon spills while map tasks push
concurrently, and every job gives exactly what Spark's built-in shuffle gives in the same run.

Two daemons with 4 MiB pools each serve ``local[4]`` with tasks spread over both: two map tasks push into each
daemon at once (their chunks interleave in its spill files), reads cross the peer connection, and disk and
memory mix inside one (partition, attempt) pair. Each job's shuffle is at least eight times the sum of the
pools (checked from Spark's own metrics), and per job the daemons must have committed exactly the bytes
Spark's map tasks wrote and served exactly the bytes its reducers read. Results are small digests of large
outputs (row counts, sums and order-independent hashes per group), so they compare exactly without collecting
hundreds of megabytes into Python. ``python -m benchmarks scale`` runs a long session of star-schema
queries at full size.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import spark_jobs
from tests.cluster import DaemonProcess
from tests.spark_support import daemons_fixture, job_traffic, needs_spark, plugin_conf

pytestmark = [needs_spark, pytest.mark.timeout(600)]

POOL_MIB = 4
DAEMONS = 2


@pytest.fixture(scope="module")
def builtin_scale(plugin_jar: Path) -> dict[str, Any]:
    spark = spark_jobs.session("local[2]", {"spark.jars": str(plugin_jar)})
    try:
        return {name: job(spark) for name, job in spark_jobs.SCALE_JOBS.items()}
    finally:
        spark.stop()


daemons = daemons_fixture(["127.0.0.12", "127.0.0.13"], pool_size=f"{POOL_MIB}M")


@pytest.fixture(scope="module")
def spark(builtin_scale: dict[str, Any], plugin_jar: Path, daemons: list[DaemonProcess]) -> Iterator[Any]:
    session = spark_jobs.session("local[4]", plugin_conf(plugin_jar, daemons, "task"))
    yield session
    session.stop()


@pytest.mark.parametrize("name", list(spark_jobs.SCALE_JOBS))
def test_shuffle_eight_times_the_pools_spills_everywhere_and_matches_builtin(
    spark: Any, builtin_scale: dict[str, Any], daemons: list[DaemonProcess], name: str
) -> None:
    with job_traffic(spark, daemons) as traffic:
        result = spark_jobs.SCALE_JOBS[name](spark)
    assert result == builtin_scale[name]
    pools = DAEMONS * POOL_MIB << 20
    assert traffic.spark_written >= 8 * pools, f"shuffle of {traffic.spark_written} bytes is not 8x the pools"
    spilled = [d["disk"]["spills"] for d in traffic.daemon_deltas]
    assert all(n > 0 for n in spilled), f"a daemon did not spill: {spilled}"
