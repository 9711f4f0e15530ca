"""Session-wide fixtures: the Spark plugin jar and the built-in shuffle's results for tests/spark_jobs.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def plugin_jar() -> Path:
    from shuffled import spark_jar

    return spark_jar.build_jar()


@pytest.fixture(scope="session")
def builtin(plugin_jar: Path) -> dict[str, Any]:
    """Computed once per run, before any plugin session starts in this process's JVM."""
    from tests.spark_support import builtin_results

    return builtin_results(plugin_jar)
