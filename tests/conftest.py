"""Session-wide fixtures: the Spark plugin jar, the built-in shuffle's results for tests/spark_jobs.py, and the
shuffled image; and the rules for async tests: each runs on uvloop and has a deadline (tests/aio.py)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import uvloop

from tests.aio import deadline_of


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, Callable[[], Any]]:
    """Every async test and async fixture runs on a uvloop loop, as `shuffled serve` does (uvloop.run), so
    daemons started in this process run on the loop they run on in production."""
    return {"uvloop": uvloop.new_event_loop}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuses a run with an async test that has no deadline (tests/aio.py `within`): it would hang until
    pytest-timeout interrupts it, past any cleanup of its own."""
    missing = [
        item.nodeid
        for item in items
        if isinstance(item, pytest.Function)
        and inspect.iscoroutinefunction(item.function)
        and deadline_of(item.function) is None
    ]
    if missing:
        raise pytest.UsageError(
            "async tests without a deadline (decorate them with tests.aio.within(seconds)): " + ", ".join(missing)
        )


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
