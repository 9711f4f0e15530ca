"""One snapshot of everything the daemon counts (`Daemon.stats()`), gathered from the parts that count.

The pool, the store, the disk, the counters, the push shares and every connection keep their own
numbers; `snapshot` only reads them into a `DaemonStats` (ops/stats.py), which the metrics
endpoint turns into Prometheus metrics and whose wire form is the admin `stats` answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Protocol

from ...buffers import GlobalPool
from ...ops.stats import (
    ConnectionStats,
    CreditStats,
    DaemonStats,
    DrainStats,
    FailoverStats,
    HealStats,
    ObjectStoreStats,
    PoolStats,
    ReplicationStats,
    StreamStats,
)
from ..storage.manager import StorageManager
from .counters import Counters, Traffic, micros
from .shares import PushShares


class Reported(Protocol):
    """The daemon, as its snapshot reads it."""

    @property
    def node(self) -> str: ...

    @property
    def start_time(self) -> float: ...

    @property
    def pool(self) -> GlobalPool: ...

    @property
    def storage(self) -> StorageManager: ...

    @property
    def counters(self) -> Counters: ...

    @property
    def shares(self) -> PushShares: ...

    @property
    def connections(self) -> Collection[Traffic]: ...

    @property
    def object_stats(self) -> ObjectStoreStats: ...

    @property
    def heal_stats(self) -> HealStats: ...

    def readiness(self) -> list[str]: ...


def snapshot(d: Reported, now: float, peers: int, drain: DrainStats, draining: bool) -> DaemonStats:
    """What `d` counts at monotonic time `now` (on the event loop); what the cluster layer above knows
    (the other daemons, the drain) is handed in."""
    conns = [c for c in d.connections if c.is_open]
    counts = [c.counts(now) for c in conns]
    store, disk, fs, tier = d.storage.stats()
    counters = d.counters
    pool = d.pool
    shares = d.shares
    return DaemonStats(
        node=d.node,
        start_time=int(d.start_time),
        draining=draining,
        ready=not d.readiness(),
        pool=PoolStats(
            segment_size=pool.segment_size,
            total=pool.total,
            free=pool.free,
            used=pool.used,
            reserve=pool.reserve,
            local_pools=len(pool.locals),
            waiting=pool.waiting,
            floating=pool.floating,
            reading=pool.reading,
        ),
        store=store,
        disk=disk,
        connections=ConnectionStats(
            clients=sum(1 for n in counts if n.role == "client"),
            peers=sum(1 for n in counts if n.role == "peer"),
            opened=dict(counters.opened),
        ),
        streams=StreamStats(
            served=sum(n.served for n in counts),
            pushing=sum(n.pushing for n in counts),
            remote_channels=sum(n.remote_channels for n in counts),
            inflight_buffers=sum(n.inflight_buffers for n in counts),
            backlog_buffers=sum(n.backlog_buffers for n in counts),
        ),
        # every connection not yet folded in, open or failing, so totals never go backwards
        traffic=counters.traffic(list(d.connections), asyncio.get_running_loop().time()),
        credit=CreditStats(
            push_granted=counters.push_credit_granted,
            push_outstanding=sum(n.push_outstanding for n in counts),
            push_slots=sum(n.push_slots for n in counts),
            push_floor_segments=shares.all.floors,
            push_floor_limit=shares.floor_limit,
            push_extra_segments=shares.all.extras,
            push_extra_limit=shares.extra_limit,
            read_granted=counters.read_credit_granted,
            read_outstanding=sum(n.read_outstanding for n in counts),
            push_wait_us=micros(counters.push_wait_seconds + sum(n.push_wait_seconds for n in counts)),
        ),
        errors=dict(counters.errors),
        filesystem=fs,
        replication=ReplicationStats(
            forwarded_buffers=counters.replica_forwarded_buffers,
            forwarded_bytes=counters.replica_forwarded_bytes,
            degraded=counters.replication_degraded,
            failed=counters.replication_failed,
            held_back=sum(n.held_back for n in counts),
            peers=peers,
        ),
        drain=drain.copy(),
        failover=FailoverStats(
            tries=dict(counters.failover_tries),
            recovered=counters.failover_recovered,
            exhausted=counters.failover_exhausted,
            resumed_reads=counters.resumed_reads,
        ),
        object_store=d.object_stats.copy(),
        tier=tier,
        heal=d.heal_stats.copy(),
    )
