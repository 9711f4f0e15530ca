"""Spark SQL's rows reach the plugin's writer uncopied, and every writer path still writes them exactly, on every
Spark line the plugin supports.

The plugin's shuffle manager extends Spark's ``SortShuffleManager``, so ``ShuffleExchangeExec`` no longer copies
each row for it (it copies for any other manager): the writer gets one mutable row, rewritten for each record.
The unsorted and serialized paths serialize it before the next arrives; Spark's sorter, which keeps records as
objects (IO encryption, a codec whose streams do not concatenate, map-side combine), gets copies
(``RowCopies``). tests/spark/rows_job.py runs the same jobs on the built-in shuffle and under each
configuration (see there); without the copy the sorter's sessions return wrong rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled import spark_jar
from tests import spark_lines
from tests.cluster import DaemonProcess, free_port, start_daemon
from tests.spark.rows_job import SESSIONS
from tests.spark_support import needs_spark

pytestmark = [needs_spark, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
#: the installed line first: a line whose pyspark cannot be installed is skipped, not the whole test; the
#: other lines (a minute and a half each) are part of the `full` matrix, as their job matrices are
LINES = [
    spark_lines.installed_line(),
    *(pytest.param(line, marks=pytest.mark.full) for line in spark_lines.OTHER_LINES),
]


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    host = "127.0.0.1"
    d = start_daemon(host, free_port([host]), "64M", ["--data-dir", "none"])
    yield d
    d.stop()


def _jars(line: str, plugin_jar: Path) -> tuple[Path, Path, Path]:
    """(python, plugin jar, tests jar) of a line: the installed one's or its own venv's."""
    if line == spark_lines.installed_line():
        return Path(sys.executable), plugin_jar, spark_jar.build_test_classes()
    env = spark_lines.line_env(line)
    return env.python, env.jar, spark_jar.build_test_classes(env.jar.parent, spark_home=env.spark_home)


@pytest.mark.parametrize("line", LINES)
def test_sql_rows_on_every_writer_path_match_builtin(line: str, plugin_jar: Path, daemon: DaemonProcess) -> None:
    python, jar, tests_jar = _jars(line, plugin_jar)
    done = subprocess.run(
        [str(python), "-m", "tests.spark.rows_job", str(jar), str(tests_jar), daemon.addr],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["version"].startswith(line)
    sessions = out["sessions"]
    assert set(sessions) == set(SESSIONS)
    for name, session in sessions.items():
        assert session["sort_manager"], f"{name}: Spark SQL would copy every row for this shuffle manager"
        for job, result in session["results"].items():
            assert result == out["builtin"][job], f"{name}: {job} differs from the built-in shuffle"
    paths = {name: session["paths"] for name, session in sessions.items()}
    # The paths each configuration must have taken (other jobs may add to them: only what must be is checked).
    assert paths["default"]["unsorted"] > 0 and paths["default"]["serialized"] > 0, paths
    for fallback in ("io_encryption", "io_encryption_uncompressed", "opaque_codec"):
        assert paths[fallback]["serialized"] == 0 and paths[fallback]["sorted"] >= 8, paths
    assert all(p["sorted"] >= 8 for p in paths.values()), paths  # the RDD jobs' map-side combine
