"""Healing: replicated attempts that lost a copy get it back, in the background (architecture.md, "Healing").

Every `heal-interval` a round surveys the attempts held here whose replica count is above one, with the
drain's survey (handover.py: admin `holds` to the primary and its placement candidates, answers checked
as a drain checks them), and finds those with fewer copies than their count. Of those, this daemon
copies the ones it is *responsible* for: the first holder in placement order (the primary, then its
candidates in order) that still has the attempt, so the survivors of a lost daemon agree, without a
coordinator, on who copies what. Copies go to the candidates lacking the attempt with the drain's
copier, from memory, the data dir or the objects where this daemon holds it, at most `heal-bandwidth`
bytes a second. A copy that fails is tried again next round.

The round also sets each surveyed shuffle's `under_replicated` to the attempts it left lacking a copy that
this daemon is responsible for, so the `ShuffledUnderReplicated` alert clears once every copy is back.
`HealStats` counts rounds, copies and bytes, and how long the last loss took to heal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from ...logs import event
from ...ops.stats import DrainStats, HealStats
from ..storage.shuffles import ShuffleData
from .handover import Drainer, HandOver, HandOverHost, Pace

log = logging.getLogger(__name__)

#: most of the interval a round's survey may take (its `holds` calls are bounded by it)
SURVEY_SHARE = 0.5


class HealingRound(Drainer):
    """One round (see the module): a drainer that wants each replicated attempt's other copies, not all of
    them, and copies only what this daemon is responsible for."""

    def wanted(self, data: ShuffleData, attempt: int) -> int | None:
        replicas = data.replicas.get(attempt, 1)
        return replicas - 1 if replicas > 1 else None

    def responsible(self, h: HandOver) -> bool:
        """This daemon is the first in placement order (the primary, then its candidates) that holds `h`."""
        node = self.host.node
        order = [h.primary, *self.host.membership.candidates(h.primary, h.data.app, h.data.shuffle)]
        return next((d for d in order if d == node or d in h.holders), node) == node


class Healing:
    """The daemon's healing: `start` it once the daemon listens; `stop` at shutdown."""

    def __init__(self, host: HandOverHost, stats: HealStats, active: Callable[[], bool] = lambda: True) -> None:
        self.host = host
        self.stats = stats
        #: rounds run only while this says so (not while the daemon drains: the drain copies then)
        self.active = active
        self.pace = Pace(host.config.heal_bandwidth)
        self._task: asyncio.Task[None] | None = None
        #: when a round first found a copy missing, until one finds none
        self._since: float | None = None

    def start(self) -> None:
        if self.host.config.heal_interval > 0:
            self._task = asyncio.create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        interval = self.host.config.heal_interval
        while True:
            await asyncio.sleep(interval)  # the round's period, not a wait for an event
            if not self.active():
                continue
            try:
                await self.round(time.monotonic() + interval * SURVEY_SHARE)
            except Exception:  # a bug must not stop healing for good
                event(log, "healing failed", logging.ERROR, exc_info=True)

    async def round(self, deadline: float) -> int:
        """Survey (until `deadline` at most), then copy what lacks a copy; the copies still missing after."""
        store = self.host.store
        if not any(r > 1 for s in store.apps.values() for d in s.values() for r in d.replicas.values()):
            return 0
        stats = self.stats
        stats.rounds += 1
        drainer = HealingRound(self.host, DrainStats())
        drainer.pace = self.pace
        found = await drainer.survey(deadline)
        todo = [h for h in found if h.missing and drainer.responsible(h)]
        missing = sum(h.missing for h in todo)
        if todo and self._since is None:
            self._since = time.monotonic()
            event(log, "healing", attempts=len(todo), copies=missing)
        for h in todo:
            before = h.missing
            await drainer.hand_over(h)
            made = before - h.missing
            out = h.data.committed.get(h.attempt)
            stats.copied += made
            stats.copied_bytes += made * (out.bytes if out is not None else 0)
            stats.failed += h.missing
        left = Counter(id(h.data) for h in todo if h.missing and not h.data.removed)
        for data in {id(h.data): h.data for h in found}.values():
            data.under_replicated = left[id(data)]
        stats.missing = sum(h.missing for h in todo if not h.data.removed)
        if stats.missing == 0 and self._since is not None:
            stats.last_heal_us = int((time.monotonic() - self._since) * 1e6)
            event(log, "healed", seconds=round(time.monotonic() - self._since, 3), copied=stats.copied)
            self._since = None
        return stats.missing
