"""One end of a shuffled connection as a state machine: bytes in → events out, calls in → bytes out.

In the style of h11/h2, nothing here does IO. The asyncio shells (the daemon's
client and peer connections, the Python client) feed received bytes in and act
on the events that come out; what they want to say goes through the methods
below, which check it against the stream table and write the bytes to `send`
(the shell's sender; the tests wire two of these together in memory through an
outbox, tests/protocol_pair.py).

What lives here and nowhere else, in four parts:
- the handshake: Hello / AuthChallenge / AuthResponse / HelloAck, both halves
  (`Handshake`, handshake.py);
- the stream table: which ids each side has open, of which kind, the id rules
  (never 0, never one still open) and the per-connection limits (`StreamTable`,
  streams.py);
- each stream's lifecycle: a read is request → buffers → end, cancel or error;
  a push is open → credit → data → commit or abort, acknowledged or failed; an
  admin call is request → response or error, each a transition table of the
  stream table's (`TRANSITIONS`). What the other side's frames mean is
  `Inbound`'s (inbound.py), what this side says is the calls below;
- the sender side's credit: AddCredit and PushCredit go straight to the stream's
  `OutboundStream` (credit.py), whose items the shell's send loop frames.

Data payloads still land without a copy: the `FrameReader` asks the table for
the stream's `target`, which the shell registered when the stream opened.
Streams this side opens ("own") and streams the other side opens ("theirs")
are separate id spaces, as the spec says: on a peer link both daemons read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .codec import (
    FrameReader,
    encode,
    encode_abort,
    encode_abort_ack,
    encode_add_credit,
    encode_admin_request,
    encode_admin_response,
    encode_cancel,
    encode_commit_ack,
    encode_error,
    encode_error_from,
    encode_push_credit,
)
from .credit import OutboundStream
from .errors import ShuffledError
from .events import Event
from .frames import (
    DEFAULT_MAX_PAYLOAD,
    MAX_HANDSHAKE_BODY,
    OpenMapOutput,
    PartitionRequest,
    PushSlots,
    Role,
)
from .handshake import Handshake, Phase, Side
from .inbound import Inbound
from .streams import Kind, Limits, Step, Stream, StreamTable, Target, release_payload

#: what the shells and the clients take from here (the parts' names, so they need not know the parts)
__all__ = ["Kind", "Limits", "Phase", "ProtocolConnection", "Side", "Stream", "Target", "release_payload"]


class ProtocolConnection:
    """One end of one connection; `role` is what this side is (a client or a daemon)."""

    def __init__(
        self,
        side: Side,
        role: Role,
        *,
        secret: bytes | None = None,
        limits: Limits | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        send: Callable[[bytes], None] | None = None,
        who: str = "the other side",
    ) -> None:
        self.side = side
        self.role = role
        self.who = who
        #: the streams open, each side's, and where their payloads land
        self.streams = StreamTable(limits or Limits())
        self.reader = FrameReader(self.streams.payload_target, max_payload=max_payload, max_control=MAX_HANDSHAKE_BODY)
        self.send: Callable[[bytes], None] = send or _unwired
        self.handshake = Handshake(side, role, secret, self.reader, self._say)
        self.inbound = Inbound(self.handshake, self.streams, self._say)
        self._frames: deque[Any] = deque()

    def _say(self, data: bytes) -> None:
        """What the parts send goes where `send` points when they send (a shell sets it after making this)."""
        self.send(data)

    @property
    def features(self) -> frozenset[str]:
        """What both ends said they support in Hello/HelloAck `features` (§6): known once the handshake is done."""
        return self.handshake.features

    @property
    def is_open(self) -> bool:
        return self.handshake.phase is Phase.OPEN

    # -- bytes in

    def get_buffer(self) -> memoryview:
        return self.reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> Iterator[Event]:
        """Events for the frames `nbytes` completed, each made just before it is handed out.

        Lazily, so the shell's answer to one event (accepting a Hello, opening a
        push) is in the table before the next frame is judged. A `ShuffledError`
        raised from here or by the shell is fatal: call `discard_pending()` then.
        """
        frames = self._frames
        try:
            frames.extend(self.reader.buffer_updated(nbytes))
        except ShuffledError as exc:
            frames.extend(exc.decoded)  # never handed out, but `discard_pending` releases their payloads
            raise
        handshake, inbound = self.handshake, self.inbound
        while frames:
            frame = frames.popleft()
            if handshake.phase is Phase.OPEN:
                event = inbound.on_frame(frame)
            else:
                event = handshake.on_frame(frame, self.who)
            if event is not None:
                yield event

    def discard_pending(self) -> None:
        """After a fatal error: release the payloads of frames decoded but never handed out."""
        while self._frames:
            release_payload(self._frames.popleft())
        release_payload(self.reader.abort())

    # -- the handshake

    def start(self, info: dict[str, Any]) -> None:
        """Dialer: say Hello (with our nonce, so the acceptor can prove its secret)."""
        self.handshake.start(info)

    def challenge(self, secret: bytes) -> None:
        """Acceptor: the dialer must prove it knows `secret` before anything is created for it."""
        self.handshake.challenge(secret, self.who)

    def accept(self, info: dict[str, Any]) -> None:
        """Acceptor: take the dialer (HelloAck); its streams may open from now on."""
        self.handshake.accept(info)

    # -- calls in: streams we open

    def request_read(self, request: PartitionRequest, target: Target) -> None:
        """Open a read; its buffers land in `target` and come out as `BufferArrived`."""
        self.streams.add_own(request.receiver, Stream(Kind.READ, target=target))
        self.send(encode(request))

    def add_credit(self, receiver: int, credit: int) -> None:
        if credit <= 0:
            raise ValueError("credit must be positive")
        stream = self.streams.step(self.streams.own, receiver, Kind.READ, Step.CREDIT)
        if stream is not None and self.is_open:
            self.send(encode_add_credit(receiver, credit))

    def cancel_read(self, receiver: int) -> None:
        if self.streams.take(self.streams.own, receiver, Kind.READ) and self.is_open:
            self.send(encode_cancel(receiver))

    def open_push(self, request: OpenMapOutput, outbound: OutboundStream[Any]) -> None:
        """Open a push; PushCredit goes to `outbound`, whose data the shell frames under it."""
        self.streams.add_own(request.writer, Stream(Kind.PUSH, outbound=outbound))
        self.send(encode(request))

    def abort_push(self, writer: int) -> None:
        """Give up one of our pushes: AbortMapOutput goes out with the control frames, so the shell drops the
        data it still queues first; nothing more about the push is reported."""
        if self.streams.take(self.streams.own, writer, Kind.PUSH) and self.is_open:
            self.send(encode_abort(writer))

    def request_admin(self, op: str, args: dict[str, Any]) -> int:
        sid = self.streams.new_id()
        self.streams.add_own(sid, Stream(Kind.ADMIN))
        self.send(encode_admin_request(sid, op, args))
        return sid

    def forget(self, sid: int) -> None:
        """One of our streams ended on this side (its owner gave up): frames for it are dropped from now."""
        self.streams.own.pop(sid, None)

    # -- calls in: streams they opened

    def accept_read(self, receiver: int, outbound: OutboundStream[Any]) -> None:
        """Serve a requested read from `outbound`; AddCredit for it goes there (and what came while its
        request waited)."""
        stream = self.streams.step(self.streams.theirs, receiver, Kind.READ, Step.SERVE)
        if stream is not None:
            stream.outbound = outbound
            if stream.early_credit:
                outbound.add_credit(stream.early_credit)
                stream.early_credit = 0

    def read_finished(self, receiver: int) -> None:
        """A served read sent its end (or was shut down): its id is free for the other side again."""
        self.streams.take(self.streams.theirs, receiver, Kind.READ)

    def accept_push(self, writer: int, target: Target) -> None:
        """Their push's data lands in `target` once it has credit."""
        stream = self.streams.step(self.streams.theirs, writer, Kind.PUSH, Step.LAND)
        if stream is not None:
            stream.target = target

    def grant_push_credit(self, writer: int, credit: int, slots: list[int] | None = None) -> None:
        """`credit` more PushData, or with shared memory PushPlaced, one in each slot of `slots` (§6.3)."""
        stream = self.streams.step(self.streams.theirs, writer, Kind.PUSH, Step.GRANT)
        if stream is not None and self.is_open:
            self.send(encode_push_credit(writer, credit) if slots is None else encode(PushSlots(writer, slots)))

    def ack_commit(self, writer: int, lengths: Sequence[int]) -> None:
        self.streams.take(self.streams.theirs, writer, Kind.PUSH)
        if self.is_open:
            self.send(encode_commit_ack(writer, lengths))

    def ack_abort(self, writer: int) -> None:
        self.streams.take(self.streams.theirs, writer, Kind.PUSH)
        if self.is_open:
            self.send(encode_abort_ack(writer))

    def push_closed(self, writer: int) -> None:
        """A push ended without an answer owed (the connection's end is near, or it failed already)."""
        self.streams.take(self.streams.theirs, writer, Kind.PUSH)

    def answer_admin(self, request: int, result: dict[str, Any]) -> None:
        """Answer one of their admin requests (LIMIT_EXCEEDED for an answer over the frame limit)."""
        self.streams.admin_running -= 1
        if self.is_open:
            self.send(encode_admin_response(request, result))

    def send_error(self, stream: int, exc: ShuffledError) -> None:
        """End one of their streams with an error (it leaves the table; they may reuse its id)."""
        entry = self.streams.theirs.get(stream)
        if entry is not None:
            self.streams.take(self.streams.theirs, stream, entry.kind)
        if self.is_open:
            self.send(encode_error_from(stream, exc))

    def fail_admin(self, request: int, exc: ShuffledError) -> None:
        """Answer one of their admin requests with an error."""
        self.streams.admin_running -= 1
        if self.is_open:
            self.send(encode_error_from(request, exc))

    def fail(self, exc: ShuffledError) -> bytes:
        """A fatal error: the ErrorResponse on stream 0 to write before shutting the write side."""
        self.handshake.phase = Phase.CLOSED
        return encode_error(0, exc.code, exc.message)

    def close(self) -> None:
        """The connection is gone: nothing more is sent, the reader's memory goes now."""
        self.handshake.phase = Phase.CLOSED
        self.discard_pending()
        self.reader.close()
        self.streams.clear()


def _unwired(data: bytes) -> None:
    raise RuntimeError("the protocol connection has no transport to send to yet (set `send`)")
