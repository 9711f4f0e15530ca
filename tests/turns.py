"""Waiting in unit tests for what the event loop does without I/O, by loop turns rather than by time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool], turns: int = 100) -> None:
    """Let the event loop run until `condition` holds; fail if it does not within `turns` turns."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")
