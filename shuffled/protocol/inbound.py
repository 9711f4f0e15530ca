"""Frames in, events out, for one end of a connection once its handshake is done (connection.py): each
stream's lifecycle as the other side drives it, checked against the stream table. Frames for a stream
that ended are dropped (their payloads released), as the spec says; a stream beyond the limits, or a push
frame for no open push, is refused on its own stream while the connection lives on; frames that break the
rules are a `ProtocolError` for the whole connection. AddCredit and PushCredit go straight to the
stream's `OutboundStream` (credit.py).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Literal

from .codec import encode, encode_error_from
from .errors import (
    CreditViolation,
    LimitExceeded,
    MapOutputStateError,
    ProtocolError,
    ShuffledError,
    StreamStateError,
    UnknownStream,
    error_from_code,
)
from .events import (
    Aborted,
    AbortRequested,
    AdminAnswered,
    AdminRequested,
    BufferArrived,
    BuffersPlaced,
    CloseRequested,
    CommitRequested,
    Committed,
    ConnectionFailed,
    CreditAdded,
    Event,
    PushCredited,
    PushDataArrived,
    PushOpened,
    PushOutOfTurn,
    PushPlacedArrived,
    ReadCancelled,
    ReadRequested,
    SlotsReturned,
    StreamFailed,
    StreamRefused,
)
from .frames import (
    BUFFER_PLACED_FIELDS,
    REPLICA,
    SHM,
    SHM_READ,
    AbortAck,
    AbortMapOutput,
    AddCredit,
    AdminRequest,
    AdminResponse,
    BufferKind,
    BufferPlaced,
    BufferResponse,
    CancelPartitionRequest,
    Close,
    CommitAck,
    CommitMapOutput,
    ErrorResponse,
    Frame,
    OpenMapOutput,
    PartitionRequest,
    PushCredit,
    PushData,
    PushPlaced,
    PushSlots,
    ReturnSlots,
    Role,
)
from .handshake import Handshake
from .streams import Kind, State, Step, StreamTable, release_payload

#: why a commit or abort out of its push's turn is refused, by the state the push was in
OUT_OF_TURN: dict[Enum, str] = {
    State.OPEN: "before the daemon granted push credit",
    State.ENDING: "after its CommitMapOutput or AbortMapOutput",
}


class Inbound:
    """What the other side's frames mean on an open connection (see the module)."""

    def __init__(self, handshake: Handshake, streams: StreamTable, send: Callable[[bytes], None]) -> None:
        self.handshake = handshake
        self.streams = streams
        self.send = send

    def on_frame(self, frame: Frame) -> Event | None:
        """The event a frame makes once the connection is open, if any; raises ProtocolError for a frame
        that breaks the rules."""
        # The data frames first, without the match below: they are nearly every frame a connection carries.
        if type(frame) is BufferResponse:
            if self.handshake.peer_role is Role.CLIENT:
                raise ProtocolError("BufferResponse is not expected from a client")
            return self._on_buffer(frame)
        if type(frame) is BufferPlaced:
            return self._on_placed(frame)
        daemon = self.handshake.role is Role.DAEMON
        if type(frame) is PushData and daemon:
            return self._on_push_data(frame)
        if type(frame) is PushPlaced and daemon:
            return self._on_push_placed(frame)
        match frame:
            case AdminResponse() if self.handshake.peer_role is Role.CLIENT:
                raise ProtocolError("AdminResponse is not expected from a client")
            case PushCredit() | CommitAck() | AbortAck() if (
                self.handshake.role is Role.DAEMON and REPLICA not in self.handshake.features
            ):
                raise ProtocolError(f"{type(frame).__name__} is not expected by a daemon")
            case PushCredit(writer, credit):
                return self._on_push_credit(writer, credit)
            case PushSlots(writer, slots):
                if SHM not in self.handshake.features:
                    raise ProtocolError("PushSlots on a connection that did not agree on shared memory")
                return self._on_push_credit(writer, len(slots), slots)
            case CommitAck(writer, lengths):
                return Committed(writer, lengths) if self.streams.take(self.streams.own, writer, Kind.PUSH) else None
            case AbortAck(writer):
                return Aborted(writer) if self.streams.take(self.streams.own, writer, Kind.PUSH) else None
            case AdminResponse(request, result):
                return (
                    AdminAnswered(request, result) if self.streams.take(self.streams.own, request, Kind.ADMIN) else None
                )
            case ErrorResponse(stream, code, message):
                exc = error_from_code(code, message)
                if stream == 0:
                    return ConnectionFailed(exc)
                if self.handshake.peer_role is Role.CLIENT:  # an Error on a stream goes from its server to its
                    raise ProtocolError("Error on a stream is not expected from a client")  # opener (§7)
                return StreamFailed(stream, exc) if self.streams.own.pop(stream, None) is not None else None
            case Close():
                return CloseRequested()
        if not daemon:
            raise ProtocolError(f"{type(frame).__name__} is not expected by a client")
        return self._on_request(frame)

    def _on_request(self, frame: Frame) -> Event | None:
        match frame:
            case PartitionRequest():
                return self._open_theirs(frame.receiver, Kind.READ) or ReadRequested(frame)
            case AddCredit(receiver, credit):
                stream = self.streams.theirs.get(receiver)
                if stream is None:
                    return None  # the read ended or was cancelled while the credit was on its way
                if stream.kind is not Kind.READ:
                    raise ProtocolError(f"AddCredit names stream {receiver}, which is not a read")
                self.streams.step(self.streams.theirs, receiver, Kind.READ, Step.CREDIT)
                if stream.outbound is not None:
                    stream.outbound.add_credit(credit)
                else:  # its request waits to be served (the daemon's backlog): the credit waits with it
                    stream.early_credit += credit
                return CreditAdded(receiver, credit)
            case ReturnSlots(sid, slots):  # not `stream`: a Stream above (compiled, a local has one type)
                if SHM_READ not in self.handshake.features:
                    raise ProtocolError("ReturnSlots on a connection that did not agree on shared-memory reads")
                if sid != 0:
                    raise ProtocolError(f"ReturnSlots on stream {sid}: it belongs on stream 0")
                return SlotsReturned(slots)
            case CancelPartitionRequest(receiver):
                stream = self.streams.theirs.get(receiver)
                if stream is not None and stream.kind is not Kind.READ:
                    raise ProtocolError(f"CancelPartitionRequest names stream {receiver}, which is not a read")
                return ReadCancelled(receiver) if self.streams.take(self.streams.theirs, receiver, Kind.READ) else None
            case OpenMapOutput():
                if self.handshake.peer_role is not Role.CLIENT and (
                    REPLICA not in self.handshake.features or frame.replica_of is None
                ):
                    raise ProtocolError("only clients push map output, and daemons that agreed on replica pushes")
                return self._open_theirs(frame.writer, Kind.PUSH) or PushOpened(frame)
            case PushData():
                return self._on_push_data(frame)
            case CommitMapOutput(writer, pushes):
                return self._push_step(writer, Step.COMMIT) or CommitRequested(writer, pushes)
            case AbortMapOutput(writer):
                return self._push_step(writer, Step.ABORT) or AbortRequested(writer)
            case AdminRequest(request):
                limit = self.streams.limits.admin
                if self.streams.admin_running >= limit:
                    return self._refuse(
                        request,
                        LimitExceeded(f"max-admin-per-connection ({limit}) admin requests are already in progress"),
                    )
                self.streams.admin_running += 1
                return AdminRequested(frame)
        raise ProtocolError(f"{type(frame).__name__} is not expected by a daemon")

    def _refuse(self, sid: int, exc: ShuffledError) -> StreamRefused:
        if self.handshake.is_open:
            self.send(encode_error_from(sid, exc))
        return StreamRefused(sid, exc)

    def _open_theirs(self, sid: int, kind: Kind) -> StreamRefused | None:
        refused = self.streams.open_theirs(sid, kind)
        return None if refused is None else self._refuse(sid, refused)

    def _unknown_push(self, writer: int) -> StreamRefused:
        """A push frame for no open push of theirs: refused on its stream (UNKNOWN_STREAM, the connection lives
        on), but on stream 0."""
        if writer == 0:
            raise ProtocolError("stream id 0 is reserved for the connection")
        return self._refuse(writer, UnknownStream(f"no open map output for writer {writer}"))

    def _push_step(self, writer: int, step: Step) -> StreamRefused | PushOutOfTurn | None:
        """None when their push `writer` may take `step` now (and has); else what is said instead: an
        unknown push is refused on its stream, and a commit or abort out of its turn fails the push."""
        try:
            stream = self.streams.step(self.streams.theirs, writer, Kind.PUSH, step)
        except StreamStateError as exc:
            name = "CommitMapOutput" if step is Step.COMMIT else "AbortMapOutput"
            return PushOutOfTurn(writer, MapOutputStateError(f"{name} {OUT_OF_TURN[exc.state]}"))
        return None if stream is not None else self._unknown_push(writer)

    def _on_push_data(self, frame: PushData) -> Event | None:
        refused = self._data_step(frame.writer)
        if refused is not True:
            release_payload(frame)
            return refused
        _check_landed(frame.payload, frame.writer)
        return PushDataArrived(frame)

    def _on_push_placed(self, frame: PushPlaced) -> Event | None:
        if SHM not in self.handshake.features:
            raise ProtocolError("PushPlaced on a connection that did not agree on shared memory")
        refused = self._data_step(frame.writer)
        return PushPlacedArrived(frame) if refused is True else refused

    def _data_step(self, writer: int) -> StreamRefused | Literal[True] | None:
        """True when data for their push `writer` is taken now; None when it is dropped (it came behind its
        commit or abort: a writer giving up had it on its way); the refusal of a push not open. Data before
        any credit breaks the rules."""
        try:
            stream = self.streams.step(self.streams.theirs, writer, Kind.PUSH, Step.DATA)
        except StreamStateError as exc:
            if exc.state is State.OPEN:
                raise CreditViolation(f"stream {writer}: data frame sent before credit was granted") from None
            return None
        return True if stream is not None else self._unknown_push(writer)

    def _on_buffer(self, frame: BufferResponse) -> Event | None:
        stream = self.streams.own.get(frame.receiver)
        if stream is None or stream.kind is not Kind.READ:
            release_payload(frame)  # the read was cancelled while this arrived
            return None
        if frame.kind is BufferKind.DATA:
            self.streams.step(self.streams.own, frame.receiver, Kind.READ, Step.DATA)
            _check_landed(frame.payload, frame.receiver)
        else:
            del self.streams.own[frame.receiver]
        return BufferArrived(frame)

    def _on_placed(self, frame: BufferPlaced) -> Event | None:
        """Buffers of one of our reads in slots of the region (§6.3): each is a DATA frame of the read; those of
        a read that is gone (cancelled while they came) go straight back to the daemon."""
        if self.handshake.peer_role is Role.CLIENT or SHM_READ not in self.handshake.features:
            raise ProtocolError("BufferPlaced on a connection that did not agree on shared-memory reads")
        stream = self.streams.own.get(frame.receiver)
        if stream is None or stream.kind is not Kind.READ:
            self.send(encode(ReturnSlots(0, frame.placed[3::BUFFER_PLACED_FIELDS])))
            return None
        for _ in range(len(frame.placed) // BUFFER_PLACED_FIELDS):
            self.streams.step(self.streams.own, frame.receiver, Kind.READ, Step.DATA)
        return BuffersPlaced(frame)

    def _on_push_credit(self, writer: int, credit: int, slots: list[int] | None = None) -> Event | None:
        """PushCredit, or with shared memory PushSlots: `slots`, a credit each (§6.3)."""
        stream = self.streams.step(self.streams.own, writer, Kind.PUSH, Step.GRANT)
        if stream is None:
            return None
        if stream.outbound is not None:
            if slots is None:
                stream.outbound.add_credit(credit)
            else:
                stream.outbound.add_slots(slots)
        return PushCredited(writer, credit)


def _check_landed(payload: object, stream: int) -> None:
    """A data frame whose stream was opened by a frame of the same read had nowhere to land.

    Frames of one read are decoded before any is handled, so a PushData right
    behind its OpenMapOutput found no target, hence no credit, when its bytes
    arrived: that is data sent before credit was granted.
    """
    if payload is None:
        raise CreditViolation(f"stream {stream}: data frame sent before credit was granted")
