"""Session-wide fixtures: the Spark plugin jar, the built-in shuffle's results for tests/spark_jobs.py, and the
shuffled image."""

from __future__ import annotations

from collections.abc import Iterator
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


@pytest.fixture(scope="session")
def image(plugin_jar: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The Dockerfile built once per run with podman (tests/image.py), with every Spark line's pyspark
    mounted into the build; skipped with the reason where podman cannot run."""
    from tests import image as podman_image
    from tests import spark_lines

    why = podman_image.unavailable()
    if why is not None:
        pytest.skip(f"no podman: {why}")
    built = podman_image.build(spark_lines.every_line(plugin_jar), tmp_path_factory.mktemp("image"))
    yield built
    built.remove()
