"""Typed snapshots of what the daemon counts: `Daemon.stats()` builds a `DaemonStats` (server/accounting/stats.py).

The daemon, the metrics endpoint (ops/metrics.py) and in-process tests read these by
attribute. The admin `stats` op sends `DaemonStats.to_wire()`: nested string-keyed
dicts of integers, booleans and strings (MessagePack bodies carry no floats, so
durations are whole microseconds), the shape clients, the JVM and `shuffled stats` read.

It lives in ops/, below the server, and imports nothing else of the package: the
server's modules fill these in and the ops layer publishes them, and neither
depends on the other for it. Every class is a frozen snapshot except
`DiskStats`, `DrainStats`, `ObjectStoreStats`, `TierStats` and `HealStats`, which a `Disk`, the daemon,
the object-store layer, the tier and healing also keep as their live counters (a snapshot holds a copy).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

#: a field with this metadata is in the snapshot but not in the wire form
LOCAL_ONLY = {"wire": False}


@dataclass(frozen=True, slots=True)
class PoolStats:
    """The global buffer pool, in segments."""

    segment_size: int
    total: int
    free: int
    used: int
    #: segments kept for reads (frames, loads, exclusive buffers): pushes never take them
    reserve: int
    #: one per push stream and per relayed read
    local_pools: int
    #: requests waiting for pool memory (back-pressure)
    waiting: int
    #: floating buffers reads hold beyond their exclusive ones
    floating: int = 0
    #: segments of the reserve reads hold (never more than the reserve)
    reading: int = 0


@dataclass(frozen=True, slots=True)
class StoreStats:
    """What the store holds now, and its commit and abort counters."""

    applications: int = 0
    shuffles: int = 0
    stored_segments: int = 0
    stored_bytes: int = 0
    #: bytes of the pieces held in pool segments (memory efficiency = this / (stored_segments x segment size))
    memory_bytes: int = 0
    #: map attempts held (open and committed) and their pieces (pushed packed groups, memory and disk)
    attempts: int = 0
    pieces: int = 0
    open_map_outputs: int = 0
    commits: int = 0
    committed_bytes: int = 0
    aborts: int = 0
    #: committed attempts held here as replicas of other daemons' (§12.4), and their bytes (memory + disk)
    replica_attempts: int = 0
    replica_bytes: int = 0
    #: attempts pushed here whose commit found fewer replicas than wanted (degraded at open)
    under_replicated: int = 0


@dataclass(slots=True)
class DiskStats:
    """Spill counters: a `Disk` counts into its own; a snapshot holds a copy (`copy()`)."""

    spills: int = 0
    spilled_bytes: int = 0
    #: reads that brought spilled pieces back into the pool for readers (one or more pieces each), their bytes:
    #: against the bytes served, how much of what readers get the pool was too small to keep
    loads: int = 0
    loaded_bytes: int = 0
    used_bytes: int = 0
    #: spilled bytes of aborted attempts given back to the file system
    reclaimed_bytes: int = 0
    files: int = 0
    #: failed writes (logged; not in the admin answer)
    errors: int = field(default=0, metadata=LOCAL_ONLY)
    #: `--fsync` (fsync.py): syncs (each of every file written since the one before), the fsync calls they
    #: made, and the syncs that failed; bytes written since the last sync started
    syncs: int = 0
    fsyncs: int = 0
    sync_failures: int = 0
    unsynced_bytes: int = 0
    #: the seconds syncs took, and how long the oldest unsynced write has waited (metrics only: admin
    #: answers hold no floats)
    sync_seconds: float = field(default=0.0, metadata=LOCAL_ONLY)
    unsynced_seconds: float = field(default=0.0, metadata=LOCAL_ONLY)

    def copy(self) -> DiskStats:
        return dataclasses.replace(self)


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    """Open connections by role, and how many each role opened since start."""

    clients: int
    peers: int
    #: role -> connections accepted or dialled
    opened: dict[str, int]


@dataclass(frozen=True, slots=True)
class ConnectionCounts:
    """What one connection is doing now (summed into `StreamStats` and `CreditStats`)."""

    #: "client", "peer" or None before the handshake
    role: str | None
    #: streams this connection reads from this daemon
    served: int
    #: map outputs being pushed on it
    pushing: int
    #: reads of other daemons' data relayed through it
    remote_channels: int
    inflight_buffers: int
    #: buffers queued on its served streams
    backlog_buffers: int
    #: push credit granted and not yet used
    push_outstanding: int
    #: slots of its shared memory its pushes hold (granted as credit, or placed and not yet copied)
    push_slots: int
    #: read credit granted and not yet used
    read_outstanding: int
    #: seconds its pushes have been waiting for memory so far
    push_wait_seconds: float
    #: its pushes whose client gets no new credit now because a replica lags
    held_back: int


@dataclass(frozen=True, slots=True)
class StreamStats:
    served: int = 0
    pushing: int = 0
    remote_channels: int = 0
    inflight_buffers: int = 0
    backlog_buffers: int = 0


@dataclass(frozen=True, slots=True)
class TrafficStats:
    """Data moved since start; the per-role maps include connections still open. The `_bytes` counters count
    data bytes, the runs' bytes as `StoreStats.committed_bytes` and Spark's shuffle metrics count them (a
    packed group's header and directory are not data); `sent_bytes` and `received_bytes` are wire bytes."""

    pushed_bytes: int
    pushed_buffers: int
    #: of those, buffers local clients placed in shared memory (PROTOCOL.md §6.3)
    placed_buffers: int
    served_local_bytes: int
    served_local_buffers: int
    #: served buffers local clients read in place in shared memory (§6.3), counted as they gave them back
    read_placed_buffers: int
    relayed_bytes: int
    relayed_buffers: int
    #: role -> bytes written to connections
    sent_bytes: dict[str, int]
    #: role -> bytes read from connections
    received_bytes: dict[str, int]
    #: role -> microseconds paused above the high write watermark
    paused_us: dict[str, int]
    #: role -> microseconds served streams waited for credit with data queued
    zero_credit_us: dict[str, int]


@dataclass(frozen=True, slots=True)
class CreditStats:
    push_granted: int
    push_outstanding: int
    #: shared-memory push slots held (push credit of local clients, or groups placed and not yet copied)
    push_slots: int
    #: push windows: their guaranteed floors and the segments beyond them, against their bounds
    push_floor_segments: int
    push_floor_limit: int
    push_extra_segments: int
    push_extra_limit: int
    read_granted: int
    read_outstanding: int
    #: microseconds pushes waited for memory
    push_wait_us: int


@dataclass(frozen=True, slots=True)
class ReplicationStats:
    """Replicated pushes (PROTOCOL.md §12.4) this daemon made as a primary."""

    #: pushed buffers (and their data bytes) forwarded to replicas, counted once per replica
    forwarded_buffers: int = 0
    forwarded_bytes: int = 0
    #: pushes that opened fewer replicas than wanted and went on (`replica-shortfall = degrade`)
    degraded: int = 0
    #: pushes failed for want of a replica, at open or lost on the way (PEER_UNAVAILABLE)
    failed: int = 0
    #: open pushes whose client gets no new credit now because a replica lags (`replica-lag`)
    held_back: int = 0
    #: other daemons on the placement ring now (`peers` and what `peers-dns` resolved to)
    peers: int = 0


@dataclass(frozen=True, slots=True)
class FailoverStats:
    """Relayed reads that went on from another copy of their data (PROTOCOL.md §10.4, §10.6)."""

    #: wire error code name -> times a location of a relayed read (or a copy of it) failed with it and the next
    #: copy was looked for: tries, not successes
    tries: dict[str, int] = field(default_factory=dict)
    #: locations of relayed reads that failed and were then served to their end by another copy
    recovered: int = 0
    #: reads that failed because no copy was left (the client got the first error)
    exhausted: int = 0
    #: reads served from a resume point, for a peer or from this daemon's own copy
    resumed_reads: int = 0


@dataclass(frozen=True, slots=True)
class FilesystemStats:
    """The data directory's file system."""

    capacity_bytes: int
    free_bytes: int


@dataclass(slots=True)
class ObjectStoreStats:
    """The object store (`object-store`): what the start-up probe found and what the `objects` layer moved.

    The layer counts into its own; a snapshot holds a copy (`copy()`). Operations are the layer's
    calls (`put` one object, multipart or not; `get` one ranged read; `delete` one batch; `list` one
    listing), each of which the client may send as several HTTP requests (parts, pages, retries).
    """

    #: the `object-store` URL (no credentials ever), "" when there is none
    url: str = ""
    #: "off", "probing", "ready" or "failed"
    state: str = "off"
    #: why the probe failed ("" unless failed)
    reason: str = ""
    #: operation -> calls, and calls that failed
    requests: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    #: bytes written in objects that completed, and bytes read by ranged reads
    bytes_up: int = 0
    bytes_down: int = 0
    #: parts of multipart uploads sent (one PUT each, retries aside)
    parts: int = 0
    #: objects (and their bytes) this daemon wrote and has not deleted
    objects_held: int = 0
    bytes_held: int = 0

    def copy(self) -> ObjectStoreStats:
        return dataclasses.replace(self, requests=dict(self.requests), errors=dict(self.errors))


@dataclass(slots=True)
class TierStats:
    """The object-store tier (server/storage/tier.py): what moved into objects and why, durable commits, what
    other daemons' objects served here. The tier counts into its own; a snapshot holds a copy (`copy()`)."""

    #: objects written by the tier (each one PUT unless flushed large) and their bytes of pieces, by why:
    #: a spill without a data dir, a move from the data dir over its quota, an upload of durable commits
    spilled_objects: int = 0
    spilled_bytes: int = 0
    moved_objects: int = 0
    moved_bytes: int = 0
    durable_objects: int = 0
    durable_bytes: int = 0
    #: attempts made durable (their commit is in a complete object), and those waiting for their upload now
    durable_attempts: int = 0
    pending_attempts: int = 0
    pending_bytes: int = 0
    #: tier writes that failed (the pieces stay where they were; a durable upload is retried)
    write_errors: int = 0
    #: attempts of other nodes (or of this node's earlier life) served here from their objects, and the
    #: listings of a node's objects that found them
    adopted_attempts: int = 0
    adoptions: int = 0
    #: objects deleted with their shuffle or application; and those a drop on request left because they were
    #: written for other credentials (or their footer does not say for which)
    deleted_objects: int = 0
    kept_objects: int = 0
    #: objects the sweep deleted (all, then by why: held by no daemon that answered, the writer among them;
    #: their writer's lease expired; probes cut short), its rounds, and the objects it kept because a daemon
    #: that may hold their application did not answer
    swept_objects: int = 0
    swept_released: int = 0
    swept_expired: int = 0
    swept_probes: int = 0
    sweeps: int = 0
    sweep_kept_objects: int = 0
    #: leases written (storage/lease.py: one PUT each)
    leases_written: int = 0

    def copy(self) -> TierStats:
        return dataclasses.replace(self)

    def swept(self, kind: str, objects: int) -> None:
        """A sweep deleted `objects` for this reason (`released`, `expired`, `probe`); `lease`: leases of daemons
        gone with nothing of theirs left, which are not counted."""
        if kind == "lease":
            return
        self.swept_objects += objects
        if kind == "released":
            self.swept_released += objects
        elif kind == "expired":
            self.swept_expired += objects
        else:
            self.swept_probes += objects


@dataclass(slots=True)
class HealStats:
    """Healing (server/cluster/healing.py): rounds of checking the replicated attempts held here, the copies
    made of those lacking one, and how long the last round that found something to do took to settle."""

    rounds: int = 0
    #: copies missing among the attempts this daemon is responsible for, as the last round found
    missing: int = 0
    copied: int = 0
    copied_bytes: int = 0
    failed: int = 0
    #: whole microseconds from the first round that found a copy missing to the round that found none
    last_heal_us: int = 0

    def copy(self) -> HealStats:
        return dataclasses.replace(self)


@dataclass(slots=True)
class DrainStats:
    """Where a drain is (`state`: serving, pushes, copying, closing, done) and what its hand-over did: the
    daemon keeps its live one, a snapshot holds a copy (`copy()`)."""

    state: str = "serving"
    #: copies missing on other daemons (an attempt's replica count less the daemons holding it)
    to_copy: int = 0
    #: copies other daemons acknowledged with the stored lengths, and their data bytes
    copied: int = 0
    copied_bytes: int = 0
    #: copies not made of attempts no other daemon holds: those are lost with this daemon (unless it comes
    #: back on its data dir), and the hand-over is *incomplete*
    failed: int = 0
    #: copies not made of attempts another daemon does hold (fewer copies than their replica count, e.g.
    #: while a daemon is lost, but nothing lost with this one)
    short: int = 0
    #: the drain's deadline ended a phase (copying, or open reads) before its work was done
    timed_out: bool = False

    def copy(self) -> DrainStats:
        return dataclasses.replace(self)


@dataclass(frozen=True, slots=True)
class DaemonStats:
    """One snapshot of everything the daemon counts."""

    node: str
    #: seconds since the Unix epoch
    start_time: int
    draining: bool
    ready: bool
    pool: PoolStats
    store: StoreStats
    disk: DiskStats
    connections: ConnectionStats
    streams: StreamStats
    traffic: TrafficStats
    credit: CreditStats
    #: wire error code name -> errors reported to clients and peers
    errors: dict[str, int]
    #: None without a data directory (or when its file system cannot be read)
    filesystem: FilesystemStats | None
    replication: ReplicationStats = field(default_factory=ReplicationStats)
    drain: DrainStats = field(default_factory=DrainStats)
    failover: FailoverStats = field(default_factory=FailoverStats)
    object_store: ObjectStoreStats = field(default_factory=ObjectStoreStats)
    tier: TierStats = field(default_factory=TierStats)
    heal: HealStats = field(default_factory=HealStats)

    def to_wire(self) -> dict[str, Any]:
        """The admin `stats` answer: the same names and nesting as the fields, `{}` for no filesystem."""
        wire = _wire(self)
        assert isinstance(wire, dict)
        if self.filesystem is None:
            wire["filesystem"] = {}
        return wire


def _wire(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _wire(getattr(value, f.name)) for f in dataclasses.fields(value) if f.metadata.get("wire", True)
        }
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    return value
