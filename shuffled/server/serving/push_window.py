"""The memory a push's writer may fill: its credit window.

A window is a LocalPool whose promised segments are exactly the writer's unused credit. It gets its
guaranteed floor (`push-min`) before the first credit, and grows toward `push-window` only while its
connection, its application and all windows' extras are within their shares (accounting/shares.py); it
never waits for memory beyond its floor: when it may not grow it keeps what it has, and its next push asks
again. While the spiller works above its high watermark it takes no new memory at all (`Spiller.admitted`).
A writer whose window is empty waits for memory, and the wait is bounded: memory that can never come fails
the push at once (`spill.push_memory_error`), and any wait ends at `push-wait-timeout`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ...buffers import LocalPool
from ...protocol.errors import ShuffledError, StorageError
from ..accounting.shares import Share
from ..storage.writer import MapOutputWriter
from .environment import ShuffleEnvironment


class PushWindow:
    def __init__(
        self,
        env: ShuffleEnvironment[Any],
        conn_share: Share | None,
        out: MapOutputWriter,
        fail: Callable[[ShuffledError], None],
        refilled: Callable[[], None],
    ) -> None:
        self.env = env
        self.out = out
        self._fail = fail
        self._refilled = refilled
        self.pool: LocalPool | None = None
        #: the floor of this window is reserved in its shares until `close`
        self.shares = env.shares
        self.conn_share = conn_share
        self.app_share = self.shares.reserve(conn_share, out.app)
        #: segments beyond the floor charged to those shares
        self._extras = 0
        self._released = False
        #: monotonic time since when the writer waits for memory with no credit left (None: not waiting)
        self.waiting_since: float | None = None
        self._waiting: asyncio.Task[None] | None = None

    async def open(self) -> bool:
        """The guaranteed floor: no credit until it is free (the wait is counted, and bounded by `check_wait`).
        False when the window was closed meanwhile: the floor goes back at once."""
        cfg = self.env.config
        self.waiting_since = time.monotonic()
        try:
            pool = await self.env.pool.create_local_pool(cfg.push_min, cfg.push_window, holder=self.out.app)
        finally:
            self._stop_waiting()
        if self._released:
            pool.destroy()
            return False
        self.pool = pool
        return True

    def fill(self) -> int:
        """Grow the pool toward its target as the shares allow; the free segments not yet promised."""
        pool = self.pool
        assert pool is not None
        self._charge()  # pushed data left the window since
        if not self.out.holding():  # its floor always, beyond it as far as the shares have room
            floor = max(0, pool.min - pool.size)
            if pool.grow(floor + self.shares.room(self.conn_share, self.app_share)):
                self._charge()
        return pool.available - pool.promised

    def wait_if_empty(self) -> None:
        """No credit left and below the floor: wait for memory, then refill."""
        pool = self.pool
        assert pool is not None
        if pool.available == 0 and pool.size < pool.min and self._waiting is None and not self.hopeless():
            self._waiting = asyncio.create_task(self._wait_for_memory())
            self.waiting_since = time.monotonic()

    def _charge(self) -> None:
        """Keep the shares' count of this window's segments beyond its floor up to date."""
        pool = self.pool
        extras = max(0, pool.size - pool.min) if pool is not None else 0
        if extras != self._extras:
            self.shares.charge(self.conn_share, self.app_share, extras - self._extras)
            self._extras = extras

    def hopeless(self) -> bool:
        """Fail the push now if the memory it would wait for can never come (see `spill.push_memory_error`)."""
        need = self.env.config.push_min if self.pool is None else 1
        error = self.out.memory_error(need)
        if error is not None:
            self._fail(error)
        return error is not None

    def check_wait(self) -> None:
        """A wait that began while memory could still come: end it if that is no longer so, or once it took
        `push-wait-timeout` (memory that reads or other windows hold comes back only as their parties go on,
        which a party may never do: every writer gets memory or an error)."""
        if self.waiting_since is None or self.hopeless():
            return
        waited, env = time.monotonic() - self.waiting_since, self.env
        if waited >= env.config.push_wait_timeout:
            held = env.storage.memory_held()
            self._fail(StorageError(f"no memory for this push after {waited:.0f} s (push-wait-timeout): {held}"))

    async def _wait_for_memory(self) -> None:
        assert self.pool is not None
        try:
            await self.out.admitted()
            await self.pool.grow_wait()
        finally:
            self._waiting = None
            self._stop_waiting()
        self._refilled()

    def waiting_for(self, now: float) -> float:
        """Seconds the writer has been waiting for memory so far."""
        return now - self.waiting_since if self.waiting_since is not None else 0.0

    def _stop_waiting(self) -> None:
        self.env.counters.push_wait_seconds += self.waiting_for(time.monotonic())
        self.waiting_since = None

    def close(self) -> None:
        """The push ended: its floor and extras leave the shares, its memory goes back."""
        if not self._released:
            self._released = True
            self.shares.release(self.conn_share, self.out.app, self.app_share, self._extras)
            self._extras = 0
        if self._waiting is not None:
            self._waiting.cancel()
        self._stop_waiting()
        if self.pool is not None:
            self.pool.destroy()
            self.pool = None
