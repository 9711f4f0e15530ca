"""Async tests: `@within(seconds)` makes a coroutine function a pytest-asyncio test bounded by a deadline of
its own, so a hang fails that test at its deadline, named, with its awaits cancelled (its `finally` clauses
stop what it started), rather than at pytest-timeout's limit, which interrupts it wherever it is;
`tests/conftest.py` refuses to collect an async test without one, and runs every async test on uvloop,
the event loop the daemons run on in production. `run` is the same for async code in a sync test (a
Hypothesis example, a thread of its own)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import pytest
import uvloop

P = ParamSpec("P")
T = TypeVar("T")
AsyncTest = Callable[P, Coroutine[Any, Any, None]]

#: the attribute `within` sets on the test it wraps: its deadline in seconds
DEADLINE = "deadline_seconds"


def within(seconds: float) -> Callable[[AsyncTest[P]], AsyncTest[P]]:
    """Run the test on pytest-asyncio's loop and fail it with a TimeoutError naming the deadline once it has
    run for `seconds` (its awaits are cancelled, so its `finally` clauses still stop what it started)."""

    def mark(test: AsyncTest[P]) -> AsyncTest[P]:
        @functools.wraps(test)
        async def bounded(*args: P.args, **kwargs: P.kwargs) -> None:
            try:
                async with asyncio.timeout(seconds) as deadline:
                    await test(*args, **kwargs)
            except TimeoutError as exc:
                if deadline.expired():
                    raise TimeoutError(f"{test.__name__} did not finish within {seconds} s") from exc
                raise

        setattr(bounded, DEADLINE, seconds)
        return pytest.mark.asyncio(bounded)

    return mark


def deadline_of(test: object) -> float | None:
    """The deadline `within` gave this test function, None if it has none."""
    seconds = getattr(test, DEADLINE, None)
    return seconds if isinstance(seconds, (int, float)) else None


def run(main: Coroutine[Any, Any, T], seconds: float) -> T:
    """`main`'s result, run on a uvloop loop of its own within `seconds`."""
    return uvloop.run(asyncio.wait_for(main, seconds))
