"""Session-wide fixtures: the Spark plugin jar, the built-in shuffle's results for tests/spark_jobs.py, and the
shuffled image; the rules for async tests: each runs on uvloop and has a deadline (tests/aio.py); and the
session's reaper (tests/reaper.py)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import uvloop

from tests.aio import deadline_of

#: how long the session's end waits for what it stopped last to be gone before it counts it as left behind
LEFT_BEHIND_WAIT = 10.0


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, Callable[[], Any]]:
    """Every async test and async fixture runs on a uvloop loop, as `shuffled serve` does (uvloop.run), so
    daemons started in this process run on the loop they run on in production."""
    return {"uvloop": uvloop.new_event_loop}


def pytest_sessionstart(session: pytest.Session) -> None:
    """The session's run (tests/reaper.py) from the start, so that every process the tests start carries its
    mark and nothing the session makes outlives it, even if it is killed; what killed sessions before it
    left is removed first."""
    from tests import reaper

    if reaper.supported():
        reaper.current()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fails the session if anything it started is still there at its end (every fixture torn down): the reaper
    would remove it when the session exits, but it is a leak in a harness, and a killed run would leave it."""
    from tests import reaper

    run = reaper.made()
    if run is None:
        return
    _stop_spark_gateway()
    left = run.left_behind(LEFT_BEHIND_WAIT)
    if left:
        print(f"\nthe session left these behind ({LEFT_BEHIND_WAIT:.0f} s after its end):", *left, sep="\n  ")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _stop_spark_gateway() -> None:
    """PySpark's JVM (one per process, started by the first session, kept for the next) ends when its standard
    input closes; the only process of the session that is meant to live until the session's end."""
    pyspark = sys.modules.get("pyspark")
    gateway = getattr(getattr(pyspark, "SparkContext", None), "_gateway", None)
    proc = getattr(gateway, "proc", None)
    if gateway is not None and proc is not None and proc.poll() is None:
        gateway.shutdown()
        proc.stdin.close()
        proc.wait(60)


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
