"""`shuffled spark-conf`, executors on the daemon's Unix socket, and what a PySpark user sees when the
daemon is not there."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests import spark_jobs
from tests.cluster import free_port, secret_flags, start_daemon
from tests.spark_support import job_traffic, needs_spark

pytestmark = needs_spark


def test_spark_conf_prints_settings_that_name_the_built_jar() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "shuffled", "spark-conf", "--submit", "--address", "unix:/run/shuffled.sock"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.splitlines()
    settings = dict(line.removeprefix("--conf ").split("=", 1) for line in out)
    assert settings["spark.shuffle.manager"] == "io.shuffled.spark.ShuffledShuffleManager"
    assert settings["spark.shuffle.sort.io.plugin.class"] == "io.shuffled.spark.ShuffledDataIO"
    assert settings["spark.shuffled.address"] == "unix:/run/shuffled.sock"
    assert Path(settings["spark.jars"]).is_file()
    assert "spark.executor.extraClassPath" not in settings  # Spark 4 loads the manager from spark.jars


def _spark_jar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shuffled", "spark-jar", *args], capture_output=True, text=True, timeout=300
    )


def test_spark_jar_for_a_spark_home_it_cannot_build_for_says_why(tmp_path: Path) -> None:
    """No jars/ (not a Spark distribution), and a Spark line the plugin has no version layer for."""
    missing = _spark_jar("--spark-home", str(tmp_path))
    assert missing.returncode == 1 and f"{tmp_path} is not a Spark distribution" in missing.stderr
    (tmp_path / "jars").mkdir()
    (tmp_path / "jars" / "spark-core_2.12-3.4.1.jar").touch()
    old = _spark_jar("--spark-home", str(tmp_path))
    assert old.returncode == 1
    assert "Spark 3.4.1 is not supported; the plugin builds for Spark 3.5, 4.0, 4.1, 4.2, 4.3" in old.stderr


def test_spark_conf_for_a_spark_35_jar_puts_it_on_the_class_path_too() -> None:
    """Spark 3.5 creates the shuffle manager before spark.jars are loaded (docs/spark.md)."""
    from shuffled import spark_jar

    jar = Path("/opt/shuffled/jars/shuffled-spark-3.5_2.12.jar")
    conf = spark_jar.spark_conf(jar, ["127.0.0.1:7337"])
    assert conf["spark.driver.extraClassPath"] == conf["spark.executor.extraClassPath"] == str(jar)


@pytest.mark.timeout(300)
def test_job_through_the_unix_socket(builtin: dict[str, Any], plugin_jar: Path, tmp_path: Path) -> None:
    """The deployment default: executors reach their daemon over a Unix socket (deploy/); with shm-dir set,
    they push through shared memory."""
    from shuffled import spark_jar

    sock = tmp_path / "shuffled.sock"
    flags = ["--unix-socket", str(sock), "--shm-dir", "/dev/shm"]
    daemon = start_daemon("127.0.0.10", free_port(["127.0.0.10"]), "64M", flags)
    try:
        spark = spark_jobs.session("local[2]", spark_jar.spark_conf(plugin_jar, [f"unix:{sock}"]))
        try:
            for name in ("rdd_reduce_by_key", "groupby_agg"):
                with job_traffic(spark, [daemon]) as traffic:
                    assert spark_jobs.JOBS[name](spark) == builtin[name]
                # the executors' pushes went through shared memory (PROTOCOL.md §6.3), none through the socket
                moved = traffic.daemon_deltas[0]["traffic"]
                assert moved["placed_buffers"] == moved["pushed_buffers"] > 0, moved
        finally:
            spark.stop()
    finally:
        daemon.stop()


@pytest.mark.timeout(300)
def test_job_without_a_daemon_fails_fast_with_the_reason(builtin: dict[str, Any], plugin_jar: Path) -> None:
    from py4j.protocol import Py4JJavaError

    from shuffled import spark_jar

    nobody = f"127.0.0.9:{free_port(['127.0.0.9'])}"
    spark = spark_jobs.session("local[2,2]", spark_jar.spark_conf(plugin_jar, [nobody]))
    try:
        with pytest.raises(Py4JJavaError, match=f"cannot connect to shuffled at {nobody}"):
            spark_jobs.rdd_reduce_by_key(spark)
    finally:
        spark.stop()


@pytest.mark.timeout(300)
def test_wrong_secret_fails_fast_and_the_right_one_runs(
    builtin: dict[str, Any], plugin_jar: Path, tmp_path: Path
) -> None:
    """A session whose spark.shuffled.secret differs from the daemons' secret-file stops at start, naming
    the reason; with the right secret (and an application secret) a job runs and gives Spark's results."""
    from py4j.protocol import Py4JJavaError

    from shuffled import spark_jar

    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "64M", secret_flags(tmp_path, "the-cluster-secret"))
    try:
        conf = {**spark_jar.spark_conf(plugin_jar, [d.addr]), "spark.shuffled.timeout": "30s"}
        started = time.monotonic()
        with pytest.raises(Py4JJavaError, match=r"shuffled: authentication with .* failed: .*the secrets differ"):
            spark_jobs.session("local[2]", {**conf, "spark.shuffled.secret": "not-the-secret"})
        assert time.monotonic() - started < 60
        d.logged('msg="authentication failed"')
        right = {**conf, "spark.shuffled.secret": "the-cluster-secret", "spark.shuffled.appSecret": "app-secret"}
        spark = spark_jobs.session("local[2]", right)
        try:
            assert spark_jobs.rdd_reduce_by_key(spark) == builtin["rdd_reduce_by_key"]
        finally:
            spark.stop()
    finally:
        d.stop()
