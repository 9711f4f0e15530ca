"""`spark.shuffled.fsync=commit`: an application gets its map outputs fsynced at commit from daemons that do not
sync (`--fsync none`, the default), as it would from `--fsync commit` ones; the daemon's sync counter, which
nothing else moves under `none`, shows the map tasks' commits asked for it (the refusal of a wrong value at
start is PluginCheck's, in test_spark_failures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuffled import spark_jar
from tests import spark_jobs
from tests.cluster import free_port, start_daemon
from tests.spark_support import PLUGIN_TIMEOUT, daemon_stats, needs_spark

pytestmark = [needs_spark, pytest.mark.timeout(180)]

HOST = "127.0.0.1"


def test_a_job_asking_for_fsync_at_commit_gets_its_map_outputs_synced(plugin_jar: Path) -> None:
    d = start_daemon(HOST, free_port([HOST]), "128M")  # with the test run's data dir, and no --fsync
    try:
        assert daemon_stats(d)["disk"]["syncs"] == 0
        conf = {
            **spark_jar.spark_conf(plugin_jar, [d.addr]),
            "spark.shuffled.timeout": PLUGIN_TIMEOUT,
            "spark.shuffled.fsync": "commit",
        }
        spark = spark_jobs.session("local[2]", conf)
        try:
            # spark_jobs._pairs: (i % 53, i) for i < 20 000, in 4 map tasks
            assert spark_jobs.rdd_reduce_by_key(spark) == [(k, sum(range(k, 20_000, 53))) for k in range(53)]
            stats = daemon_stats(d)
            assert stats["store"]["commits"] >= 4, stats["store"]
            assert stats["disk"]["syncs"] > 0 and stats["disk"]["sync_failures"] == 0, stats["disk"]
        finally:
            spark.stop()
    finally:
        d.stop()
