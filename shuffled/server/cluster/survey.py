"""Who else holds the committed attempts held here: the survey a drain's hand-over (handover.py) and healing
(healing.py) start from.

For every committed attempt held here that wants copies elsewhere, the daemons where placement puts them
(the primary, and the first `replica-search` candidates of the primary's placement) are asked with the
admin `holds`, one call per daemon and shuffle; a daemon that does not answer within a share of the
deadline's remaining time holds nothing and is not asked again, so copying still starts in time. An
answer counts only as far as it checks out, like a client's frame: attempts it was asked about, each with
the bytes stored here (`held`): a daemon that claims what it lacks must not keep an attempt from being
copied.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...config import DaemonConfig
from ...logs import event
from ...protocol.errors import InvalidRequest, ShuffledError
from ..storage.holdings import HeldAttempt
from ..storage.manager import StorageManager
from .membership import Membership
from .replication import Connect

log = logging.getLogger(__name__)

#: `holds` calls at once
PARALLEL = 4
#: most of the remaining time one `holds` call may take: a silent daemon must leave time to copy
SURVEY_SHARE = 0.25


@dataclass(slots=True, eq=False)
class Copies:
    """One committed attempt held here and where its copies are."""

    held: HeldAttempt
    #: the node a reader names for it: this daemon, or the primary this one holds a replica of
    primary: str
    #: how many copies it should have on other daemons than this one
    wanted: int
    #: where copies are placed and looked for, this daemon left out
    candidates: list[str]
    #: other daemons that hold it committed
    holders: set[str] = field(default_factory=set)
    #: what it still lacks has been counted (the drain's `settle`)
    settled: bool = False

    @property
    def attempt(self) -> int:
        return self.held.attempt

    @property
    def missing(self) -> int:
        return max(0, self.wanted - len(self.holders))


def held(answer: dict[str, Any], asked: list[Copies], stored: Callable[[int], int | None]) -> set[int]:
    """The attempts a `holds` answer says its daemon holds, checked as a client's frame is: attempts it was
    asked about, each with the bytes stored here for it (`stored`: attempt -> its bytes here, None when it
    is gone). Raises InvalidRequest."""
    attempts, sizes = answer.get("attempts"), answer.get("bytes")
    if not isinstance(attempts, list) or not isinstance(sizes, list) or len(attempts) != len(sizes):
        raise InvalidRequest("'attempts' and 'bytes' must be lists of one length")
    wanted = {h.attempt for h in asked}
    found: set[int] = set()
    for attempt, size in zip(attempts, sizes, strict=True):
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt not in wanted:
            raise InvalidRequest(f"it names attempt {str(attempt)[:40]}, which it was not asked about")
        here = stored(attempt) or 0
        if not isinstance(size, int) or isinstance(size, bool) or size != here:
            raise InvalidRequest(f"it holds {str(size)[:40]} bytes of attempt {attempt}, {here} are stored here")
        found.add(attempt)
    return found


class Survey:
    """One survey (see the module): `wanted` says how many copies elsewhere an attempt needs (None: it is not
    surveyed); daemons that fail are added to `unavailable`, which the copies that follow skip too."""

    def __init__(
        self,
        config: DaemonConfig,
        storage: StorageManager,
        membership: Membership,
        connect: Connect,
        wanted: Callable[[HeldAttempt], int | None],
    ) -> None:
        self.config = config
        self.storage = storage
        self.membership = membership
        self.connect = connect
        self.wanted = wanted
        self.limit = asyncio.Semaphore(PARALLEL)
        #: daemons that did not answer, could not be reached or are shutting down themselves: no copy is
        #: tried there (each try could cost a connect timeout, and a drain has a deadline)
        self.unavailable: set[str] = set()
        #: every attempt surveyed so far (all of them once `run` returned)
        self.found: list[Copies] = []

    async def run(self, deadline: float) -> list[Copies]:
        """Every committed attempt held here that wants copies, with the other daemons that hold it too (as
        far as they answered in time: copying waits for the whole survey, so one silent daemon must not hold
        it up)."""
        node = self.membership.node
        groups: dict[tuple[str, int, str], list[Copies]] = {}
        self.found = []
        for held_here in self.storage.held.committed_attempts():
            wanted = self.wanted(held_here)
            if wanted is None:
                continue
            primary = held_here.replica_of or node
            key = (held_here.app, held_here.shuffle, primary)
            group = groups.get(key)
            if group is None:
                placed = self.membership.candidates(primary, held_here.app, held_here.shuffle)
                group = groups[key] = []
                cands = [c for c in placed if c != node]
            else:
                cands = group[0].candidates
            group.append(Copies(held_here, primary, wanted, cands))
            self.found.append(group[-1])
        asks = []
        for (_, _, primary), group in groups.items():
            asked = group[0].candidates + ([primary] if primary != node else [])
            asks += [self._ask(addr, group, deadline) for addr in asked]
        await asyncio.gather(*asks)
        return [h for group in groups.values() for h in group]

    async def _ask(self, addr: str, group: list[Copies], deadline: float) -> None:
        """Which of the group's attempts `addr` holds; a daemon that cannot answer within a share of the
        remaining time (or failed to before) holds none."""
        first = group[0].held
        args: dict[str, Any] = {"app": first.app, "shuffle": first.shuffle, "attempts": [h.attempt for h in group]}
        if addr in self.unavailable:
            return
        cfg = self.config
        try:
            async with self.limit:
                if addr in self.unavailable:  # it failed while this call waited its turn
                    return
                wait = min(cfg.admin_timeout, (deadline - time.monotonic()) * SURVEY_SHARE)
                async with asyncio.timeout(max(0.0, wait)):
                    conn = await self.connect(addr)
                    answer = await conn.admin_call("holds", args, cfg.admin_timeout)
        except (ShuffledError, TimeoutError, ConnectionError) as exc:
            if addr not in self.unavailable:
                self.unavailable.add(addr)
                event(log, "holds not answered", logging.WARNING, peer=addr, reason=str(exc) or "timed out")
            return
        try:
            found = held(answer, group, lambda a: self.storage.held.committed_bytes(first.app, first.shuffle, a))
        except InvalidRequest as exc:
            event(log, "holds answer refused", logging.WARNING, peer=addr, reason=exc.message)
            return
        for h in group:
            if h.attempt in found:
                h.holders.add(addr)
