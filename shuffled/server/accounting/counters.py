"""Plain counters the daemon bumps on its hot path; metrics read them at scrape time.

Adding to an int attribute is the cheapest thing Python can do per buffer, so the
data path never touches a metrics library. Per-connection counters (bytes in and
out, time paused or without credit) live on the connection while it is open and
are folded in here when it closes, so totals never go backwards.

The snapshot (`traffic`, `Daemon.stats`, see ops/stats.py) holds integers only: it is
also the admin `stats` answer, and MessagePack bodies on the wire carry no floats
(durations are whole microseconds there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from ...net.sender import Outbound, Sender
from ...ops.stats import ConnectionCounts, TrafficStats

ROLES = ("client", "peer")


class Traffic(Protocol):
    """A connection as the counters and the stats snapshot read it (the daemon's connections are these)."""

    @property
    def role_label(self) -> str | None: ...

    @property
    def sender(self) -> Sender: ...

    @property
    def bytes_received(self) -> int: ...

    @property
    def is_open(self) -> bool: ...

    def served_streams(self) -> Iterable[Outbound]: ...

    def counts(self, now: float) -> ConnectionCounts: ...


def _per_role() -> dict[str, int]:
    return dict.fromkeys(ROLES, 0)


def _seconds_per_role() -> dict[str, float]:
    return dict.fromkeys(ROLES, 0.0)


def micros(seconds: float) -> int:
    return round(seconds * 1e6)


@dataclass(slots=True)
class Counters:
    #: the `_bytes` counters count data bytes, the runs' bytes (never a packed group's header or directory)
    pushed_bytes: int = 0
    pushed_buffers: int = 0
    #: of those, buffers a local client placed in shared memory (never crossing a socket)
    placed_buffers: int = 0
    #: stored data queued to readers (clients or peers) from this daemon's own store
    served_local_bytes: int = 0
    served_local_buffers: int = 0
    #: served buffers (local or relayed) local clients read in place in shared memory, counted as they gave
    #: their slots back
    read_placed_buffers: int = 0
    #: data from other daemons relayed to this daemon's clients
    relayed_bytes: int = 0
    relayed_buffers: int = 0
    push_credit_granted: int = 0
    read_credit_granted: int = 0
    #: seconds push sessions waited for memory with no credit left (back-pressure on pushers)
    push_wait_seconds: float = 0.0
    #: pushed buffers (and their data bytes) forwarded to replicas, one per replica
    replica_forwarded_buffers: int = 0
    replica_forwarded_bytes: int = 0
    #: pushes that opened fewer replicas than wanted and went on, or failed for want of a replica
    replication_degraded: int = 0
    replication_failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    #: locations of relayed reads looked for on another copy, by the wire code they failed with (tries)
    failover_tries: Counter[str] = field(default_factory=Counter)
    #: failed locations another copy served to their end, and relayed reads that failed for want of a copy
    failover_recovered: int = 0
    failover_exhausted: int = 0
    #: reads served from a resume point (PROTOCOL.md §10.6), for a peer or from this daemon's own copy
    resumed_reads: int = 0
    opened: dict[str, int] = field(default_factory=_per_role)
    # folded in from closed connections, by role
    sent_bytes: dict[str, int] = field(default_factory=_per_role)
    received_bytes: dict[str, int] = field(default_factory=_per_role)
    paused_seconds: dict[str, float] = field(default_factory=_seconds_per_role)
    zero_credit_seconds: dict[str, float] = field(default_factory=_seconds_per_role)

    def fold(self, conn: Traffic) -> None:
        """A connection closed: keep what it counted."""
        role = conn.role_label
        if role is None:
            return
        sender = conn.sender
        self.sent_bytes[role] += sender.bytes_sent
        self.received_bytes[role] += conn.bytes_received
        self.paused_seconds[role] += sender.paused_seconds
        self.zero_credit_seconds[role] += sender.zero_credit_seconds

    def traffic(self, conns: Iterable[Traffic], now: float) -> TrafficStats:
        """Data moved since start: closed connections' totals plus what the open ones counted so far."""
        sent, received = dict(self.sent_bytes), dict(self.received_bytes)
        paused, zero = dict(self.paused_seconds), dict(self.zero_credit_seconds)
        for conn in conns:
            role = conn.role_label
            if role is None:
                continue
            sender = conn.sender
            sent[role] += sender.bytes_sent
            received[role] += conn.bytes_received
            paused[role] += sender.paused_seconds + (now - sender.paused_since if sender.paused_since else 0.0)
            zero[role] += sender.zero_credit_seconds + sum(
                now - s.blocked_since for s in conn.served_streams() if s.blocked_since is not None
            )
        return TrafficStats(
            pushed_bytes=self.pushed_bytes,
            pushed_buffers=self.pushed_buffers,
            placed_buffers=self.placed_buffers,
            served_local_bytes=self.served_local_bytes,
            served_local_buffers=self.served_local_buffers,
            read_placed_buffers=self.read_placed_buffers,
            relayed_bytes=self.relayed_bytes,
            relayed_buffers=self.relayed_buffers,
            sent_bytes=sent,
            received_bytes=received,
            paused_us={role: micros(v) for role, v in paused.items()},
            zero_credit_us={role: micros(v) for role, v in zero.items()},
        )
