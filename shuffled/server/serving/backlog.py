"""Back-pressure on requests: a party that does not read its answers stops getting served.

Data stops at the write watermarks by itself (credit, then the transport's high watermark), and it is pool
memory lent to the transport, not a copy. Answers are copies, and nothing stopped them: a client that sent
2.7 KB of commits of map outputs with a million partitions, and never read, made a daemon queue 256 MiB of
CommitAcks. So before the daemon handles a request (a read, a push's open, commit or abort, an admin
request), it looks at the answers queued unsent (`Sender.control_unsent`): on this connection
(`max-unsent-per-connection`) and on all of them (`max-unsent`). Over either, that request and every
later one of the connection wait, in order, in its `Backlog`, and are handled as the answers drain (any
connection's transport falling below its low watermark, or closing; and at least every watchdog tick).
The connection goes on reading meanwhile, and data, credit and answers to this daemon's own requests go
on being handled: two daemons each waiting for the other to read can therefore never stop each other's
peer link. What waits is bounded in bytes (as sent; decoded, a request takes 6 to 10 times that): a
connection whose waiting requests pass `MAX_WAITING_BYTES`, or that has the most waiting when all
connections' pass `MAX_WAITING_TOTAL`, is LIMIT_EXCEEDED. So is the time a connection may keep answers
unread (`unsent-timeout`, watchdog.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Set

from ...config import DaemonConfig
from ...net.once_per_turn import OncePerTurn
from ...net.sender import UnsentTally
from ...protocol import codec, events
from ...protocol.errors import LimitExceeded
from .link import DaemonLink

#: events that ask for an answer, in the order the other side sent them
REQUESTS = (
    events.ReadRequested,
    events.ReadCancelled,
    events.PushOpened,
    events.CommitRequested,
    events.AbortRequested,
    events.PushOutOfTurn,
    events.AdminRequested,
)
#: bytes of requests one connection may have waiting, and all of them together (see the module): far more
#: than the reads, commits and admin requests a party that reads its answers has in flight
MAX_WAITING_BYTES = 2 << 20
MAX_WAITING_TOTAL = 4 << 20
#: what a request without a body counts as (its event and its place in the line)
MIN_REQUEST_BYTES = 64


def request_bytes(ev: events.Event) -> int:
    """What a waiting request counts as: its frame's size, re-encoded (only requests that wait pay that)."""
    match ev:
        case events.ReadRequested(request) | events.PushOpened(request) | events.AdminRequested(request):
            return max(MIN_REQUEST_BYTES, len(codec.encode(request)))
    return MIN_REQUEST_BYTES


class UnsentBudget:
    """The daemon's bound on answers queued unsent, and the backlogs waiting for room."""

    def __init__(self, config: DaemonConfig, connections: Set[DaemonLink]) -> None:
        self.per_connection = config.max_unsent_per_connection
        self.total = config.max_unsent
        self.connections = connections
        #: every connection's control bytes unsent, those failing too: until its transport is gone, what a
        #: connection holds is still held
        self.tally = UnsentTally()
        self.waiting: set[Backlog] = set()
        #: bytes of the requests all backlogs hold
        self.waiting_bytes = 0

    def over(self, conn: DaemonLink) -> bool:
        if conn.sender.control_unsent() > self.per_connection:
            return True
        if self.tally.bytes <= self.total:
            return False
        for c in self.connections:  # the tally may run high until a sender reaps: look closer
            c.sender.control_unsent()
        return self.tally.bytes > self.total

    def drained(self) -> None:
        """Some answers left (or a connection closed): the waiting backlogs go on as far as there is room."""
        for backlog in list(self.waiting):
            backlog.resume()


class Backlog:
    """One connection's requests waiting for its answers (or all connections' answers) to drain."""

    def __init__(self, conn: DaemonLink, budget: UnsentBudget, handle: Callable[[events.Event], None]) -> None:
        self.conn = conn
        self.budget = budget
        self.handle = handle
        self._waiting: deque[tuple[events.Event, int]] = deque()
        #: bytes of the requests waiting (`request_bytes`)
        self.bytes = 0
        #: a first look once this turn's answers went to the transport (the kernel may take them all, and
        #: then no `resume_writing` would come); later ones on each drain and each watchdog tick
        self._soon = OncePerTurn(self.resume)

    def holds(self, ev: events.Event) -> bool:
        """Whether the request `ev` waits (then it is handled later, in order); False: handle it now."""
        budget = self.budget
        if not self._waiting and not budget.over(self.conn):
            return False
        if not self._waiting:
            budget.waiting.add(self)
            self._soon()
        size = request_bytes(ev)
        self._waiting.append((ev, size))
        self.bytes += size
        budget.waiting_bytes += size
        if self.bytes > MAX_WAITING_BYTES:
            self.conn.fail(LimitExceeded(f"{self.bytes} bytes of requests wait for their answers to be read; no more"))
        elif budget.waiting_bytes > MAX_WAITING_TOTAL:
            most = max(budget.waiting, key=lambda b: b.bytes)
            most.conn.fail(
                LimitExceeded(
                    f"{most.bytes} bytes of requests wait for their answers to be read, the most of all "
                    f"connections, which hold {budget.waiting_bytes}; no more"
                )
            )
        return True

    def resume(self) -> None:
        waiting = self._waiting
        while waiting and self.conn.is_open and not self.budget.over(self.conn):
            ev, size = waiting.popleft()
            self.bytes -= size
            self.budget.waiting_bytes -= size
            self.handle(ev)
        if not waiting or not self.conn.is_open:
            self.release()

    def release(self) -> None:
        """The connection is gone: nothing waits any more (requests carry no payload)."""
        self._waiting.clear()
        self.budget.waiting_bytes -= self.bytes
        self.bytes = 0
        self.budget.waiting.discard(self)
