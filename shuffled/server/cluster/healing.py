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

from ...config import DaemonConfig
from ...logs import event
from ...ops.stats import HealStats
from ..storage.holdings import HeldAttempt
from ..storage.manager import StorageManager
from .copier import Copier, Pace
from .membership import Membership
from .replication import Connect
from .survey import Copies, Survey

log = logging.getLogger(__name__)

#: most of the interval a round's survey may take (its `holds` calls are bounded by it)
SURVEY_SHARE = 0.5


def wanted(held: HeldAttempt) -> int | None:
    """Copies a replicated attempt should have on other daemons; None for one that wants no other copy."""
    return held.replicas - 1 if held.replicas > 1 else None


def responsible(node: str, membership: Membership, h: Copies) -> bool:
    """`node` is the first in placement order (the primary, then its candidates) that holds `h`."""
    order = [h.primary, *membership.candidates(h.primary, h.held.app, h.held.shuffle)]
    return next((d for d in order if d == node or d in h.holders), node) == node


class Healing:
    """The daemon's healing: `start` it once the daemon listens; `stop` at shutdown."""

    def __init__(
        self,
        config: DaemonConfig,
        storage: StorageManager,
        membership: Membership,
        connect: Connect,
        stats: HealStats,
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        self.config = config
        self.storage = storage
        self.membership = membership
        self.connect = connect
        self.stats = stats
        #: rounds run only while this says so (not while the daemon drains: the drain copies then)
        self.active = active
        self.pace = Pace(config.heal_bandwidth)
        self._task: asyncio.Task[None] | None = None
        #: when a round first found a copy missing, until one finds none
        self._since: float | None = None

    def start(self) -> None:
        if self.config.heal_interval > 0:
            self._task = asyncio.create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        interval = self.config.heal_interval
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
        if not any(wanted(h) for h in self.storage.held.committed_attempts()):
            return 0
        stats = self.stats
        stats.rounds += 1
        survey = Survey(self.config, self.storage, self.membership, self.connect, wanted)
        copier = Copier(self.config, self.storage, self.connect, survey.unavailable, self.pace)
        found = await survey.run(deadline)
        node = self.membership.node
        todo = [h for h in found if h.missing and responsible(node, self.membership, h)]
        missing = sum(h.missing for h in todo)
        if todo and self._since is None:
            self._since = time.monotonic()
            event(log, "healing", attempts=len(todo), copies=missing)
        for h in todo:
            before = h.missing
            await copier.replenish(h)
            made = before - h.missing
            stats.copied += made
            stats.copied_bytes += made * (self._bytes(h.held) or 0)
            stats.failed += h.missing
        gone = {(h.held.app, h.held.shuffle) for h in todo if self._bytes(h.held) is None}
        left = Counter(
            (h.held.app, h.held.shuffle) for h in todo if h.missing and (h.held.app, h.held.shuffle) not in gone
        )
        for app, shuffle in {(h.held.app, h.held.shuffle) for h in found}:
            self.storage.held.under_replicated(app, shuffle, left[app, shuffle])
        stats.missing = sum(h.missing for h in todo if (h.held.app, h.held.shuffle) not in gone)
        if stats.missing == 0 and self._since is not None:
            stats.last_heal_us = int((time.monotonic() - self._since) * 1e6)
            event(log, "healed", seconds=round(time.monotonic() - self._since, 3), copied=stats.copied)
            self._since = None
        return stats.missing

    def _bytes(self, held: HeldAttempt) -> int | None:
        return self.storage.held.committed_bytes(held.app, held.shuffle, held.attempt)
