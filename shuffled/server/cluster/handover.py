"""A draining daemon hands its committed data over to other daemons before it stops (drain.py, phase
*copying*).

It surveys who else holds every committed attempt held here (survey.py), then copies (copier.py) each
attempt with fewer copies elsewhere than its replica count to the first candidates that lack it, with
`PARALLEL` workers. The count wanted elsewhere is the full replica count, so an attempt keeps its
redundancy once this daemon is gone (a host that does not come back loses nothing); the price is that a
rolling restart copies every replicated attempt once more. A copy that fails is logged and the drain goes
on. What an attempt still lacks at the end is counted once (`settle`): as `failed` when no other daemon
holds it, which makes the hand-over *incomplete* (Spark recomputes that attempt if its data is needed, as
without a hand-over, unless this daemon comes back on its data dir), as `short` when another daemon does
(fewer copies than wanted, as while a daemon is lost; nothing is lost with this one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from ...config import DaemonConfig
from ...logs import event
from ...ops.stats import DrainStats
from ..storage.holdings import HeldAttempt
from ..storage.manager import StorageManager
from .copier import Copier
from .membership import Membership
from .replication import Connect
from .survey import Copies, Survey

log = logging.getLogger(__name__)

#: copies at once: enough to keep a few peers busy, few enough for a small pool
PARALLEL = 4


class HandOver:
    """One drain's hand-over (see the module): `run` surveys, then copies with `PARALLEL` workers, counting
    into the drain's `DrainStats`."""

    def __init__(
        self,
        config: DaemonConfig,
        storage: StorageManager,
        membership: Membership,
        connect: Connect,
        progress: DrainStats,
    ) -> None:
        self.config = config
        self.storage = storage
        self.progress = progress
        self.survey = Survey(config, storage, membership, connect, self.wanted)
        self.copier = Copier(config, storage, connect, self.survey.unavailable)
        #: whether the survey of the attempts' holders finished
        self.surveyed = False

    def wanted(self, held: HeldAttempt) -> int:
        """Copies an attempt held here needs on other daemons: a draining daemon wants its full replica count
        elsewhere, as it is leaving."""
        return held.replicas

    async def run(self, deadline: float) -> bool:
        """Hand over what lacks copies; True if that ended before `deadline`. Whatever an attempt still lacks
        then is counted (`settle`), also when the deadline or a bug ended the hand-over."""
        progress = self.progress
        in_time = False
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                todo = [h for h in await self.survey.run(deadline) if h.missing]
                self.surveyed = True
                progress.to_copy = sum(h.missing for h in todo)
                event(log, "handing over", attempts=len(todo), copies=progress.to_copy)
                queue = deque(todo)
                async with asyncio.TaskGroup() as workers:  # a bug in one cancels the others
                    for _ in range(PARALLEL):
                        workers.create_task(self._work(queue))
            in_time = True
        except TimeoutError:
            event(log, "hand-over timed out", logging.WARNING, to_copy=progress.to_copy, copied=progress.copied)
        except Exception:  # a bug: the hand-over ends here, and the drain goes on to stop the daemon
            event(log, "hand-over failed", logging.ERROR, exc_info=True, copied=progress.copied)
        if not self.surveyed:  # as far as the survey got: what it did not hear of is held here only
            progress.to_copy = sum(h.missing for h in self.survey.found)
        for h in self.survey.found:
            self.settle(h)
        if progress.failed:
            event(
                log,
                "hand-over incomplete",
                logging.WARNING,
                copies_failed=progress.failed,
                copied=progress.copied,
                reason="attempts no other daemon holds are lost with this daemon unless it comes back on its data dir",
            )
        elif progress.short:
            event(
                log,
                "hand-over short of copies",
                copies_short=progress.short,
                copied=progress.copied,
                reason="fewer daemons took a copy than the replica count wants; each attempt is on another daemon",
            )
        return in_time

    def settle(self, h: Copies) -> None:
        """Count, once, the copies `h` still lacks: `failed` when no other daemon holds it (it is lost with
        this daemon), `short` when one does (fewer copies than wanted, none lost)."""
        if h.settled:
            return
        h.settled = True
        progress = self.progress
        held = h.held
        if self.storage.held.committed_bytes(held.app, held.shuffle, held.attempt) is None:  # dropped meanwhile
            progress.to_copy -= h.missing
        elif h.holders:
            progress.short += h.missing
        else:
            progress.failed += h.missing

    async def _work(self, queue: deque[Copies]) -> None:
        while queue:
            await self.hand_over(queue.popleft())

    async def hand_over(self, h: Copies) -> None:
        """Copy one attempt to the candidates lacking it, then count what it still lacks."""
        await self.copier.replenish(h, self._copied)
        self.settle(h)

    def _copied(self, size: int) -> None:
        self.progress.copied += 1
        self.progress.copied_bytes += size
