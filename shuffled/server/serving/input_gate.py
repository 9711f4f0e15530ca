"""Serving a client's read: one InputGate per request, relaying into one stream.

The gate's local channel is a plan of this daemon's own pieces. Each remote
channel is a PartitionRequest over the shared connection to the daemon holding the
data; its buffers come from the gate's LocalPool (exclusive per channel, reserved
when the read opens; floating shared, taken while memory is to spare) and are
relayed to the client as they arrive, under the client's own credit. A buffer is
recycled, giving credit back to the remote sender, only after the client's
transport has flushed it, so a slow client slows only its own remote streams and
never the shared connection. The backlog the client is told includes what the
remote daemons announced they still hold, so the client's window grows with the
whole stream rather than with the few buffers this daemon has at hand.

Failover (PROTOCOL.md §10.4, §10.6; the gate's `Failover`): every location's progress is recorded as it is
relayed (`ReadProgress`: per packed group, never per run). When the daemon holding a location fails (unreachable, lost,
silent, or without the data) the gate reopens that location on the next daemon of its
placement candidates, resuming exactly where the relayed bytes stop, so the client
sees neither a gap nor a repeat. With an object store the candidates end with it: this
daemon adopts what the location's node made durable there (storage/adopt.py) and serves
it from its own store. Only when no copy is left does the read fail, with the error the
location first failed with.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from ...buffers import Buffer, Chunk, LocalPool
from ...logs import event
from ...net.channel import InputChannel
from ...net.sender import Sender
from ...net.streams import BufferResponseStream
from ...protocol.auth import token_digest
from ...protocol.credit import ChannelCredit, FloatingPool
from ...protocol.errors import AuthFailed, ErrorCode, InternalError, LimitExceeded, ProtocolError, ShuffledError
from ...protocol.frames import REPLICA, PartitionRequest
from ...protocol.resume import ReadProgress
from ..storage.view import ReadView
from .environment import ShuffleEnvironment
from .view_reader import ViewReader

log = logging.getLogger(__name__)


class ReadClient(Protocol):
    """The connection of the client a gate serves (the daemon's connections are these)."""

    @property
    def sender(self) -> Sender: ...

    def fail_read(self, rid: int, exc: ShuffledError) -> None: ...

    def gate_closed(self, rid: int) -> None: ...


class ReadPeer(Protocol):
    """The reads over the connection to a daemon a gate reads from (a connection's `PartitionRequestClient`)."""

    @property
    def is_open(self) -> bool: ...

    @property
    def reading(self) -> int: ...

    @property
    def features(self) -> frozenset[str]: ...

    def new_stream_id(self) -> int: ...

    def open_channel(self, ch: RemoteInputChannel, req: PartitionRequest) -> None: ...

    def close_channel(self, receiver: int, cancel: bool) -> None: ...

    def announce(self, ch: RemoteInputChannel) -> None: ...


class ReadLink(Protocol):
    """A connection to another daemon, as a gate reads over it (the daemon's connections are these)."""

    @property
    def requests(self) -> ReadPeer: ...


class Peers(Protocol):
    """Where a gate gets the connection to another daemon (the daemon's PeerManager)."""

    async def get(self, addr: str) -> ReadLink: ...


#: the last failover candidate when there is an object store: the location's node's durable objects
OBJECT_STORE = "object-store"

#: the errors a location fails over on: the copy is gone, silent, lost or bad, another may be fine
FAILOVER_CODES = frozenset(
    {
        ErrorCode.PEER_UNAVAILABLE,
        ErrorCode.CONNECTION_LOST,
        ErrorCode.TIMEOUT,
        ErrorCode.PARTITION_NOT_FOUND,
        ErrorCode.SHUTTING_DOWN,
        ErrorCode.CORRUPT_DATA,
    }
)


class Location:
    """One daemon's part of a read (its address and the attempts named there), followed across copies."""

    __slots__ = ("attempts", "candidates", "deadline", "error", "primary", "progress")

    def __init__(self, primary: str, attempts: list[int]) -> None:
        self.primary = primary
        self.attempts = attempts
        self.progress = ReadProgress()
        #: the error the primary failed with (what the client gets when no copy is left); None until then
        self.error: ShuffledError | None = None
        #: the copies not tried yet, in placement order
        self.candidates: list[str] = []
        #: loop time by which the search under way must have found a copy
        self.deadline = 0.0


class RemoteInputChannel(InputChannel):
    """A PartitionRequest this daemon made to another daemon on behalf of a gate."""

    __slots__ = ("closed", "conn", "gate", "location", "upstream")

    def __init__(
        self, gate: InputGate, conn: ReadPeer, receiver: int, credit: ChannelCredit, location: Location
    ) -> None:
        super().__init__(receiver, credit, verify=gate.env.config.relay_check == "crc")
        self.gate = gate
        self.conn = conn
        self.location = location
        self.closed = False
        #: the backlog the remote daemon last announced, as counted in the client stream's backlog
        self.upstream = 0

    def local_pool(self) -> LocalPool | None:
        return self.gate.pool

    def announce(self) -> None:
        self.conn.announce(self)

    def deliver(self, payload: Buffer, crc: int) -> None:
        """Relay a payload as it is (its CRC32C forwarded), counted first: a malformed one (PROTOCOL) fails
        the read instead, as the client would (the relay is this stream's reader, §7.6)."""
        self._count_upstream(self.credit.backlog)
        try:
            if not payload.length:  # at least one group (§7.6); a reader in place could not even be told of it
                raise ProtocolError("a DATA payload with no group")
            data = self.location.progress.add(payload.data())
        except ProtocolError as exc:
            payload.release()
            self.on_stream_error(ProtocolError(f"daemon {self.location.primary} sent a malformed payload: {exc}"))
            return
        self.gate.relay([Chunk(payload, crc)], data)

    def _count_upstream(self, backlog: int) -> None:
        out = self.gate.out
        if not out.closed:
            out.upstream += backlog - self.upstream
        self.upstream = backlog

    def on_end(self) -> None:
        self._finish(cancel=False)
        self.gate.location_done(self.location)

    def on_stream_error(self, exc: ShuffledError) -> None:
        self.cancel()
        self.gate.failover.location_failed(self.location, exc)

    def _finish(self, cancel: bool) -> None:
        """Done: its credit and floating buffers settle, and its service lets it go (`cancel`: the peer is
        told, the read not being over for it)."""
        self._count_upstream(0)
        self.closed = True
        self.release_floating()
        self.conn.close_channel(self.receiver, cancel)

    def cancel(self) -> None:
        if not self.closed:
            self._finish(cancel=True)

    def fail(self, exc: ShuffledError) -> None:
        """The sending daemon reported an error, or its connection died."""
        if self.closed:
            return
        self._finish(cancel=False)
        self.gate.failover.location_failed(self.location, exc)


class InputGate:
    """One client read request (partition range of one shuffle, from several daemons)."""

    def __init__(
        self,
        client: ReadClient,
        out: BufferResponseStream,
        req: PartitionRequest,
        remote: dict[str, list[int]],
        env: ShuffleEnvironment[Any],
        peers: Peers,
        node: str,
        local_pending: bool = False,
        missing: ShuffledError | None = None,
    ) -> None:
        self.client = client
        self.env = env
        self.peers = peers
        #: this daemon's name: a location here is one it lacks (`missing`), a candidate here is read locally
        self.node = node
        self.missing = missing
        self.out = out
        self.req = req
        self.remote = remote
        self.pool: LocalPool | None = None
        self.floating: FloatingPool | None = None
        self.channels: list[RemoteInputChannel] = []
        self.local_channels: list[LocalInputChannel] = []
        #: parts still to finish: one per remote daemon, plus the local data while it is loaded from disk
        self.pending = len(remote) + local_pending
        self.closed = False
        self.task: asyncio.Task[None] | None = None
        self.failover = Failover(self)
        #: exclusive buffer sets the pool holds that no channel has taken yet (one per remote daemon)
        self._spare = len(remote)

    async def open(self) -> None:
        env = self.env
        cfg = env.config
        try:
            size = len(self.remote) * cfg.exclusive_buffers
            if size > env.pool.exclusive_limit:
                raise LimitExceeded(
                    f"a read from {len(self.remote)} daemons needs {size} exclusive buffers, more than the "
                    f"{env.pool.exclusive_limit} of the read reserve reads may hold as such; use a larger "
                    "--pool-size or --read-reserve, or fewer --exclusive-buffers"
                )
            self.pool = await env.pool.create_local_pool(size, size, gate=True)
            if self.closed:
                self.pool.destroy()
                return
            self.floating = FloatingPool(cfg.floating_buffers, self.pool)
            for addr, attempts in self.remote.items():
                loc = Location(addr, attempts)
                if addr == self.node:
                    assert self.missing is not None
                    self.failover.location_failed(loc, self.missing)
                    continue
                try:
                    peer = (await self.peers.get(addr)).requests
                except ShuffledError as exc:
                    self.failover.location_failed(loc, exc)
                    continue
                if self.closed:
                    return
                await self.open_channel(loc, peer)
        except ShuffledError as exc:
            self.fail(exc)
        except Exception as exc:  # a bug must fail this read, never leave the client waiting
            self.bug("opening a read failed", exc)

    def bug(self, what: str, exc: Exception) -> None:
        event(log, what, logging.ERROR, exc_info=True, app=self.req.app, shuffle=self.req.shuffle)
        self.fail(InternalError(f"{what}: {exc.__class__.__name__}: {exc}"))

    async def open_channel(self, loc: Location, peer: ReadPeer) -> None:
        cfg = self.env.config
        if peer.reading >= cfg.max_streams_per_connection:
            raise LimitExceeded(
                f"max-streams-per-connection ({cfg.max_streams_per_connection}) reads from daemon {loc.primary} "
                "are open on its connection"
            )
        if self._spare:
            self._spare -= 1
        else:  # a failed-over location: the failed channel's buffers may still be on their way to the client
            assert self.pool is not None
            await self.pool.add_exclusive(cfg.exclusive_buffers)
            if self.closed:
                return
        assert self.floating is not None
        ch = RemoteInputChannel(
            self, peer, peer.new_stream_id(), ChannelCredit(cfg.exclusive_buffers, self.floating), loc
        )
        self.channels.append(ch)
        resume = loc.progress.resume()
        peer.open_channel(
            ch,
            PartitionRequest(
                ch.receiver,
                cfg.exclusive_buffers,
                self.req.app,
                self.req.shuffle,
                self.req.start,  # a resumed request repeats the original range (§10.6)
                self.req.end,
                {"": loc.attempts},
                self.req.token,  # the daemon holding the data checks the client's token too
                resume,
            ),
        )

    # -- relaying

    def relay(self, chunks: list[Chunk], data: int) -> None:
        """Queue payloads for the client; `data` is the bytes of their runs (counted, as Spark counts them)."""
        if self.closed:
            for chunk in chunks:
                chunk.buffer.release()
            return
        counters = self.env.counters
        counters.relayed_buffers += len(chunks)
        counters.relayed_bytes += data
        self.out.push_many(chunks)
        self.client.sender.wake(self.out)

    def location_done(self, loc: Location) -> None:
        """A location was served to its end; from another copy than the one first asked, it recovered."""
        if loc.error is not None and not self.closed:
            self.env.counters.failover_recovered += 1
        self.channel_done()

    def channel_done(self) -> None:
        self.pending -= 1
        if self.pending == 0 and not self.closed:
            self.out.end()
            self.client.sender.wake(self.out)
            self._release(cancel=False)

    def fail(self, exc: ShuffledError) -> None:
        if self.closed:
            return
        event(log, "read failed", app=self.req.app, shuffle=self.req.shuffle, code=exc.code.name, reason=exc.message)
        self.client.fail_read(self.out.stream, exc)
        self._release(cancel=True)

    def close(self) -> None:
        """The client cancelled the request or went away."""
        if not self.closed:
            self.out.shutdown()
            self._release(cancel=True)

    def _release(self, cancel: bool) -> None:
        self.closed = True
        self.client.gate_closed(self.out.stream)
        if cancel:
            for ch in self.channels:
                ch.cancel()
            for local in self.local_channels:
                local.close()
            for task in self.failover.tasks:
                task.cancel()
        if self.pool is not None:
            # Buffers still queued or in flight return to the global pool when released.
            self.pool.destroy()


class Failover:
    """A gate's failover (see the module): a failed location reopened on the next copy that can serve it."""

    def __init__(self, gate: InputGate) -> None:
        self.gate = gate
        #: searches for a copy under way
        self.tasks: set[asyncio.Task[None]] = set()

    def location_failed(self, loc: Location, exc: ShuffledError) -> None:
        """A location's channel (or local channel) failed: go on from another copy if the error allows it.

        Once the location failed over, any error of a copy moves on to the next candidate (a copy that
        refuses the resume point, is bound to another token, is full...): the read then ends with the
        location's first error, a fetch failure, so Spark recomputes instead of retrying the task. On a
        first request only FAILOVER_CODES do: INVALID_REQUEST, say, is the client's mistake.
        """
        if self.gate.closed:
            return
        if exc.code not in FAILOVER_CODES and loc.error is None:
            self.gate.fail(exc)
            return
        cfg = self.gate.env.config
        # Each search is bounded, not the location's whole life: a copy may serve for long before it fails.
        loc.deadline = asyncio.get_running_loop().time() + cfg.failover_timeout
        if loc.error is None:
            loc.error = exc
            loc.candidates = self.gate.env.membership.candidates(loc.primary, self.gate.req.app, self.gate.req.shuffle)
            if self.gate.env.storage.has_object_store:
                loc.candidates.append(OBJECT_STORE)
        self.gate.env.counters.failover_tries[exc.code.name] += 1
        event(
            log,
            "read failing over",
            app=self.gate.req.app,
            shuffle=self.gate.req.shuffle,
            primary=loc.primary,
            code=exc.code.name,
            reason=exc.message,
            left=len(loc.candidates),
        )
        task = asyncio.create_task(self._search(loc))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _search(self, loc: Location) -> None:
        """Reopen `loc` on its next candidate that can serve it; without one, fail with its first error."""
        try:
            async with asyncio.timeout_at(loc.deadline):
                while loc.candidates and not self.gate.closed:
                    node = loc.candidates.pop(0)
                    if node == OBJECT_STORE and await self._adopt(loc) and self._read_locally(loc):
                        return
                    if node == self.gate.node:
                        if self._read_locally(loc):
                            return
                        continue
                    if node == OBJECT_STORE:
                        continue
                    try:
                        peer = (await self.gate.peers.get(node)).requests
                    except ShuffledError:
                        continue
                    if loc.progress.resume() is not None and REPLICA not in peer.features:
                        continue  # it would not understand `resume` and resend what was relayed
                    try:
                        await self.gate.open_channel(loc, peer)
                    except ShuffledError:
                        continue  # e.g. its connection has no stream left: the next copy may
                    return
        except TimeoutError:
            pass
        except Exception as exc:  # a bug must fail this read, never leave the client waiting
            self.gate.bug("failing over a read failed", exc)
            return
        if not self.gate.closed:
            assert loc.error is not None
            self.gate.env.counters.failover_exhausted += 1
            self.gate.fail(loc.error)

    async def _adopt(self, loc: Location) -> bool:
        """Adopt what the location's node made durable in the object store, unless this daemon holds its
        attempts already; whether it may hold them now."""
        req = self.gate.req
        try:
            await self.gate.env.storage.adopt(req.app, req.shuffle, loc.primary, loc.attempts)
        except ShuffledError as exc:
            event(log, "object store not read", logging.WARNING, primary=loc.primary, reason=exc.message)
            return False
        return not self.gate.closed

    def _read_locally(self, loc: Location) -> bool:
        """This daemon is a candidate: serve the location from its own store if it holds the attempts and
        the client's token is the one their application is bound to now (it may have had no binding here
        when the read arrived)."""
        resume = loc.progress.resume()
        req = self.gate.req
        try:
            view = self.gate.env.storage.read(
                req.app, req.shuffle, req.start, req.end, loc.attempts, resume, token_digest(req.token)
            )
        except AuthFailed as exc:
            event(log, "request refused", logging.WARNING, app=req.app, primary=loc.primary, reason=exc.message)
            return False
        except ShuffledError:
            return False
        if resume is not None:
            self.gate.env.counters.resumed_reads += 1
        self.gate.local_channels.append(LocalInputChannel(self.gate, loc, view))
        return True


class LocalInputChannel:
    """A failed location served from this daemon's own copy, from where the relayed bytes stop.

    Its view's payloads are relayed like a remote channel's, with at most a channel's worth (exclusive
    plus floating) queued on the client stream and not yet sent.
    """

    __slots__ = ("gate", "limit", "location", "reader")

    def __init__(self, gate: InputGate, location: Location, view: ReadView) -> None:
        cfg = gate.env.config
        self.gate = gate
        self.location = location
        self.limit = cfg.exclusive_buffers + cfg.floating_buffers
        self.reader = ViewReader(view, self._relay, self._room, self._done, self._failed)
        gate.out.feeds.append(self.reader)
        self.reader.start()

    def _room(self) -> int:
        return self.limit - self.gate.out.queued

    def _relay(self, chunks: list[Chunk], data: int) -> None:
        progress, gate = self.location.progress, self.gate
        for chunk in chunks:
            progress.add(chunk.buffer.data())
        gate.relay(chunks, data)

    def _done(self) -> None:
        self._detach()
        self.gate.location_done(self.location)

    def _failed(self, exc: ShuffledError) -> None:
        self._detach()
        self.gate.failover.location_failed(self.location, exc)

    def _detach(self) -> None:
        feeds = self.gate.out.feeds
        if self.reader in feeds:
            feeds.remove(self.reader)

    def close(self) -> None:
        """The read ended or failed: stop serving (what the view holds goes back)."""
        self._detach()
        self.reader.close()
