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
from collections.abc import Callable, Collection, Mapping
from enum import StrEnum
from typing import Any, Protocol

from ...logs import event
from ...ops.stats import DrainStats
from .handover import Drainer, HandOverHost

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


class OpenPushes(Protocol):
    """A connection's pushes, as the drain waits for them (its `PushService`)."""

    @property
    def sessions(self) -> Mapping[int, object]: ...


class ServedReads(Protocol):
    """A connection's reads, as the drain waits for them (its `ReadService`)."""

    @property
    def served(self) -> Mapping[int, object]: ...


class Drained(Protocol):
    """A connection, as the drain waits for its work (the daemon's connections are these)."""

    @property
    def pushes(self) -> OpenPushes: ...

    @property
    def reads(self) -> ServedReads: ...


class DrainHost(HandOverHost, Protocol):
    """The daemon, as its drain sees it: what the hand-over needs, and the connections whose work it waits for."""

    @property
    def connections(self) -> Collection[Drained]: ...


class Drain:
    """The daemon's drain: `start` it (a second call gets the running one), follow it in `stats`."""

    def __init__(self, host: DrainHost) -> None:
        self.host = host
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
        conns = list(self.host.connections)
        return sum(len(c.pushes.sessions) for c in conns), sum(len(c.reads.served) for c in conns)

    async def _run(self, timeout: float, handoff: bool) -> bool:
        deadline = time.monotonic() + timeout
        pushes, reads = self.busy()
        event(log, "draining", timeout_s=timeout, handoff=handoff, pushes=pushes, reads=reads)
        done = await self._wait_until(lambda: self.busy()[0] == 0, deadline)
        if handoff:
            self._enter(DrainPhase.COPYING)
            done = await Drainer(self.host, self.stats).run(deadline) and done
        self._enter(DrainPhase.CLOSING)
        served = [c.reads.served for c in self.host.connections]
        open_reads = [(reads, rid, s) for reads in served for rid, s in reads.items()]
        done = await self._wait_until(lambda: all(d.get(r) is not s for d, r, s in open_reads), deadline) and done
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
