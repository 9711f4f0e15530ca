"""Replicated pushes (PROTOCOL.md §12.4): the primary forwards what a client pushes to other daemons.

A `ReplicaLink` is one outbound push to a replica over the peer connection: a
`PushStream` fed with `Payload`s whose buffer references it takes over, so a forwarded
buffer is the very segment the client's bytes landed in, never a copy. It is what a
primary's session uses, and what a draining daemon copies stored attempts with.

How far a link may fall behind is bounded: `lagging()` is true while `lag` or more of
its chunks wait unsent (no credit from the replica, or the connection above its
write watermark), and the session grants its client no credit then. The client
therefore waits on the slowest replica instead of memory growing; the link calls
`on_progress` once it is down to half of `lag`. The send loop reports each buffer it
sends to the link only while the link lags, and the link wakes the send loop only
when its stream is not already waiting for its turn: forwarding a buffer costs the
primary one queue append, not a chain of calls per buffer.

A `ReplicaLinks` is one client push's set: opened on the placement candidates before
the client's first credit, fed after each buffer is stored, committed before the
local commit (a CommitAck then means every copy is committed), aborted with the push.
A `ReplicaService` routes a peer connection's answers (credit, CommitAck, AbortAck,
errors, the connection's loss) to its links.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from ...buffers import Buffer
from ...config import DaemonConfig
from ...logs import event
from ...net.sender import Sender
from ...net.streams import Payload, PushEvent, PushStream
from ...protocol.connection import ProtocolConnection
from ...protocol.errors import AuthFailed, PeerUnavailable, ShuffledError
from ...protocol.frames import REPLICA, OpenMapOutput
from ..accounting.counters import Counters
from .membership import Membership
from .peers import PeerConnection

log = logging.getLogger(__name__)
T = TypeVar("T")


class PeerLink(PeerConnection, Protocol):
    """A connection to another daemon as the cluster uses it (the daemon's connections are these): replica
    pushes over it (`replicas`, this module) and admin calls on it (a survey's `holds`, a sweep's
    `applications`, a propagated drop)."""

    @property
    def node(self) -> str: ...

    @property
    def proto(self) -> ProtocolConnection: ...

    @property
    def sender(self) -> Sender: ...

    @property
    def replicas(self) -> ReplicaService: ...

    async def admin_call(self, op: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Ask the other daemon admin `op`; its answer, or its error raised (TimeoutError past `timeout`)."""
        ...


#: a connection to another daemon, once there is one (the daemon's peer manager's `get`)
Connect = Callable[[str], Awaitable[PeerLink]]


class ReplicaLink:
    """One push to a replica: `open`, then `send` and `caught_up` as long as there is data, then `commit`
    (or `abort`, at any time). A failure (an Error on the stream, the connection lost, a timeout) is
    raised by the awaited call and reported to `on_failure`."""

    def __init__(self, config: DaemonConfig) -> None:
        #: chunks the link may queue unsent before `lagging()`
        self.lag = config.replica_lag
        #: how long the replica may take to grant its first credit (a dial's bound), and to acknowledge the
        #: commit (a peer's bound: it may first have to take the chunks still queued)
        self.open_timeout = config.connect_timeout
        self.commit_timeout = config.peer_timeout or None
        self.node = ""
        self.conn: PeerLink | None = None
        #: its `on_progress` is `_sent` only while the link lags (see `lagging`)
        self.stream = PushStream(0, forward_crc=True)
        loop = asyncio.get_running_loop()
        self._opened: asyncio.Future[None] = loop.create_future()
        self._committed: asyncio.Future[list[int]] = loop.create_future()
        self._caught_up = asyncio.Event()
        self._blocked = False
        #: called once when the link fails
        self.on_failure: Callable[[ShuffledError], None] | None = None
        #: called when the link is no longer lagging after `lagging()` said it was
        self.on_progress: Callable[[], None] | None = None
        self.failure: ShuffledError | None = None
        self.done = False

    async def open(self, conn: PeerLink, req: OpenMapOutput) -> None:
        """Open the push `req` (its `writer` is chosen here) on `conn`; returns at the replica's first credit,
        raises its Error, or PeerUnavailable when the peer does not take replica pushes or on a timeout (the
        link is then aborted)."""
        self.node = conn.node
        if REPLICA not in conn.proto.features:
            self.done = True
            raise PeerUnavailable(f"daemon {conn.node} does not take replica pushes (no '{REPLICA}' feature)")
        self.conn = conn
        conn.replicas.open(self, req)
        await self._wait(self._opened, "grant credit", self.open_timeout)

    def send(self, payload: Payload) -> None:
        """Queue a stored piece and its CRC32C; its buffer reference is the link's from now on (released once
        written or dropped). A `Payload`, the type the stream packs: compiled (mypyc), the stream refuses any
        other, and a piece it cannot send never reaches the replica, which then commits without it."""
        if self.done or self.conn is None:
            payload.buffer.release()
            return
        stream = self.stream
        stream.push_data(payload)
        if not stream.scheduled:  # a scheduled stream is sent on the send loop's next turn anyway
            self.conn.sender.wake(stream)

    def lagging(self) -> bool:
        """`lag` or more chunks wait unsent; `on_progress` is called once at most half of that do."""
        if self.stream.queued < self.lag or self.done:
            return False
        self._blocked = True
        self.stream.on_progress = self._sent
        self._caught_up.clear()
        return True

    async def caught_up(self) -> None:
        """Wait while the link is lagging (raises its failure)."""
        while self.lagging():
            await self._caught_up.wait()
        self._raise_failure()

    async def commit(self) -> list[int]:
        """Commit what was sent; the replica's bytes per partition (raises a failure, the link is aborted)."""
        assert self.conn is not None
        self._raise_failure()
        self.stream.push_event(PushEvent.COMMIT)
        self.conn.sender.wake(self.stream)
        return await self._wait(self._committed, "commit", self.commit_timeout)

    def abort(self) -> None:
        """Give the push up (nothing is owed back); queued chunks are released. A no-op once it ended."""
        if self.done:
            return
        self.done = True
        self._wake_waiters()
        self.stream.shutdown()
        if self.conn is not None:
            self.conn.replicas.abort(self)

    # -- what the connection reports (`ReplicaService`)

    def credited(self) -> None:
        if not self._opened.done():
            self._opened.set_result(None)
        if self.conn is not None:
            self.conn.sender.wake(self.stream)

    def committed(self, lengths: list[int]) -> None:
        self.done = True
        self.stream.shutdown()
        if not self._committed.done():
            self._committed.set_result(lengths)

    def failed(self, exc: ShuffledError) -> None:
        if self.done:
            return
        self.done = True
        self.failure = exc
        self.stream.shutdown()
        for fut in (self._opened, self._committed):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved: whoever awaits it raises it, and on_failure reports it
        self._wake_waiters()
        if self.on_failure is not None:
            self.on_failure(exc)

    # -- inside

    async def _wait(self, fut: asyncio.Future[T], what: str, timeout: float | None) -> T:
        """`fut`'s result within `timeout`. Not `asyncio.wait_for`: when a result arrives together with the
        caller's cancel, it returns the result and drops the cancel, and a push that ended while its link
        opened would leave the link open, holding the replica's push window while the peer link lives."""
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(fut)
        except TimeoutError:
            exc = PeerUnavailable(f"replica {self.node} did not {what} within {timeout:g} s")
            self.abort()
            raise exc from None
        except BaseException:
            self.abort()
            raise

    def _sent(self) -> None:
        # Resumed at half the lag, not one below it: the pusher then gets credit in batches, not one
        # PushCredit (and one wake-up of the writer) per buffer the replica takes.
        if self._blocked and self.stream.queued <= self.lag // 2:
            self._wake_waiters()
            if self.on_progress is not None:
                self.on_progress()

    def _wake_waiters(self) -> None:
        self._blocked = False
        self.stream.on_progress = None
        self._caught_up.set()

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self.done:
            raise PeerUnavailable(f"the push to replica {self.node} was aborted")


class ReplicaService:
    """A peer connection's outbound replica pushes, by writer id: it opens them, and only it forgets them."""

    def __init__(self, proto: ProtocolConnection) -> None:
        self.proto = proto
        self.outgoing: dict[int, ReplicaLink] = {}

    def open(self, link: ReplicaLink, req: OpenMapOutput) -> None:
        """Open `link`'s push `req` under a writer id chosen here."""
        writer = link.stream.stream = self.proto.streams.new_id()
        self.outgoing[writer] = link
        self.proto.open_push(dataclasses.replace(req, writer=writer), link.stream)

    def abort(self, link: ReplicaLink) -> None:
        """`link` gives its push up: nothing more is reported to it, the replica is told."""
        writer = link.stream.stream
        if self.outgoing.get(writer) is link:
            del self.outgoing[writer]
        self.proto.abort_push(writer)

    def on_credit(self, writer: int) -> None:
        link = self.outgoing.get(writer)
        if link is not None:
            link.credited()

    def on_committed(self, writer: int, lengths: list[int]) -> None:
        link = self.outgoing.pop(writer, None)
        if link is not None:
            link.committed(lengths)

    def on_aborted(self, writer: int) -> None:
        link = self.outgoing.pop(writer, None)
        if link is not None:
            link.failed(PeerUnavailable(f"replica {link.node} aborted the push"))

    def on_failed(self, stream: int, exc: ShuffledError) -> bool:
        """The replica ended one of our pushes with an error; False when `stream` is not one."""
        link = self.outgoing.pop(stream, None)
        if link is None:
            return False
        link.failed(exc)
        return True

    def release(self, lost: ShuffledError) -> None:
        links, self.outgoing = list(self.outgoing.values()), {}
        for link in links:
            link.failed(lost)


class ReplicaLinks:
    """The replica pushes of one client push (its `PushSession`'s)."""

    def __init__(
        self,
        config: DaemonConfig,
        counters: Counters,
        membership: Membership,
        connect: Connect,
        req: OpenMapOutput,
        app_key: bytes,
        replicas: int,
    ) -> None:
        self.config = config
        self.counters = counters
        self.membership = membership
        self.connect = connect
        #: the replica pushes' OpenMapOutput, `writer` chosen per link
        self.req = dataclasses.replace(
            req, writer=0, token=None, replicas=replicas, replica_of=membership.node, app_key=app_key.hex()
        )
        self.wanted = replicas - 1
        self.links: list[ReplicaLink] = []
        #: called with the failure of a link once the push is under way
        self.on_failure: Callable[[ShuffledError], None] | None = None
        #: called when no link is lagging any more (see `lagging`)
        self.on_progress: Callable[[], None] | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(link.node for link in self.links)

    async def open(self) -> None:
        """Open links on the placement candidates in order until enough are open; a candidate that cannot be
        reached, lacks the feature, refuses or does not answer in time is skipped. Raises AUTH_FAILED (the
        client's push must fail with it) and, when fewer than wanted opened and `replica-shortfall` is
        `fail`, PEER_UNAVAILABLE; degrades (counted) otherwise."""
        cfg, req = self.config, self.req
        for node in self.membership.candidates(self.membership.node, req.app, req.shuffle):
            if len(self.links) >= self.wanted:
                break
            link = await self._open_on(node)
            if link is not None:
                link.on_failure = self._failed
                link.on_progress = self._progress
                self.links.append(link)
        if len(self.links) < self.wanted:
            if cfg.replica_shortfall == "fail":
                self.counters.replication_failed += 1
                raise PeerUnavailable(
                    f"only {len(self.links)} of the {self.wanted} replicas this push wants could be opened "
                    "(replica-shortfall = fail)"
                )
            self.counters.replication_degraded += 1
            event(
                log,
                "replication degraded",
                app=req.app,
                shuffle=req.shuffle,
                attempt=req.attempt,
                wanted=self.wanted,
                opened=len(self.links),
            )

    async def _open_on(self, node: str) -> ReplicaLink | None:
        try:
            conn = await self.connect(node)
        except ShuffledError as exc:
            event(log, "replica skipped", node=node, reason=exc.message)
            return None
        link = ReplicaLink(self.config)
        try:
            await link.open(conn, self.req)
        except AuthFailed:
            raise
        except ShuffledError as exc:
            event(log, "replica skipped", node=node, code=exc.code.name, reason=exc.message)
            return None
        return link

    def forward(self, buf: Buffer, crc: int, data: int) -> None:
        """Send a stored piece to every replica: one more reference each, no copy; `data` is the bytes of its
        runs (what the counters count)."""
        for link in self.links:
            buf.retain()
            link.send(Payload(buf, crc))
        n = len(self.links)
        self.counters.replica_forwarded_buffers += n
        self.counters.replica_forwarded_bytes += n * data

    def lagging(self) -> bool:
        """A replica is `replica-lag` chunks behind: the client gets no new credit until `on_progress`."""
        lagging = False
        for link in self.links:
            lagging = link.lagging() or lagging  # every lagging link must call back once it caught up
        return lagging

    async def commit(self, lengths: list[int]) -> tuple[str, ...]:
        """Commit every replica; each must have stored exactly `lengths`. The replicas' nodes."""
        results = await asyncio.gather(*(link.commit() for link in self.links), return_exceptions=True)
        for link, got in zip(self.links, results, strict=True):
            if isinstance(got, BaseException):
                raise got
            if got != lengths:
                raise PeerUnavailable(f"replica {link.node} committed {sum(got)} bytes, the primary {sum(lengths)}")
        return self.nodes

    def abort(self) -> None:
        for link in self.links:
            link.abort()

    def _failed(self, exc: ShuffledError) -> None:
        if self.on_failure is not None:
            self.on_failure(exc)

    def _progress(self) -> None:
        if self.on_progress is not None and not self.lagging():
            self.on_progress()
