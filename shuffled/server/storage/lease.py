"""A daemon's lease in the object store: proof of life that the sweep of other daemons reads.

A daemon that answers no admin request may be dead, or stopped for a while (a GC pause, SIGSTOP, an
overloaded host, a network blip, a restart): "no answer" says nothing. So every daemon with an object
store writes a small lease object under `.leases/<node>/` when its tier starts and again every quarter of
`object-store-lease`, and deletes its older leases once a new one is written. Another daemon's sweep takes
a node for gone only when neither its newest lease nor any object it wrote is younger than that node's
lease period (cluster/sweep.py). The key says the period (`<time>-<seconds>`), so daemons configured with
different periods still judge each other by the writer's own. Each renewal writes a key of its own: a
write that fails deletes only its own key (objects.py), never the lease that still stands; and a stop
leaves the lease to expire, so a daemon restarting is not taken for gone meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass

from ...logs import event
from ...ops.stats import TierStats
from ...protocol.errors import StorageError
from .object_format import node_dir
from .objects import ObjectInfo, ObjectStore

log = logging.getLogger(__name__)

LEASE_DIR = ".leases"
#: renewals per lease period: a lease is renewed three times before any sweep may find it old
RENEWALS = 4


def lease_node(key: str) -> str | None:
    """The node directory (`object_format.node_dir`) a lease key belongs to; None for any other key."""
    parsed = _parse(key)
    return parsed[0] if parsed is not None else None


def _parse(key: str) -> tuple[str, float] | None:
    """(node directory, lease period) of a lease key; None for any other key."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != LEASE_DIR:
        return None
    written, _, period = parts[2].partition("-")
    if not (written.isdigit() and period.isdigit()):
        return None
    return parts[1], float(period)


@dataclass(slots=True)
class Silence:
    """How long a node has said nothing in the store (its youngest lease or object), and its lease period
    (0: no lease seen, so it is never taken for gone by that)."""

    seconds: float
    period: float = 0.0

    def gone(self, floor: float) -> bool:
        """Silent for longer than its own lease period, and than `floor` (this daemon's)."""
        return self.period > 0 and self.seconds > max(self.period, floor)


def silences(listed: list[ObjectInfo], writer: dict[str, str]) -> dict[str, Silence]:
    """Per node directory in a listing, its `Silence`. `writer`: key -> node directory of the objects whose
    writer is known."""
    found: dict[str, Silence] = {}
    for info in listed:
        lease = _parse(info.key)
        node = lease[0] if lease is not None else writer.get(info.key)
        if node is None:
            continue
        silence = found.setdefault(node, Silence(info.age))
        silence.seconds = min(silence.seconds, info.age)
        if lease is not None:
            silence.period = max(silence.period, lease[1])
    return found


class Lease:
    """This daemon's lease: `start` it with the tier, `stop` it at shutdown (the lease stays and expires)."""

    def __init__(self, objects: ObjectStore, period: float, stats: TierStats) -> None:
        self.objects = objects
        self.period = period
        self.stats = stats
        self._prefix = ""
        self._task: asyncio.Task[None] | None = None

    def start(self, node: str) -> None:
        self._prefix = f"{LEASE_DIR}/{node_dir(node)}/"
        self._task = asyncio.create_task(self._renew(node))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _renew(self, node: str) -> None:
        while True:
            try:
                await self.renew(node)
            except StorageError as exc:  # the old lease stands; the next round tries again
                event(log, "lease not renewed", logging.WARNING, reason=exc.message)
            await asyncio.sleep(self.period / RENEWALS)  # the renewal's period, not a wait for an event

    async def renew(self, node: str) -> None:
        """Write a new lease, then delete the older ones."""
        key = f"{self._prefix}{time.time_ns():020d}-{math.ceil(self.period)}"
        await self.objects.write(key, [f"shuffled lease of {node}".encode()], single=True)
        self.stats.leases_written += 1
        await self.objects.delete([o.key for o in await self.objects.list_objects(self._prefix) if o.key < key])
