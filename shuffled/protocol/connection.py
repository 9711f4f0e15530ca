"""One end of a shuffled connection as a state machine: bytes in → events out, calls in → bytes out.

In the style of h11/h2, nothing here does IO. The asyncio shells (the daemon's
client and peer connections, the Python client) feed received bytes in and act
on the events that come out; what they want to say goes through the methods
below, which check it against the stream table and write the bytes to `send`
(by default an outbox that `data_to_send()` empties, which is how the tests
wire two of these together in memory).

What lives here and nowhere else:
- the handshake: Hello / AuthChallenge / AuthResponse / HelloAck, both halves;
- the stream table: which ids each side has open, of which kind, the id rules
  (never 0, never one still open) and the per-connection limits;
- each stream's lifecycle: a read is request → buffers → end, cancel or error;
  a push is open → credit → data → commit or abort, acknowledged or failed; an
  admin call is request → response or error;
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
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .auth import AcceptorAuth, DialerAuth
from .codec import (
    FrameReader,
    encode,
    encode_abort,
    encode_abort_ack,
    encode_add_credit,
    encode_admin_request,
    encode_admin_response,
    encode_auth_challenge,
    encode_auth_response,
    encode_cancel,
    encode_commit_ack,
    encode_error,
    encode_error_from,
    encode_push_credit,
)
from .credit import OutboundStream
from .errors import (
    CreditViolation,
    LimitExceeded,
    ProtocolError,
    ShuffledError,
    UnknownStream,
    error_from_code,
)
from .events import (
    Aborted,
    AbortRequested,
    AdminAnswered,
    AdminRequested,
    Authenticated,
    BufferArrived,
    CloseRequested,
    CommitRequested,
    Committed,
    ConnectionFailed,
    CreditAdded,
    Event,
    HandshakeDone,
    HelloReceived,
    PushCredited,
    PushDataArrived,
    PushOpened,
    ReadCancelled,
    ReadRequested,
    StreamFailed,
    StreamRefused,
)
from .frames import (
    DEFAULT_MAX_PAYLOAD,
    MAX_CONTROL_BODY,
    MAX_HANDSHAKE_BODY,
    MAX_STREAMS_PER_CONNECTION,
    REPLICA,
    AbortAck,
    AbortMapOutput,
    AddCredit,
    AdminRequest,
    AdminResponse,
    AuthChallenge,
    AuthResponse,
    BufferKind,
    BufferResponse,
    CancelPartitionRequest,
    Close,
    CommitAck,
    CommitMapOutput,
    ErrorResponse,
    Frame,
    FrameType,
    Hello,
    HelloAck,
    OpenMapOutput,
    PartitionRequest,
    PushCredit,
    PushData,
    Role,
)

#: where a stream's next data payload goes: (memory to fill, token that comes back as the frame's payload)
Target = Callable[[int], tuple[memoryview, Any]]


class Side(Enum):
    DIALER = "dialer"
    ACCEPTOR = "acceptor"


class Phase(Enum):
    HELLO = "hello"  # dialer: Hello sent, waiting for HelloAck; acceptor: waiting for Hello
    ANSWER = "answer"  # acceptor: Hello arrived, the shell decides (challenge or accept)
    AUTH = "auth"  # acceptor: AuthChallenge sent, waiting for AuthResponse
    OPEN = "open"
    CLOSED = "closed"


class Kind(Enum):
    READ = "read"
    PUSH = "push"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Limits:
    """What the other side may have open at once; beyond it a new stream is refused with LIMIT_EXCEEDED."""

    streams: int = MAX_STREAMS_PER_CONNECTION  # reads served plus pushes
    pushes: int = MAX_STREAMS_PER_CONNECTION
    admin: int = 64


@dataclass(slots=True)
class Stream:
    kind: Kind
    target: Target | None = None
    outbound: OutboundStream[Any] | None = None


def release_payload(item: object) -> None:
    """Give back the pool buffer a decoded data frame (or an event carrying one, or the reader's token for
    a payload cut short) holds, if nobody took it."""
    frame = getattr(item, "frame", item)
    buf: Any = getattr(frame, "payload", frame)
    if getattr(buf, "refs", 0):
        buf.release()


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
        self.limits = limits or Limits()
        self.phase = Phase.HELLO
        #: the other side's role, once its Hello (acceptor) or our dialing (dialer) says it
        self.peer_role: Role | None = None
        self.who = who
        self.reader = FrameReader(self._payload_target, max_payload=max_payload, max_control=MAX_HANDSHAKE_BODY)
        self._outbox: list[bytes] = []
        self.send: Callable[[bytes], None] = send or self._outbox.append
        self._dialer = DialerAuth(secret) if side is Side.DIALER else None
        self._acceptor: AcceptorAuth | None = None
        self._hello: Hello | None = None
        #: streams this side opened, and streams the other side opened
        self.own: dict[int, Stream] = {}
        self.theirs: dict[int, Stream] = {}
        #: their pushes in the table (checked against `limits.pushes` on every open)
        self.pushes_open = 0
        #: their admin requests not yet answered (counted, not tracked: admin ids need not be unique)
        self.admin_running = 0
        self._next_id = 1
        self._frames: deque[Any] = deque()
        #: what both ends said they support in Hello/HelloAck `features` (§6): known once the handshake is done
        self.features: frozenset[str] = frozenset()
        self._offered: frozenset[str] = frozenset()

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
        while frames:
            frame = frames.popleft()
            event = self._on_frame(frame)
            if event is not None:
                yield event

    def receive_data(self, data: bytes, handle: Callable[[Event], None] | None = None) -> list[Event]:
        """Copying convenience for tests and tools: feed bytes, collect every event.

        `handle` acts on each event as it comes, as a shell does, before the next frame is judged.
        """
        events: list[Event] = []
        view = memoryview(data)
        while view:
            buf = self.get_buffer()
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            view = view[n:]
            for event in self.buffer_updated(n):
                if handle is not None:
                    handle(event)
                events.append(event)
        return events

    def discard_pending(self) -> None:
        """After a fatal error: release the payloads of frames decoded but never handed out."""
        while self._frames:
            release_payload(self._frames.popleft())
        release_payload(self.reader.abort())

    def data_to_send(self) -> bytes:
        out = b"".join(self._outbox)
        self._outbox.clear()
        return out

    # -- the handshake

    def start(self, info: dict[str, Any]) -> None:
        """Dialer: say Hello (with our nonce, so the acceptor can prove its secret)."""
        assert self._dialer is not None, "only a dialer says Hello first"
        self._offered = _features(info)
        self.send(encode(Hello(self.role, info=self._dialer.hello_info(info))))

    def challenge(self, secret: bytes) -> None:
        """Acceptor: the dialer must prove it knows `secret` before anything is created for it."""
        assert self.phase is Phase.ANSWER and self._hello is not None
        self._acceptor = AcceptorAuth(secret, self._hello.info.get("nonce"), self.who)
        self.phase = Phase.AUTH
        self.send(encode_auth_challenge(*self._acceptor.challenge()))

    def accept(self, info: dict[str, Any]) -> None:
        """Acceptor: take the dialer (HelloAck); its streams may open from now on."""
        assert self.phase in (Phase.ANSWER, Phase.AUTH) and self._hello is not None
        self.features = _features(info) & _features(self._hello.info)
        self._acceptor = self._hello = None
        self._open()
        self.send(encode(HelloAck(self.role, info=info)))

    def _open(self) -> None:
        self.phase = Phase.OPEN
        self.reader.set_max_control(MAX_CONTROL_BODY)

    @property
    def is_open(self) -> bool:
        return self.phase is Phase.OPEN

    # -- calls in: streams we open

    def new_stream_id(self) -> int:
        """A counter from 1, wrapping past 2^32-1 (PROTOCOL.md §5), skipping ids still open."""
        while True:
            sid = self._next_id
            self._next_id = sid + 1 if sid < 0xFFFFFFFF else 1
            if sid not in self.own:
                return sid

    def _own(self, sid: int, stream: Stream) -> None:
        if sid == 0 or sid in self.own:
            raise ValueError(f"stream id {sid} is reserved or already open on this side")
        self.own[sid] = stream

    def request_read(self, request: PartitionRequest, target: Target) -> None:
        """Open a read; its buffers land in `target` and come out as `BufferArrived`."""
        self._own(request.receiver, Stream(Kind.READ, target=target))
        self.send(encode(request))

    def add_credit(self, receiver: int, credit: int) -> None:
        if credit <= 0:
            raise ValueError("credit must be positive")
        stream = self.own.get(receiver)
        if stream is not None and stream.kind is Kind.READ and self.is_open:
            self.send(encode_add_credit(receiver, credit))

    def cancel_read(self, receiver: int) -> None:
        if self._take(self.own, receiver, Kind.READ) and self.is_open:
            self.send(encode_cancel(receiver))

    def open_push(self, request: OpenMapOutput, outbound: OutboundStream[Any]) -> None:
        """Open a push; PushCredit goes to `outbound`, whose data the shell frames under it."""
        self._own(request.writer, Stream(Kind.PUSH, outbound=outbound))
        self.send(encode(request))

    def abort_push(self, writer: int) -> None:
        """Give up one of our pushes: AbortMapOutput goes out with the control frames, so the shell drops the
        data it still queues first; nothing more about the push is reported."""
        if self._take(self.own, writer, Kind.PUSH) and self.is_open:
            self.send(encode_abort(writer))

    def request_admin(self, op: str, args: dict[str, Any]) -> int:
        sid = self.new_stream_id()
        self._own(sid, Stream(Kind.ADMIN))
        self.send(encode_admin_request(sid, op, args))
        return sid

    def forget(self, sid: int) -> None:
        """One of our streams ended on this side (its owner gave up): frames for it are dropped from now."""
        self.own.pop(sid, None)

    # -- calls in: streams they opened

    def accept_read(self, receiver: int, outbound: OutboundStream[Any]) -> None:
        """Serve a requested read from `outbound`; AddCredit for it goes there."""
        stream = self.theirs.get(receiver)
        if stream is not None:
            stream.outbound = outbound

    def read_finished(self, receiver: int) -> None:
        """A served read sent its end (or was shut down): its id is free for the other side again."""
        self._take(self.theirs, receiver, Kind.READ)

    def accept_push(self, writer: int, target: Target) -> None:
        stream = self.theirs.get(writer)
        if stream is not None:
            stream.target = target

    def grant_push_credit(self, writer: int, credit: int) -> None:
        if self.is_open and writer in self.theirs:
            self.send(encode_push_credit(writer, credit))

    def ack_commit(self, writer: int, lengths: Sequence[int]) -> None:
        self._take(self.theirs, writer, Kind.PUSH)
        if self.is_open:
            self.send(encode_commit_ack(writer, lengths))

    def ack_abort(self, writer: int) -> None:
        self._take(self.theirs, writer, Kind.PUSH)
        if self.is_open:
            self.send(encode_abort_ack(writer))

    def push_closed(self, writer: int) -> None:
        """A push ended without an answer owed (the connection's end is near, or it failed already)."""
        self._take(self.theirs, writer, Kind.PUSH)

    def answer_admin(self, request: int, result: dict[str, Any]) -> None:
        self.admin_running -= 1
        if self.is_open:
            self.send(encode_admin_response(request, result))

    def send_error(self, stream: int, exc: ShuffledError) -> None:
        """End one of their streams with an error (it leaves the table; they may reuse its id)."""
        entry = self.theirs.get(stream)
        if entry is not None:
            self._take(self.theirs, stream, entry.kind)
        if self.is_open:
            self.send(encode_error_from(stream, exc))

    def fail_admin(self, request: int, exc: ShuffledError) -> None:
        """Answer one of their admin requests with an error."""
        self.admin_running -= 1
        if self.is_open:
            self.send(encode_error_from(request, exc))

    def fail(self, exc: ShuffledError) -> bytes:
        """A fatal error: the ErrorResponse on stream 0 to write before shutting the write side."""
        self.phase = Phase.CLOSED
        return encode_error(0, exc.code, exc.message)

    def close(self) -> None:
        """The connection is gone: nothing more is sent, the reader's memory goes now."""
        self.phase = Phase.CLOSED
        self.discard_pending()
        self.reader.close()
        self.own.clear()
        self.theirs.clear()
        self.pushes_open = 0

    # -- frames in

    def _payload_target(self, ftype: FrameType, stream: int, length: int) -> tuple[memoryview, Any] | None:
        table = self.theirs if ftype == FrameType.PUSH_DATA else self.own
        entry = table.get(stream)
        if entry is None or entry.target is None:
            return None
        return entry.target(length)

    def _on_frame(self, frame: Frame) -> Event | None:
        if self.phase is not Phase.OPEN:
            return self._handshake(frame)
        # The data frames first, without the match below: they are nearly every frame a connection carries.
        if type(frame) is BufferResponse:
            return self._on_buffer(frame)
        if type(frame) is PushData and self.role is Role.DAEMON:
            return self._on_push_data(frame)
        match frame:
            case PushCredit() | CommitAck() | AbortAck() if self.role is Role.DAEMON and REPLICA not in self.features:
                raise ProtocolError(f"{type(frame).__name__} is not expected by a daemon")
            case PushCredit(writer, credit):
                return self._on_push_credit(writer, credit)
            case CommitAck(writer, lengths):
                return Committed(writer, lengths) if self._take(self.own, writer, Kind.PUSH) else None
            case AbortAck(writer):
                return Aborted(writer) if self._take(self.own, writer, Kind.PUSH) else None
            case AdminResponse(request, result):
                return AdminAnswered(request, result) if self._take(self.own, request, Kind.ADMIN) else None
            case ErrorResponse(stream, code, message):
                exc = error_from_code(code, message)
                if stream == 0:
                    return ConnectionFailed(exc)
                return StreamFailed(stream, exc) if self.own.pop(stream, None) is not None else None
            case Close():
                return CloseRequested()
        if self.role is not Role.DAEMON:
            raise ProtocolError(f"{type(frame).__name__} is not expected by a client")
        return self._on_request(frame)

    def _on_request(self, frame: Frame) -> Event | None:
        match frame:
            case PartitionRequest():
                return self._open_theirs(frame.receiver, Kind.READ) or ReadRequested(frame)
            case AddCredit(receiver, credit):
                stream = self.theirs.get(receiver)
                if stream is None or stream.kind is not Kind.READ:
                    return None  # the read ended or was cancelled while the credit was on its way
                if stream.outbound is not None:
                    stream.outbound.add_credit(credit)
                return CreditAdded(receiver, credit)
            case CancelPartitionRequest(receiver):
                return ReadCancelled(receiver) if self._take(self.theirs, receiver, Kind.READ) else None
            case OpenMapOutput():
                if self.peer_role is not Role.CLIENT and (REPLICA not in self.features or frame.replica_of is None):
                    raise ProtocolError("only clients push map output, and daemons that agreed on replica pushes")
                return self._open_theirs(frame.writer, Kind.PUSH) or PushOpened(frame)
            case PushData():
                return self._on_push_data(frame)
            case CommitMapOutput(writer, pushes):
                return self._unknown_push(writer) or CommitRequested(writer, pushes)
            case AbortMapOutput(writer):
                return self._unknown_push(writer) or AbortRequested(writer)
            case AdminRequest(request):
                if self.admin_running >= self.limits.admin:
                    return self._refuse(
                        request,
                        LimitExceeded(
                            f"max-admin-per-connection ({self.limits.admin}) admin requests are already in progress"
                        ),
                    )
                self.admin_running += 1
                return AdminRequested(frame)
        raise ProtocolError(f"{type(frame).__name__} is not expected by a daemon")

    def _refuse(self, sid: int, exc: ShuffledError) -> StreamRefused:
        if self.is_open:
            self.send(encode_error_from(sid, exc))
        return StreamRefused(sid, exc)

    def _open_theirs(self, sid: int, kind: Kind) -> StreamRefused | None:
        """A stream id they open: never 0, never one of theirs still open; refused beyond the limits."""
        if sid == 0:
            raise ProtocolError("stream id 0 is reserved for the connection")
        if sid in self.theirs:
            raise ProtocolError(f"stream id {sid} is already in use")
        limits = self.limits
        if len(self.theirs) >= limits.streams:
            return self._refuse(
                sid, LimitExceeded(f"max-streams-per-connection ({limits.streams}) streams are open on this connection")
            )
        if kind is Kind.PUSH and self.pushes_open >= limits.pushes:
            return self._refuse(
                sid,
                LimitExceeded(f"max-pushes-per-connection ({limits.pushes}) map outputs are open on this connection"),
            )
        self.theirs[sid] = Stream(kind)
        if kind is Kind.PUSH:
            self.pushes_open += 1
        return None

    def _take(self, table: dict[int, Stream], sid: int, kind: Kind) -> bool:
        """Take stream `sid` out of `table` (ours or theirs) if it is one of `kind`; False when it is not
        there, as for a stream that ended while a frame about it was on its way."""
        stream = table.get(sid)
        if stream is None or stream.kind is not kind:
            return False
        del table[sid]
        if kind is Kind.PUSH and table is self.theirs:
            self.pushes_open -= 1
        return True

    def _unknown_push(self, writer: int) -> StreamRefused | None:
        """None for one of their open pushes; else the refusal sent (UNKNOWN_STREAM, the connection lives on)."""
        stream = self.theirs.get(writer)
        if stream is not None and stream.kind is Kind.PUSH:
            return None
        if writer == 0:
            raise ProtocolError("stream id 0 is reserved for the connection")
        return self._refuse(writer, UnknownStream(f"no open map output for writer {writer}"))

    def _on_push_data(self, frame: PushData) -> Event:
        refused = self._unknown_push(frame.writer)
        if refused is not None:
            release_payload(frame)
            return refused
        _check_landed(frame.payload, frame.writer)
        return PushDataArrived(frame)

    def _on_buffer(self, frame: BufferResponse) -> Event | None:
        stream = self.own.get(frame.receiver)
        if stream is None or stream.kind is not Kind.READ:
            release_payload(frame)  # the read was cancelled while this arrived
            return None
        if frame.kind is BufferKind.DATA:
            _check_landed(frame.payload, frame.receiver)
        else:
            del self.own[frame.receiver]
        return BufferArrived(frame)

    def _on_push_credit(self, writer: int, credit: int) -> Event | None:
        stream = self.own.get(writer)
        if stream is None or stream.kind is not Kind.PUSH:
            return None
        if stream.outbound is not None:
            stream.outbound.add_credit(credit)
        return PushCredited(writer, credit)

    # -- the handshake, frames in

    def _handshake(self, frame: Frame) -> Event | None:
        if self.phase is Phase.CLOSED:
            release_payload(frame)
            return None
        if isinstance(frame, ErrorResponse):  # the other side refused the handshake, or gave up on it
            self.phase = Phase.CLOSED
            return ConnectionFailed(error_from_code(frame.code, frame.message))
        if self.side is Side.DIALER:
            return self._dialer_frame(frame)
        if self.phase is Phase.HELLO:
            if not isinstance(frame, Hello):
                raise ProtocolError(f"the first frame must be Hello, got {type(frame).__name__}")
            self.phase = Phase.ANSWER
            self._hello = frame
            self.peer_role = frame.role
            return HelloReceived(frame.role, frame.info)
        if self.phase is Phase.AUTH:
            assert self._acceptor is not None and self._hello is not None
            self._acceptor.check(frame.proof if isinstance(frame, AuthResponse) else None)
            return Authenticated(self._hello.role, self._hello.info)
        raise ProtocolError(f"{type(frame).__name__} arrived before the handshake was answered")

    def _dialer_frame(self, frame: Frame) -> Event | None:
        dialer = self._dialer
        assert dialer is not None
        match frame:
            case AuthChallenge(nonce, proof):
                self.send(encode_auth_response(dialer.answer(nonce, proof, self.who)))
                return None
            case HelloAck(role, _, info):
                dialer.accepted(self.who)
                self.peer_role = role
                self.features = self._offered & _features(info)
                self._open()
                return HandshakeDone(info)
        raise ProtocolError(f"expected HelloAck, got {type(frame).__name__}")


def _features(info: dict[str, Any]) -> frozenset[str]:
    """The `features` of a Hello or HelloAck info map; anything but a list of strings offers none."""
    value = info.get("features")
    return frozenset(f for f in value if isinstance(f, str)) if isinstance(value, list) else frozenset()


def _check_landed(payload: object, stream: int) -> None:
    """A data frame whose stream was opened by a frame of the same read had nowhere to land.

    Frames of one read are decoded before any is handled, so a PushData right
    behind its OpenMapOutput found no target, hence no credit, when its bytes
    arrived: that is data sent before credit was granted.
    """
    if payload is None:
        raise CreditViolation(f"stream {stream}: data frame sent before credit was granted")
