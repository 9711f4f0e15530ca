"""A daemon's lease in the object store: proof of life that the sweep of other daemons reads.

A daemon that answers no admin request may be dead, or stopped for a while (a GC pause, SIGSTOP, an
overloaded host, a network blip): "no answer" says nothing. So every daemon with an object store writes a
small lease object under `.leases/<node>/` when its tier starts and again every quarter of
`object-store-lease`, and deletes its older leases once a new one is written. Another daemon's sweep takes
a node for gone only when neither its newest lease nor any object it wrote is younger than
`object-store-lease` (cluster/sweep.py). Each renewal writes a key of its own, from the clock: a write that
fails deletes only its own key (objects.py), never the lease that still stands.
"""

from __future__ import annotations

import asyncio
import logging
import time

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
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == LEASE_DIR and parts[2].isdigit():
        return parts[1]
    return None


def last_signs(listed: list[ObjectInfo], writer: dict[str, str]) -> dict[str, float]:
    """Per node directory, the age of its youngest lease or object in a listing: how long it has been silent
    in the store. `writer`: key -> node directory of the objects whose writer is known."""
    signs: dict[str, float] = {}
    for info in listed:
        node = lease_node(info.key) or writer.get(info.key)
        if node is not None:
            signs[node] = min(signs.get(node, info.age), info.age)
    return signs


class Lease:
    """This daemon's lease: `start` it with the tier, `close` it at a clean stop, which deletes it (what the
    daemon holds is then in its data dir, or durable in objects that a restart adopts back; a crashed
    daemon's lease stays until it expires)."""

    def __init__(self, objects: ObjectStore, period: float, stats: TierStats) -> None:
        self.objects = objects
        self.period = period
        self.stats = stats
        self._prefix = ""
        self._task: asyncio.Task[None] | None = None

    def start(self, node: str) -> None:
        self._prefix = f"{LEASE_DIR}/{node_dir(node)}/"
        self._task = asyncio.create_task(self._renew(node))

    async def close(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        try:
            await self.objects.delete([o.key for o in await self.objects.list_objects(self._prefix)])
        except StorageError as exc:
            event(log, "lease not deleted", logging.WARNING, reason=exc.message)

    async def _renew(self, node: str) -> None:
        while True:
            try:
                await self.renew(node)
            except StorageError as exc:  # the old lease stands; the next round tries again
                event(log, "lease not renewed", logging.WARNING, reason=exc.message)
            await asyncio.sleep(self.period / RENEWALS)  # the renewal's period, not a wait for an event

    async def renew(self, node: str) -> None:
        """Write a new lease, then delete the older ones."""
        key = f"{self._prefix}{time.time_ns():020d}"
        await self.objects.write(key, [f"shuffled lease of {node}".encode()], single=True)
        self.stats.leases_written += 1
        await self.objects.delete([o.key for o in await self.objects.list_objects(self._prefix) if o.key < key])
