"""Each supported Spark line's pyspark in a virtual environment of its own, and the plugin built for it:
shared by the line tests (tests/spark/test_spark_lines.py) and the image build (tests/image.py), which
mounts these pysparks into the build instead of downloading them again.

Each line's pyspark (the newest release of the line) is installed once into ``$SHUFFLED_SPARK_LINES/<line>``
(default ``~/.cache/shuffled/spark-lines``), kept between runs; where it cannot be installed (no package
index), whoever asked is skipped with the reason. Delete the directory to reinstall.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from shuffled import spark_jar

CACHE = Path(os.environ.get("SHUFFLED_SPARK_LINES", Path.home() / ".cache" / "shuffled" / "spark-lines"))


def installed_line() -> str:
    """The line of the pyspark this interpreter has ("" if none)."""
    try:
        return spark_jar.find_spark().line
    except spark_jar.JvmBuildError:
        return ""


OTHER_LINES = [line for line in spark_jar.LINES if line != installed_line()]


@dataclass
class LineEnv:
    line: str
    python: Path
    spark_home: Path  # the pyspark package: its jars/ are that Spark's
    jar: Path  # the plugin built for this line


def _pip_spec(line: str) -> str:
    major, minor = line.split(".")
    return f"pyspark>={line},<{major}.{int(minor) + 1}"


def line_env(line: str) -> LineEnv:
    """The line's venv (installed on first use) and its plugin jar, kept beside the venv: build_jar reuses
    it only if built from these very sources. Runs at once (another tree's tests) take turns on a line, by a
    lock beside its venv, so that none uses or builds a venv another is installing."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{line}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _line_env(line)


def _line_env(line: str) -> LineEnv:
    venv = CACHE / line
    python = venv / "bin" / "python"
    ready = venv / "ready"
    if not ready.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
        pip = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", _pip_spec(line)], capture_output=True, text=True, timeout=600
        )
        if pip.returncode != 0:
            pytest.skip(f"cannot install {_pip_spec(line)}: {pip.stderr.strip()[-500:]}")
        ready.write_text(_pip_spec(line))
    where = subprocess.run(
        [str(python), "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    spark_home = Path(where.stdout.strip())
    return LineEnv(line, python, spark_home, spark_jar.build_jar(venv / "jars", spark_home=spark_home))


def every_line(installed_jar: Path) -> dict[str, LineEnv]:
    """Every supported line: the installed pyspark's (with ``installed_jar``, built for it) and the others'.
    The others are installed at once, each in a thread of its own: on a new machine each is a download of
    300-450 MB and a wheel built from it, minutes one after the other."""
    with ThreadPoolExecutor(max(1, len(OTHER_LINES))) as pool:
        lines = dict(zip(OTHER_LINES, pool.map(line_env, OTHER_LINES), strict=True))
    installed = installed_line()
    if installed:
        lines[installed] = LineEnv(installed, Path(sys.executable), spark_jar.pyspark_jars_dir().parent, installed_jar)
    return lines
