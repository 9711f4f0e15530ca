"""The stream table of one end of a connection (connection.py): the streams this side opened ("own") and
those the other side opened ("theirs"), of which kind, in which state, where their data lands, the id rules
(never 0, never one still open) and the per-connection limits.

Own and theirs are separate id spaces, as the spec says: on a peer link both daemons read.

Each stream's lifecycle is a transition table per kind and end (`TRANSITIONS`), in the style of h2: a step
that is not in its table raises `StreamStateError`, and the caller says what that costs (a frame of the
other side's that breaks the rules is fatal, an early commit is refused on its stream, PROTOCOL.md §12.2).
A stream ends from any state (an end of partition, an answer, an error or a cancel takes it out of the
table); the steps in between are these:

    read, theirs   OPEN --serve--> SERVING        AddCredit in either (kept until served)
    read, own      OPEN                           data and AddCredit
    push, theirs   OPEN --grant--> CREDITED --commit/abort--> ENDING
                   (a landing target any time before credit; data and grants while CREDITED; a grant
                   or an abort while ENDING: credit sent before the commit was read, a writer giving up
                   waiting for its answer)
    push, own      OPEN --grant--> CREDITED
    admin          OPEN                           request, then its answer
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

from .credit import OutboundStream
from .errors import LimitExceeded, ProtocolError, StreamStateError
from .frames import MAX_STREAMS_PER_CONNECTION, FrameType

#: where a stream's next data payload goes: (memory to fill, token that comes back as the frame's payload)
Target = Callable[[int], tuple[memoryview, Any]]


class Kind(Enum):
    READ = "read"
    PUSH = "push"
    ADMIN = "admin"


class State(IntEnum):
    """IntEnums, as Step: a pair of them is looked up per data frame, and hashes as ints do (an Enum's
    hash is a Python call)."""

    OPEN = 0  # opened: a read not yet served, a push without credit yet, an admin request
    SERVING = 1  # a read this side serves from its outbound stream
    CREDITED = 2  # a push whose writer has credit: data may flow
    ENDING = 3  # a push whose commit or abort was asked: only its answer is owed


class Step(IntEnum):
    SERVE = 0  # the server serves a read (its outbound stream is set)
    LAND = 1  # the server says where a push's data lands
    GRANT = 2  # push credit granted (server) or arrived (opener)
    CREDIT = 3  # read credit: AddCredit sent (opener) or arrived (server)
    DATA = 4  # a data frame arrived: PushData (server), BufferResponse DATA (opener)
    COMMIT = 5  # CommitMapOutput arrived
    ABORT = 6  # AbortMapOutput arrived


#: (kind, theirs) -> (state, step) -> the next state; nothing else is allowed (see the module)
TRANSITIONS: dict[tuple[Kind, bool], dict[tuple[State, Step], State]] = {
    (Kind.READ, True): {
        (State.OPEN, Step.CREDIT): State.OPEN,
        (State.OPEN, Step.SERVE): State.SERVING,
        (State.SERVING, Step.CREDIT): State.SERVING,
    },
    (Kind.READ, False): {
        (State.OPEN, Step.DATA): State.OPEN,
        (State.OPEN, Step.CREDIT): State.OPEN,
    },
    (Kind.PUSH, True): {
        (State.OPEN, Step.LAND): State.OPEN,
        (State.OPEN, Step.GRANT): State.CREDITED,
        (State.CREDITED, Step.GRANT): State.CREDITED,
        (State.CREDITED, Step.DATA): State.CREDITED,
        (State.CREDITED, Step.COMMIT): State.ENDING,
        (State.CREDITED, Step.ABORT): State.ENDING,
        (State.ENDING, Step.GRANT): State.ENDING,
        (State.ENDING, Step.ABORT): State.ENDING,
    },
    (Kind.PUSH, False): {
        (State.OPEN, Step.GRANT): State.CREDITED,
        (State.CREDITED, Step.GRANT): State.CREDITED,
    },
    (Kind.ADMIN, True): {},
    (Kind.ADMIN, False): {},
}


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
    state: State = State.OPEN
    #: read credit that arrived before the read was served, handed to its outbound stream when it is
    early_credit: int = 0
    #: its transition table (`TRANSITIONS` of its kind and end), set when it enters the stream table
    moves: dict[tuple[State, Step], State] = field(default_factory=dict)


class StreamTable:
    """The streams open on one end of a connection (see the module)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        #: streams this side opened, and streams the other side opened
        self.own: dict[int, Stream] = {}
        self.theirs: dict[int, Stream] = {}
        #: their pushes in the table (checked against `limits.pushes` on every open)
        self.pushes_open = 0
        #: their admin requests not yet answered (counted, not tracked: admin ids need not be unique)
        self.admin_running = 0
        self._next_id = 1

    def new_id(self) -> int:
        """A counter from 1, wrapping past 2^32-1 (PROTOCOL.md §5), skipping ids still open."""
        while True:
            sid = self._next_id
            self._next_id = sid + 1 if sid < 0xFFFFFFFF else 1
            if sid not in self.own:
                return sid

    def add_own(self, sid: int, stream: Stream) -> None:
        if sid == 0 or sid in self.own:
            raise ValueError(f"stream id {sid} is reserved or already open on this side")
        stream.moves = TRANSITIONS[stream.kind, False]
        self.own[sid] = stream

    def open_theirs(self, sid: int, kind: Kind) -> LimitExceeded | None:
        """A stream id they open: never 0, never one of theirs still open; beyond the limits, why it is
        refused (the connection tells them, and lives on)."""
        if sid == 0:
            raise ProtocolError("stream id 0 is reserved for the connection")
        if sid in self.theirs:
            raise ProtocolError(f"stream id {sid} is already in use")
        limits = self.limits
        if len(self.theirs) >= limits.streams:
            return LimitExceeded(f"max-streams-per-connection ({limits.streams}) streams are open on this connection")
        if kind is Kind.PUSH and self.pushes_open >= limits.pushes:
            return LimitExceeded(f"max-pushes-per-connection ({limits.pushes}) map outputs are open on this connection")
        self.theirs[sid] = Stream(kind, moves=TRANSITIONS[kind, True])
        if kind is Kind.PUSH:
            self.pushes_open += 1
        return None

    def take(self, table: dict[int, Stream], sid: int, kind: Kind) -> bool:
        """Take stream `sid` out of `table` (ours or theirs) if it is one of `kind`; False when it is not
        there, as for a stream that ended while a frame about it was on its way."""
        stream = table.get(sid)
        if stream is None or stream.kind is not kind:
            return False
        del table[sid]
        if kind is Kind.PUSH and table is self.theirs:
            self.pushes_open -= 1
        return True

    def step(self, table: dict[int, Stream], sid: int, kind: Kind, step: Step) -> Stream | None:
        """Move stream `sid` of `table` (ours or theirs) by `step`; None when it is not there or of another
        kind (it ended while a frame about it was on its way). Raises StreamStateError for a step its table
        does not have."""
        stream = table.get(sid)
        if stream is None or stream.kind is not kind:
            return None
        following = stream.moves.get((stream.state, step))
        if following is None:
            state = stream.state
            raise StreamStateError(
                f"{step.name.lower()} is not allowed on {kind.value} stream {sid} while it is {state.name.lower()}",
                state,
                step,
            )
        stream.state = following
        return stream

    def payload_target(self, ftype: FrameType, stream: int, length: int) -> tuple[memoryview, Any] | None:
        """Where a data frame's payload lands (the FrameReader asks): the target the shell registered for its
        stream, None for a stream not open or a push without credit (the payload is then skipped, and the
        frame judged when it is handed out)."""
        push = ftype == FrameType.PUSH_DATA
        entry = (self.theirs if push else self.own).get(stream)
        if entry is None or entry.target is None or (push and entry.state is not State.CREDITED):
            return None
        return entry.target(length)

    def clear(self) -> None:
        """The connection is gone: every stream with it."""
        self.own.clear()
        self.theirs.clear()
        self.pushes_open = 0


def release_payload(item: object) -> None:
    """Give back the pool buffer a decoded data frame (or an event carrying one, or the reader's token for
    a payload cut short) holds, if nobody took it."""
    frame = getattr(item, "frame", item)
    buf: Any = getattr(frame, "payload", frame)
    if getattr(buf, "refs", 0):
        buf.release()
