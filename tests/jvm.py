"""What the JVM tests share: skip without a JDK, and the Java checks' summary line."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from shuffled import spark_jar

#: last line printed by the Java check programs
SUMMARY = re.compile(r"(\d+) passed, (\d+) failed")


def _have_javac() -> bool:
    try:
        spark_jar.find_tool("javac")
    except spark_jar.JvmBuildError:
        return False
    return True


needs_jdk = pytest.mark.skipif(
    not _have_javac(), reason="javac not found: install openjdk-17-jdk-headless to build and test the JVM client"
)


def run_checks(main_class: str, *jars: Path, timeout: float = 60) -> tuple[int, str]:
    """Runs a Java check program (`io.shuffled.client.Checks`' lines) on `jars` and Spark's; returns how many
    checks passed and its output, failing the test on any failed check or a missing summary."""
    cmd = [spark_jar.find_tool("java"), "-cp", spark_jar.classpath(*jars), main_class]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    m = SUMMARY.fullmatch(lines[-1]) if lines else None
    assert proc.returncode == 0 and m and m.group(2) == "0", proc.stdout + proc.stderr
    return int(m.group(1)), proc.stdout
