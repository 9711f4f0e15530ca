"""A daemon that stops answering or vanishes while Spark reads from it: a fetch failure naming that daemon,
a recompute, and the exact result; plus the plugin's small rules checked inside the JVM (PluginCheck).

One daemon on 127.0.0.14 serves ``local[2,4]`` with a short plugin timeout, so a silent daemon is noticed
within seconds. Each test computes a shuffle once (its map output lands in the daemon), breaks the daemon
and reads the shuffle again. The reads must end in a ``FetchFailed`` that blames ``shuffled@<daemon>``
(never a task kill, never ``shuffled@unreachable``, which would remove no map output). The test repairs
the daemon as soon as the failure shows; Spark's rerun of the map stage may start before the daemon is
back, and its tasks wait for it (up to the plugin's timeout) instead of failing four times at once.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from shuffled import spark_jar
from tests import spark_jobs
from tests.cluster import DaemonProcess, poll_until
from tests.jvm import run_checks
from tests.spark_support import (
    daemons_fixture,
    needs_spark,
    plugin_conf,
    restart,
    session_fixture,
    stage_data,
)

pytestmark = [needs_spark, pytest.mark.timeout(300)]

PLUGIN_TIMEOUT_S = 4
FAILURE_WAIT_S = 60  # a fetch failure must show up well within this (timeout + task start-up)


daemons = daemons_fixture(["127.0.0.14"])

spark = session_fixture("local[2,4]", "task", {"spark.shuffled.timeout": f"{PLUGIN_TIMEOUT_S}s"})


def fetch_failures(spark: Any) -> list[str]:
    """Error messages of every task that failed with a fetch failure so far.

    Spark's own ``MetadataFetchFailedException`` ("Missing an output location") is left out: a task that
    starts after the first fetch failure has removed the daemon's map output fails with it before it
    reaches the plugin, with the built-in shuffle too, and it names no location.
    """
    store = spark.sparkContext._jsc.sc().statusStore()
    messages = []
    for s in stage_data(spark):
        tasks = store.taskList(s.stageId(), s.attemptId(), 10_000)
        for t in (tasks.apply(i) for i in range(tasks.size())):
            error = t.errorMessage()
            if error.isDefined() and "FetchFailed" in error.get() and "MetadataFetchFailed" not in error.get():
                messages.append(error.get())
    return messages


def sums(spark: Any) -> Any:
    data = spark.sparkContext.parallelize([(i % 53, i) for i in range(20_000)], 4)
    return data.reduceByKey(lambda a, b: a + b)


def read_through_failure(
    spark: Any, job: Any, break_daemon: Callable[[], None], repair: Callable[[], None]
) -> tuple[list[Any], list[str]]:
    """Runs ``job`` again in the background; once a fetch failure shows, repairs the daemon and lets the
    rerun go on. Returns the result and the fetch failures this read caused."""
    before = len(fetch_failures(spark))
    break_daemon()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(lambda: sorted(job.collect()))
        try:
            poll_until(lambda: len(fetch_failures(spark)) > before or running.done(), FAILURE_WAIT_S, "a fetch failure")
        finally:
            repair()
        result = running.result(timeout=180)
    return result, fetch_failures(spark)[before:]


def test_shuffle_block_decommissioning_is_refused_at_start(
    builtin: dict[str, Any], plugin_jar: Path, daemons: list[DaemonProcess]
) -> None:
    """A session that asks to migrate shuffle blocks does not start: there are none in the executors.

    First in this module, before its session starts (getOrCreate would return that one); after ``builtin``,
    whose session starts the JVM (the first session's settings become the JVM's system properties, which
    would carry the refused setting into every later session).
    """
    conf = plugin_conf(plugin_jar, daemons, "task")
    conf["spark.storage.decommission.shuffleBlocks.enabled"] = "true"
    with pytest.raises(Exception, match=re.escape("spark.storage.decommission.shuffleBlocks.enabled=false")):
        spark_jobs.session("local[2]", conf)


def test_daemon_that_stops_answering_is_a_fetch_failure_naming_it(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess]
) -> None:
    """SIGSTOP: connections stay open and nothing comes back; the read times out after the plugin's
    timeout. That is lost data from Spark's point of view (a fetch failure), not a killed task: treated
    as a kill it would cost four task failures and abort the job."""
    job = sums(spark)
    assert sorted(job.collect()) == builtin["rdd_reduce_by_key"]
    daemon = daemons[0]
    result, failures = read_through_failure(
        spark,
        job,
        lambda: daemon.proc.send_signal(signal.SIGSTOP),
        lambda: daemon.proc.send_signal(signal.SIGCONT),
    )
    assert result == builtin["rdd_reduce_by_key"]
    assert failures, "the read did not end in a fetch failure"
    assert all(f"shuffled@{daemon.addr}" in f for f in failures), failures


def test_no_daemon_reachable_blames_the_tasks_own_daemon(
    spark: Any, builtin: dict[str, Any], daemons: list[DaemonProcess]
) -> None:
    """SIGKILL: every connection is refused. The fetch failure must name the task's configured daemon, so
    that Spark forgets (and recomputes) the map output that was there; the rerun's map tasks wait for
    the restarted daemon."""
    job = sums(spark)
    assert sorted(job.collect()) == builtin["rdd_reduce_by_key"]
    victim = daemons[0]

    def kill_victim() -> None:
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)

    def restart_victim() -> None:
        daemons[0] = restart(victim, daemons)

    result, failures = read_through_failure(spark, job, kill_victim, restart_victim)
    assert result == builtin["rdd_reduce_by_key"]
    assert failures, "the read did not end in a fetch failure"
    assert not any("unreachable" in f for f in failures), failures
    assert all(f"shuffled@{victim.addr}" in f for f in failures), failures


def test_plugin_rules_inside_the_jvm(plugin_jar: Path) -> None:
    """Fetch wait summed in nanoseconds (sub-millisecond waits add up), the refused Spark settings, the range of
    spark.shuffled.replicas and the values of spark.shuffled.durability and spark.shuffled.fsync (a wrong one
    refused with the key named), spark.shuffled.daemonChoice and spark.shuffled.compression (their values and errors
    word for word; spark.shuffle.compress=false over the latter, what in a daemon's stats or the application's
    settings makes `auto` compress, and the mark of an uncompressed output kept through a serialized map status), the
    Spark line written into the jar (accepted by its own Spark, refused by another), and a writer stopped as a success
    before it committed (it throws)."""
    passed, out = run_checks("io.shuffled.spark.PluginCheck", plugin_jar, spark_jar.build_test_classes())
    assert passed == 32, out
