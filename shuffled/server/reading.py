"""Serving a client's read: one InputGate per request, relaying into one stream.

The gate's local channel is a snapshot of this daemon's own chunks. Each remote
channel is a PartitionRequest over the shared connection to the daemon holding the
data; its buffers come from the gate's LocalPool (exclusive per channel, reserved
when the read opens; floating shared, taken while memory is to spare) and are
relayed to the client as they arrive, under the client's own credit. A buffer is
recycled, giving credit back to the remote sender, only after the client's
transport has flushed it, so a slow client slows only its own remote streams and
never the shared connection. The backlog the client is told includes what the
remote daemons announced they still hold, so the client's window grows with the
whole stream rather than with the few buffers this daemon has at hand.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from ..buffers import LocalPool
from ..logs import event
from ..net.channel import InputChannel
from ..net.sender import Sender
from ..net.streams import BufferResponseStream
from ..protocol.credit import ChannelCredit, FloatingPool
from ..protocol.errors import InternalError, LimitExceeded, ShuffledError
from ..protocol.frames import PartitionRequest
from .chunks import Chunk
from .services import Services

log = logging.getLogger(__name__)


class ReadClient(Protocol):
    """The connection of the client a gate serves (the daemon's connections are these)."""

    @property
    def sender(self) -> Sender: ...

    @property
    def served(self) -> dict[int, BufferResponseStream]: ...

    @property
    def gates(self) -> dict[int, InputGate]: ...

    def send_error(self, stream: int, exc: ShuffledError) -> None: ...


class ReadPeer(Protocol):
    """The reads over the connection to a daemon a gate reads from (a connection's `ReadService`)."""

    @property
    def is_open(self) -> bool: ...

    @property
    def channels(self) -> dict[int, RemoteInputChannel]: ...

    def new_stream_id(self) -> int: ...

    def open_channel(self, ch: RemoteInputChannel, req: PartitionRequest) -> None: ...

    def cancel_channel(self, receiver: int) -> None: ...

    def announce(self, ch: RemoteInputChannel) -> None: ...


class PeerLink(Protocol):
    """A connection to another daemon (the daemon's connections are these)."""

    @property
    def reads(self) -> ReadPeer: ...


class Peers(Protocol):
    """Where a gate gets the connection to another daemon (the daemon's PeerManager)."""

    async def get(self, addr: str) -> PeerLink: ...


class RemoteInputChannel(InputChannel):
    """A PartitionRequest this daemon made to another daemon on behalf of a gate."""

    __slots__ = ("closed", "conn", "gate", "upstream")

    def __init__(self, gate: InputGate, conn: ReadPeer, receiver: int, credit: ChannelCredit) -> None:
        super().__init__(receiver, credit, verify=gate.services.config.relay_check == "crc")
        self.gate = gate
        self.conn = conn
        self.closed = False
        #: the backlog the remote daemon last announced, as counted in the client stream's backlog
        self.upstream = 0

    def local_pool(self) -> LocalPool | None:
        return self.gate.pool

    def announce(self) -> None:
        self.conn.announce(self)

    def deliver(self, chunk: Chunk) -> None:
        self._count_upstream(self.credit.backlog)
        self.gate.relay(chunk)

    def _count_upstream(self, backlog: int) -> None:
        out = self.gate.out
        if not out.closed:
            out.upstream += backlog - self.upstream
        self.upstream = backlog

    def on_end(self) -> None:
        self._finish()
        self.gate.channel_done()

    def on_stream_error(self, exc: ShuffledError) -> None:
        self.gate.fail(exc)

    def _finish(self) -> None:
        self._count_upstream(0)
        self.closed = True
        self.conn.channels.pop(self.receiver, None)
        self.release_floating()

    def cancel(self) -> None:
        if self.closed:
            return
        self._finish()
        self.conn.cancel_channel(self.receiver)

    def fail(self, exc: ShuffledError) -> None:
        """The sending daemon reported an error, or its connection died."""
        if self.closed:
            return
        self._finish()
        self.gate.fail(exc)


class InputGate:
    """One client read request (partition range of one shuffle, from several daemons)."""

    def __init__(
        self,
        client: ReadClient,
        out: BufferResponseStream,
        req: PartitionRequest,
        remote: dict[str, list[int]],
        services: Services,
        peers: Peers,
        local_pending: bool = False,
    ) -> None:
        self.client = client
        self.services = services
        self.peers = peers
        self.out = out
        self.req = req
        self.remote = remote
        self.pool: LocalPool | None = None
        self.channels: list[RemoteInputChannel] = []
        #: parts still to finish: one per remote daemon, plus the local data while it is loaded from disk
        self.pending = len(remote) + local_pending
        self.closed = False
        self.task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        services = self.services
        cfg = services.config
        try:
            size = len(self.remote) * cfg.exclusive
            if size > services.pool.reserve:
                raise LimitExceeded(
                    f"a read from {len(self.remote)} daemons needs {size} exclusive buffers, more than the read "
                    f"reserve of {services.pool.reserve}; use a larger --pool-size or fewer --exclusive-buffers"
                )
            self.pool = await services.pool.create_local_pool(size, size, use_reserve=True)
            if self.closed:
                self.pool.destroy()
                return
            floating = FloatingPool(cfg.floating, self.pool)
            for addr, attempts in self.remote.items():
                peer = (await self.peers.get(addr)).reads
                if self.closed:
                    return
                if len(peer.channels) >= cfg.max_streams_per_connection:
                    raise LimitExceeded(
                        f"max-streams-per-connection ({cfg.max_streams_per_connection}) reads from daemon {addr} "
                        "are open on its connection"
                    )
                credit = ChannelCredit(cfg.exclusive, floating)
                ch = RemoteInputChannel(self, peer, peer.new_stream_id(), credit)
                self.channels.append(ch)
                peer.open_channel(
                    ch,
                    PartitionRequest(
                        ch.receiver,
                        cfg.exclusive,
                        self.req.app,
                        self.req.shuffle,
                        self.req.start,
                        self.req.end,
                        {"": attempts},
                        self.req.token,  # the daemon holding the data checks the client's token too
                    ),
                )
        except ShuffledError as exc:
            self.fail(exc)
        except Exception as exc:  # a bug must fail this read, never leave the client waiting
            event(
                log,
                "opening a read failed",
                logging.ERROR,
                exc_info=True,
                app=self.req.app,
                shuffle=self.req.shuffle,
            )
            self.fail(InternalError(f"opening the read failed: {exc.__class__.__name__}: {exc}"))

    def relay(self, chunk: Chunk) -> None:
        if self.closed:
            chunk.buffer.release()
            return
        counters = self.services.counters
        counters.relayed_buffers += 1
        counters.relayed_bytes += chunk.buffer.length
        self.out.push_data(chunk)
        self.client.sender.wake(self.out)

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
        self.out.shutdown()
        self.client.served.pop(self.out.stream, None)
        self.client.send_error(self.out.stream, exc)
        self._release(cancel=True)

    def close(self) -> None:
        """The client cancelled the request or went away."""
        if not self.closed:
            self.out.shutdown()
            self._release(cancel=True)

    def _release(self, cancel: bool) -> None:
        self.closed = True
        self.client.gates.pop(self.out.stream, None)
        if cancel:
            for ch in self.channels:
                ch.cancel()
        if self.pool is not None:
            # Buffers still queued or in flight return to the global pool when released.
            self.pool.destroy()
