"""The per-connection send loop: credit-aware, round-robin, watermark-bounded.

Control frames go out as soon as the loop runs. Data frames come from streams in
a `SendScheduler` and stop while the transport is above its high write watermark
(`pause_writing`), resuming below the low one (`resume_writing`). Several frames go
out in one `writelines`; headers are packed into one bytearray per batch and
payloads are memoryviews of pool segments.

uvloop keeps a reference to written memoryviews until the kernel has taken the
bytes, so a payload's buffer is released only once the transport's count of
unsent bytes shows it has left (`_reap`). When the loop goes idle with bytes still
queued, it sets the high watermark to 0 for a moment: the transport then calls
`resume_writing` exactly when everything is flushed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from ..buffers import Buffer
from ..protocol.credit import OutboundStream, SendScheduler
from .once_per_turn import OncePerTurn

DEFAULT_HIGH_WATERMARK = 1 << 20
DEFAULT_LOW_WATERMARK = 256 << 10
_BATCH_BYTES = 256 << 10
_BATCH_FRAMES = 64
#: the most one `Outbound.pack` writes into a batch's headers (most frames take at most 64 bytes; a PushPlaced
#: naming many groups takes more, streams.py)
MAX_PREFIX = 1 << 10
#: bytes a flush may copy into a client's shared memory before it lets the loop turn (the frames naming them
#: are small, so the watermarks never stop it): what a socket's high watermark lets one connection write
COPY_BYTES_PER_TURN = DEFAULT_HIGH_WATERMARK


class Outbound(OutboundStream[Any]):
    """An outbound stream that knows how to frame its items."""

    __slots__ = ("blocked_since", "sender")

    def __init__(self, stream: int, credit: int) -> None:
        super().__init__(stream, credit)
        self.sender: Sender | None = None
        #: loop time since when data waits for credit (None: not waiting)
        self.blocked_since: float | None = None

    def pack(
        self, into: bytearray, offset: int, item: Any, seq: int, backlog: int, is_event: bool
    ) -> tuple[int, Buffer | None]:
        """Write the frame prefix at `offset`, at most `MAX_PREFIX` bytes; return (prefix length, buffer whose
        data follows or None)."""
        raise NotImplementedError

    def on_sent(self, item: Any, is_event: bool) -> None:
        """Called after the item was handed to the transport (before it is flushed)."""

    def discard(self, item: Any) -> None:
        """Release an item that will never be sent."""
        buf = getattr(item, "buffer", None)
        if buf is not None:
            buf.release()

    def shutdown(self) -> None:
        """Stop the stream and release what it still queues."""
        if self.sender is not None:
            self.sender.unblocked(self)
        for item in self.close():
            self.discard(item)


class UnsentTally:
    """Bytes of control frames not yet taken by the kernel over many senders (a daemon's connections): kept
    up to date as frames are queued and reaped, so a bound over all of them costs nothing to look at. It
    may run high (a sender reaps when it looks), never low."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class Sender:
    def __init__(
        self,
        transport: asyncio.WriteTransport,
        high: int = DEFAULT_HIGH_WATERMARK,
        low: int = DEFAULT_LOW_WATERMARK,
        tally: UnsentTally | None = None,
    ) -> None:
        self.transport = transport
        self.tally = tally if tally is not None else UnsentTally()
        self.high = high
        self.low = low
        transport.set_write_buffer_limits(high=high, low=low)
        self.scheduler: SendScheduler[Any] = SendScheduler()
        self._control: list[bytes] = []
        #: bytes of the control frames queued for this loop turn
        self._control_bytes = 0
        self._inflight: deque[tuple[int, Buffer]] = deque()
        #: (end position, bytes) of control frames handed to the transport and maybe not yet taken by the kernel
        self._control_lent: deque[tuple[int, int]] = deque()
        self._control_lent_bytes = 0
        self._written = 0
        self.paused = False
        self._draining = False
        self._schedule_flush = OncePerTurn(self._flush)
        self.closed = False
        self._loop = asyncio.get_running_loop()
        #: seconds spent paused above the high watermark (for metrics)
        self.paused_since: float | None = None
        self.paused_seconds = 0.0
        self.frames_sent = 0
        self.bytes_sent = 0
        #: bytes this loop turn's flush copied into shared memory (a stream's `pack` adds them;
        #: COPY_BYTES_PER_TURN bounds them)
        self.copied = 0
        #: seconds streams of this connection had data queued and no credit (counted when credit arrives)
        self.zero_credit_seconds = 0.0

    # -- what the connection calls

    def send_control(self, frame: bytes) -> None:
        if self.closed:
            return
        self._control.append(frame)
        self._control_bytes += len(frame)
        self.tally.bytes += len(frame)
        self._schedule()

    def control_unsent(self) -> int:
        """Bytes of control frames not yet taken by the kernel (at most that: a frame counts until its last
        byte left). Unlike data, which is pool memory lent to the transport, these are copies the connection
        holds: what a party that does not read can make a daemon queue."""
        self._reap()
        return self._control_bytes + self._control_lent_bytes

    @property
    def flushed(self) -> int:
        """Bytes the kernel has taken so far: a party that reads makes it grow."""
        return self._written - self.transport.get_write_buffer_size()

    def wake(self, stream: Outbound) -> None:
        if self.closed:
            return
        stream.sender = self
        if stream.blocked_since is not None and stream.credit > 0:
            self.unblocked(stream)
        self.scheduler.wake(stream)
        if self.scheduler:
            self._schedule()

    def unblocked(self, stream: Outbound) -> None:
        """The stream no longer waits for credit (credit came, or it ended): count the time it did."""
        if stream.blocked_since is not None:
            self.zero_credit_seconds += self._loop.time() - stream.blocked_since
            stream.blocked_since = None

    def pause_writing(self) -> None:
        self.paused = True
        if not self._draining:
            self.paused_since = self._loop.time()

    def resume_writing(self) -> None:
        self.paused = False
        if self.paused_since is not None:
            self.paused_seconds += self._loop.time() - self.paused_since
            self.paused_since = None
        if self._draining:
            self._draining = False
            self.transport.set_write_buffer_limits(high=self.high, low=self.low)
        self._reap()
        self._schedule()

    def flush_control(self) -> None:
        """Hand the control frames queued for this loop turn to the transport now (a connection closing
        on purpose still sends the answers it made; a push through shared memory tells its new credit
        before it stores the frame that freed it). Data frames keep to the turn's end."""
        if self._control and not self.closed and not self.transport.is_closing():
            control, self._control = self._control, []
            self.transport.writelines(control)
            self._written += self._control_bytes
            self._control_lent.append((self._written, self._control_bytes))
            self._control_lent_bytes += self._control_bytes
            self._control_bytes = 0

    def stop(self) -> None:
        """Send nothing more; what the transport holds stays lent until `close`."""
        self.closed = True
        self._control.clear()
        self.tally.bytes -= self._control_bytes
        self._control_bytes = 0

    def close(self) -> None:
        """Connection is gone: everything lent to the transport comes back."""
        self.closed = True
        while self._inflight:
            self._inflight.popleft()[1].release()
        self._control.clear()
        self.tally.bytes -= self._control_bytes + self._control_lent_bytes
        self._control_bytes = 0
        self._control_lent.clear()
        self._control_lent_bytes = 0

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    # -- the loop

    def _schedule(self) -> None:
        if not self.closed:
            self._schedule_flush()

    def _flush(self) -> None:
        if self.closed or self.transport.is_closing():
            return
        self.flush_control()
        self.copied = 0
        while self.scheduler and not self.paused and not self.closed:
            self._send_batch()
            if self.copied >= COPY_BYTES_PER_TURN:  # the rest at the next turn: other connections go first
                self._schedule()
                return
        self._reap()
        if self._inflight and not self.paused and not self.closed:
            # Idle with bytes still queued: ask for a callback when all are flushed.
            self._draining = True
            self.transport.set_write_buffer_limits(high=0, low=0)

    def _send_batch(self) -> None:
        scheduler = self.scheduler
        headers = bytearray(64 * _BATCH_FRAMES + MAX_PREFIX)
        hview = memoryview(headers)
        parts: list[Any] = []
        lent: list[tuple[int, Buffer]] = []
        offset = 0
        nbytes = 0
        frames = 0
        while frames < _BATCH_FRAMES and nbytes < _BATCH_BYTES and offset <= 64 * _BATCH_FRAMES:
            nxt = scheduler.next() if self.copied < COPY_BYTES_PER_TURN else None
            if nxt is None:
                break
            stream, item, seq, backlog, is_event = nxt
            assert isinstance(stream, Outbound)
            n, buf = stream.pack(headers, offset, item, seq, backlog, is_event)
            parts.append(hview[offset : offset + n])
            offset += n
            nbytes += n
            if buf is not None and buf.length:
                parts.append(buf.memory[: buf.length])
                nbytes += buf.length
                lent.append((self._written + nbytes, buf))
            elif buf is not None:
                buf.release()
            frames += 1
            stream.on_sent(item, is_event)
            if stream.credit == 0 and stream.backlog and stream.blocked_since is None:
                stream.blocked_since = self._loop.time()
        if not parts:
            return
        self._inflight.extend(lent)
        self._written += nbytes
        self.frames_sent += frames
        self.bytes_sent += nbytes
        self.transport.writelines(parts)
        self._reap()

    def _reap(self) -> None:
        if not self._inflight and not self._control_lent:
            return
        flushed = self._written - self.transport.get_write_buffer_size()
        inflight = self._inflight
        while inflight and inflight[0][0] <= flushed:
            inflight.popleft()[1].release()
        lent = self._control_lent
        while lent and lent[0][0] <= flushed:
            n = lent.popleft()[1]
            self._control_lent_bytes -= n
            self.tally.bytes -= n
