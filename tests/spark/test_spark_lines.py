"""Every Spark line the plugin supports besides the installed one (on which the whole Spark suite runs):
the plugin built for that line from the same sources (its version layer: client/jvm/src/compat), a job
matrix on that Spark through shuffled equal to its own built-in shuffle (tests/spark/spark_line_job.py), and
a jar of another line refused when that Spark starts.

Each line's pyspark (the newest release of the line) is installed once into a virtual environment of its
own (tests/spark_lines.py, kept between runs); where it cannot be installed (no package index), the line
is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled import spark_jar
from tests import spark_lines
from tests.cluster import DaemonProcess, free_port, start_daemon
from tests.spark_lines import OTHER_LINES, LineEnv
from tests.spark_support import daemon_stats, needs_spark

pytestmark = [needs_spark, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=OTHER_LINES)
def line_env(request: pytest.FixtureRequest) -> LineEnv:
    return spark_lines.line_env(request.param)


@pytest.fixture
def daemon() -> Iterator[list[DaemonProcess]]:
    """One daemon without a data dir, in a list: the test replaces it by a new one without the data."""
    host = "127.0.0.1"
    held = [start_daemon(host, free_port([host]), "64M", ["--data-dir", "none"])]
    yield held
    for d in held:
        d.stop()


#: bound of each wait for the job's next JSON line (its sessions start JVMs and run several jobs)
JOB_STEP_SECONDS = 240


def _job(env: LineEnv, address: str) -> subprocess.Popen[str]:
    # local-cluster's workers keep their executors' logs under the line's pyspark (its SPARK_HOME's work/;
    # SPARK_WORKER_DIR is read only by a worker started on its own)
    return subprocess.Popen(
        [str(env.python), "-m", "tests.spark.spark_line_job", str(env.jar), address],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _json_lines(proc: subprocess.Popen[str]) -> Iterator[dict[str, Any]]:
    """The job's JSON lines, each within JOB_STEP_SECONDS (a hung job fails the test, not the suite's budget).

    A thread reads stdout, so the wait has a deadline whatever the pipe's buffering does."""
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout

    def pump() -> None:
        for line in stdout:
            lines.put(line)
        lines.put("")  # end of output

    threading.Thread(target=pump, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=JOB_STEP_SECONDS)
        except queue.Empty:
            raise AssertionError(f"the job printed nothing within {JOB_STEP_SECONDS} s") from None
        if not line:
            raise AssertionError(f"the job printed no result (exit code {proc.wait(60)})")
        if line.startswith("{"):
            yield json.loads(line)


@pytest.mark.full  # a minute and more per line: run by .ci/run after the default run
def test_job_matrix_on_the_line_matches_its_builtin_shuffle(line_env: LineEnv, daemon: list[DaemonProcess]) -> None:
    assert line_env.jar.name.startswith(f"shuffled-spark-{line_env.line}_")
    proc = _job(line_env, daemon[0].addr)
    results = _json_lines(proc)
    try:
        assert next(results) == {"ready": True}
        # The shuffle's map output is in the daemon: replace it by one that has none of it.
        first = daemon.pop()
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        daemon.append(start_daemon(first.host, first.port, "64M", ["--data-dir", "none"]))
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out = next(results)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out["version"].startswith(line_env.line)
    assert out["plugin"] == out["builtin"]
    if spark_jar.has_row_checksums(line_env.line):
        assert all(c != 0 for run in out["builtin"]["row_checksums"] for c in run), out["builtin"]["row_checksums"]
    sums: dict[int, int] = {}
    for i in range(20_000):
        sums[i % 53] = sums.get(i % 53, 0) + i
    expected = [list(kv) for kv in sorted(sums.items())]
    assert out["reread"] == [expected, expected]
    assert daemon_stats(daemon[0])["store"]["commits"] > 0, "the lost map output was not recomputed"


def _start_session(python: Path, jar: Path) -> subprocess.CompletedProcess[str]:
    """Start a Spark session with the plugin jar in the pyspark of ``python``."""
    code = (
        "import sys; from tests import spark_jobs\n"
        "spark_jobs.session('local[1]', {'spark.jars': sys.argv[1],"
        " 'spark.shuffle.manager': 'io.shuffled.spark.ShuffledShuffleManager'})\n"
    )
    return subprocess.run(
        [str(python), "-c", code, str(jar)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_jar_of_another_line_is_refused_at_start(line_env: LineEnv, plugin_jar: Path) -> None:
    """This line's jar in the installed Spark, and the installed line's jar in this line's Spark: neither
    session starts, and the plugin names both versions and the jar to build (its shuffle manager extends
    SortShuffleManager, which every line has, so the check runs before anything that differs is touched)."""
    installed = spark_jar.find_spark()
    line = spark_jar.find_spark(line_env.spark_home)

    in_installed = _start_session(Path(sys.executable), line_env.jar)
    assert in_installed.returncode != 0
    assert (
        f"this plugin jar was built for Spark {line.line} (Scala {line.scala}), "
        f"but this is Spark {installed.version} (Scala {installed.scala})"
    ) in in_installed.stderr, in_installed.stderr[-3000:]

    in_line = _start_session(line_env.python, plugin_jar)
    assert in_line.returncode != 0
    assert f"this plugin jar was built for Spark {installed.line}" in in_line.stderr, in_line.stderr[-3000:]
