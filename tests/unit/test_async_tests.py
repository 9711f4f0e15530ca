"""The rules for async tests (tests/aio.py, tests/conftest.py): they run on uvloop, a test past its deadline
fails naming it, and a run with an async test that has no deadline is refused."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import uvloop

from tests.aio import deadline_of, run, within

ROOT = Path(__file__).resolve().parents[2]


@within(5)
async def test_async_tests_and_their_fixtures_run_on_uvloop() -> None:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
    assert deadline_of(test_async_tests_and_their_fixtures_run_on_uvloop) == 5


def test_run_gives_async_code_in_a_sync_test_a_uvloop_loop_and_the_deadline() -> None:
    async def loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    assert isinstance(run(loop(), 5), uvloop.Loop)
    with pytest.raises(TimeoutError):
        run(asyncio.Event().wait(), 0.05)


@within(5)
async def test_a_test_past_its_deadline_fails_naming_it_and_its_finally_clauses_run() -> None:
    cleaned = asyncio.Event()

    async def test_hangs() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    with pytest.raises(TimeoutError, match=r"^test_hangs did not finish within 0.05 s$"):
        await within(0.05)(test_hangs)()
    assert cleaned.is_set()


@within(5)
async def test_a_timeout_of_the_test_itself_is_not_taken_for_the_deadline() -> None:
    async def test_times_out() -> None:
        await asyncio.wait_for(asyncio.Event().wait(), 0.01)

    with pytest.raises(TimeoutError) as raised:
        await within(5)(test_times_out)()
    assert "did not finish within" not in str(raised.value)


def test_a_run_with_an_async_test_without_a_deadline_is_refused(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "test_some.py").write_text(
        "import pytest\n"
        "from tests.aio import within\n\n"
        "@within(5)\nasync def test_bounded() -> None:\n    pass\n\n"
        "@pytest.mark.asyncio\nasync def test_unbounded() -> None:\n    pass\n\n"
        "def test_sync() -> None:\n    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "async tests without a deadline" in done.stderr and "test_some.py::test_unbounded" in done.stderr
    assert "test_bounded" not in done.stderr
