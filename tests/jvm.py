"""What the JVM tests share: skip without a JDK, and the Java checks' summary line."""

from __future__ import annotations

import re

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
