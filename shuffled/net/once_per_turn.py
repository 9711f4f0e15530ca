"""Run a callback once at the next turn of the event loop, however often it is asked for.

Credit announcements and the send loop both want this: many events in one loop
turn (frames decoded from one read, buffers recycled in one batch) should cost
one AddCredit, one PushCredit or one flush, carrying everything accumulated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class OncePerTurn:
    __slots__ = ("_fn", "_loop", "_scheduled")

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn = fn
        self._scheduled = False
        #: the loop of the first call, kept: asking for the running loop costs a getpid() system call
        #: each time, about 2 % of a relaying daemon's time when done per buffer
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        self._fn()
