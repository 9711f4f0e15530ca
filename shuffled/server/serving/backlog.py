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
peer link. What waits is bounded (`MAX_WAITING` requests, beyond which the connection is
LIMIT_EXCEEDED), and so is the time a connection may keep answers unread (`unsent-timeout`,
watchdog.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Set

from ...config import DaemonConfig
from ...net.once_per_turn import OncePerTurn
from ...net.sender import UnsentTally
from ...protocol import events
from ...protocol.errors import LimitExceeded
from .link import DaemonLink

#: events that ask for an answer, in the order the other side sent them
REQUESTS = (
    events.ReadRequested,
    events.ReadCancelled,
    events.PushOpened,
    events.CommitRequested,
    events.AbortRequested,
    events.AdminRequested,
)
#: requests one connection may have waiting: more than its streams and admin requests could ever need
MAX_WAITING = 1 << 16


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
        self._waiting: deque[events.Event] = deque()
        #: a first look once this turn's answers went to the transport (the kernel may take them all, and
        #: then no `resume_writing` would come); later ones on each drain and each watchdog tick
        self._soon = OncePerTurn(self.resume)

    def holds(self, ev: events.Event) -> bool:
        """Whether the request `ev` waits (then it is handled later, in order); False: handle it now."""
        if not self._waiting and not self.budget.over(self.conn):
            return False
        if len(self._waiting) >= MAX_WAITING:
            self.conn.fail(LimitExceeded(f"{MAX_WAITING} requests wait for their answers to be read; no more"))
            return True
        if not self._waiting:
            self.budget.waiting.add(self)
            self._soon()
        self._waiting.append(ev)
        return True

    def resume(self) -> None:
        waiting = self._waiting
        while waiting and self.conn.is_open and not self.budget.over(self.conn):
            self.handle(waiting.popleft())
        if not waiting or not self.conn.is_open:
            self.release()

    def release(self) -> None:
        """The connection is gone: nothing waits any more (requests carry no payload)."""
        self._waiting.clear()
        self.budget.waiting.discard(self)
