"""Serving a client's read: one InputGate per request, relaying into one stream.

The gate's local channel is a snapshot of this daemon's own chunks. Each remote
channel is a PartitionRequest over the shared connection to the daemon holding the
data; its buffers come from the gate's LocalPool (exclusive per channel, floating
shared, Flink's defaults 2 and 8) and are relayed to the client as they arrive,
under the client's own credit. A buffer is recycled, giving credit back to the
remote sender, only after the client's transport has flushed it, so a slow client
slows only its own remote streams and never the shared connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..buffers import Buffer, LocalPool
from ..net.streams import BufferResponseStream, Chunk
from ..protocol.codec import encode_cancel, encode_error
from ..protocol.credit import ChannelCredit, FloatingPool, SequenceChecker
from ..protocol.errors import CreditViolation, InternalError, ShuffledError
from ..protocol.frames import BufferKind, BufferResponse, PartitionRequest

if TYPE_CHECKING:
    from .connection import DaemonConnection

log = logging.getLogger("shuffled.read")


class RemoteInputChannel:
    __slots__ = ("closed", "conn", "credit", "gate", "receiver", "seq")

    def __init__(self, gate: InputGate, conn: DaemonConnection, receiver: int, credit: ChannelCredit) -> None:
        self.gate = gate
        self.conn = conn
        self.receiver = receiver
        self.credit = credit
        self.seq = SequenceChecker()
        self.closed = False

    def target(self, length: int) -> tuple[memoryview, Buffer]:
        pool = self.gate.pool
        buf = pool.request() if pool is not None else None
        if buf is None:
            raise CreditViolation(f"stream {self.receiver}: buffer arrived with no free buffer behind its credit")
        buf.set_recycler(self._recycle)
        return buf.memory[:length], buf

    def on_buffer(self, frame: BufferResponse) -> None:
        try:
            self.seq.check(frame.sequence)
        except ShuffledError as exc:
            if isinstance(frame.payload, Buffer):
                frame.payload.release()
            self.gate.fail(exc)
            return
        if frame.kind is BufferKind.END_OF_PARTITION:
            self._finish()
            self.gate.channel_done()
            return
        buf: Buffer = frame.payload
        buf.length = frame.length
        if self.credit.on_buffer(frame.backlog):
            self.conn.announce(self)
        self.gate.relay(Chunk(buf, frame.partition, frame.attempt))

    def _recycle(self, buf: Buffer) -> None:
        pool = self.gate.pool
        assert pool is not None
        pool.recycle(buf)
        mine, others = self.credit.on_recycle()
        if mine:
            self.conn.announce(self)
        for other in others:
            ch = other.owner
            assert isinstance(ch, RemoteInputChannel)
            ch.conn.announce(ch)

    def _finish(self) -> None:
        self.closed = True
        self.conn.channels.pop(self.receiver, None)
        for other in self.credit.close():
            ch = other.owner
            assert isinstance(ch, RemoteInputChannel)
            ch.conn.announce(ch)

    def cancel(self) -> None:
        if self.closed:
            return
        self._finish()
        if self.conn.is_open:
            self.conn.sender.send_control(encode_cancel(self.receiver))

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
        client: DaemonConnection,
        out: BufferResponseStream,
        req: PartitionRequest,
        remote: dict[str, list[int]],
    ) -> None:
        self.client = client
        self.out = out
        self.req = req
        self.remote = remote
        self.pool: LocalPool | None = None
        self.channels: list[RemoteInputChannel] = []
        self.pending = len(remote)
        self.closed = False
        self.task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        daemon = self.client.daemon
        cfg = daemon.config
        try:
            size = len(self.remote) * cfg.exclusive + cfg.floating
            self.pool = await daemon.pool.create_local_pool(size, size, use_reserve=True)
            if self.closed:
                self.pool.destroy()
                return
            floating = FloatingPool(cfg.floating)
            for addr, attempts in self.remote.items():
                peer = await daemon.peers.get(addr)
                if self.closed:
                    return
                credit = ChannelCredit(cfg.exclusive, floating)
                ch = RemoteInputChannel(self, peer, peer.new_stream_id(), credit)
                credit.owner = ch
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
                    ),
                )
        except ShuffledError as exc:
            self.fail(exc)
        except Exception as exc:  # a bug must fail this read, never leave the client waiting
            log.exception("opening a read failed")
            self.fail(InternalError(f"opening the read failed: {exc.__class__.__name__}: {exc}"))

    def relay(self, chunk: Chunk) -> None:
        if self.closed:
            chunk.buffer.release()
            return
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
        log.info(
            "read failed app=%s shuffle=%s code=%s reason=%s",
            self.req.app,
            self.req.shuffle,
            exc.code.name,
            exc.message,
        )
        self.out.shutdown()
        self.client.served.pop(self.out.stream, None)
        if self.client.is_open:
            self.client.sender.send_control(encode_error(self.out.stream, exc.code, exc.message))
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
