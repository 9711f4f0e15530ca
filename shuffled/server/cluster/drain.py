"""The drain: how a daemon stops without failing the work it took on (SIGTERM, SIGINT or the admin `drain`).

It runs once per process life, through its phases (stats `drain.state`): new pushes are refused
and open ones finish (*pushes*); committed data is handed over to other daemons (*copying*,
handover.py, when asked for); new reads from clients are refused and open ones finish
(*closing*). A peer's reads are still served while closing: they are cut when the daemon stops,
and the reader fails over to a copy. Every phase ends by the drain's deadline at the latest.
Waiting polls a few times a second: a drain runs once per process life and polling needs no
hook in every place a push or read can end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

from ...logs import event
from ...ops.stats import DrainStats

log = logging.getLogger(__name__)

#: seconds between checks whether a drain phase's work is done
DRAIN_POLL = 0.05


class DrainPhase(StrEnum):
    """Where the drain is; the value is what stats `drain.state` says."""

    SERVING = "serving"
    PUSHES = "pushes"
    COPYING = "copying"
    CLOSING = "closing"
    DONE = "done"


#: the work a drain waits for, over the daemon's connections: (map outputs being pushed, reads being served)
Work = Callable[[], tuple[int, int]]
#: the reads being served now, as a test of whether every one of them has ended since
OpenReads = Callable[[], Callable[[], bool]]
#: the hand-over (handover.py): counts into the drain's stats, True if it ended by the deadline
HandOverRun = Callable[[DrainStats, float], Awaitable[bool]]


class Drain:
    """The daemon's drain: `start` it (a second call gets the running one), follow it in `stats`."""

    def __init__(self, work: Work, open_reads: OpenReads, hand_over: HandOverRun) -> None:
        self.work = work
        self.open_reads = open_reads
        self.hand_over = hand_over
        #: the phase and what the hand-over did (stats `drain`)
        self.stats = DrainStats(state=DrainPhase.SERVING.value)
        self.task: asyncio.Task[bool] | None = None
        #: set when the drain starts, from a signal or the admin `drain`: the serve loop then waits for it
        self.started = asyncio.Event()
        #: set when the drain has ended: answers a `drain` with `wait` (`result`)
        self.ended = asyncio.Event()
        #: the tasks answering a `drain` with `wait`, which the daemon lets answer before it stops
        self.answering: set[asyncio.Task[object]] = set()

    @property
    def phase(self) -> DrainPhase:
        return DrainPhase(self.stats.state)

    @property
    def draining(self) -> bool:
        """New pushes are refused and readiness is false: the drain has started."""
        return self.phase is not DrainPhase.SERVING

    @property
    def closing(self) -> bool:
        """New reads from clients are refused (SHUTTING_DOWN); open ones finish."""
        return self.phase in (DrainPhase.CLOSING, DrainPhase.DONE)

    def start(self, timeout: float, handoff: bool) -> asyncio.Task[bool]:
        """Begin the drain once per process life; readiness fails and new pushes are refused from now
        on, before the caller hears back. The task's result: whether all of it was done within `timeout`."""
        if self.task is None:
            self._enter(DrainPhase.PUSHES)
            self.task = asyncio.create_task(self._run(timeout, handoff))
            self.started.set()
        return self.task

    def busy(self) -> tuple[int, int]:
        """Work a drain waits for: (open pushes, reads served or relayed)."""
        return self.work()

    async def _run(self, timeout: float, handoff: bool) -> bool:
        deadline = time.monotonic() + timeout
        pushes, reads = self.busy()
        event(log, "draining", timeout_s=timeout, handoff=handoff, pushes=pushes, reads=reads)
        done = await self._wait_until(lambda: self.busy()[0] == 0, deadline)
        if handoff:
            self._enter(DrainPhase.COPYING)
            done = await self.hand_over(self.stats, deadline) and done
        self._enter(DrainPhase.CLOSING)
        done = await self._wait_until(self.open_reads(), deadline) and done
        self._enter(DrainPhase.DONE)
        progress = self.stats
        progress.timed_out = not done
        self.ended.set()
        pushes, reads = self.busy()
        event(
            log,
            "drained" if done else "drain timed out",
            logging.INFO if done else logging.WARNING,
            pushes=pushes,
            reads=reads,
            to_copy=progress.to_copy,
            copied=progress.copied,
            copied_bytes=progress.copied_bytes,
            copy_failed=progress.failed,
            copy_short=progress.short,
        )
        return done

    async def result(self) -> dict[str, Any]:
        """How the drain ended, once it has (its `drain` stats): the answer to a `drain` with `wait`, how
        `shuffled drain --wait` learns whether the hand-over left anything only here."""
        task = asyncio.current_task()
        if task is not None:
            self.answering.add(task)
            task.add_done_callback(self.answering.discard)
        await self.ended.wait()
        return dataclasses.asdict(self.stats)

    def _enter(self, phase: DrainPhase) -> None:
        self.stats.state = phase.value

    @staticmethod
    async def _wait_until(ready: Callable[[], bool], deadline: float) -> bool:
        while not ready():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(DRAIN_POLL)
        return True
