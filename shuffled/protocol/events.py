"""What the other end of a connection did, as `ProtocolConnection` reports it.

One class per thing that can happen, so a shell dispatches with one `match` and
a test compares events as values. Each carries the decoded frame (or its fields)
it came from; a data frame's payload is the pool buffer it landed in, which the
event's handler owns from then on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ShuffledError
from .frames import (
    AdminRequest,
    BufferPlaced,
    BufferResponse,
    OpenMapOutput,
    PartitionRequest,
    PushData,
    PushPlaced,
    Role,
)


@dataclass(frozen=True, slots=True)
class HelloReceived:
    """Acceptor: answer with `challenge()` or `accept()`, or fail the connection."""

    role: Role
    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Authenticated:
    """Acceptor: the dialer proved the secret `challenge()` named; answer with `accept()`."""

    role: Role
    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class HandshakeDone:
    """Dialer: the acceptor took our Hello (and, with a secret, proved its own); streams may open."""

    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ReadRequested:
    request: PartitionRequest


@dataclass(frozen=True, slots=True)
class CreditAdded:
    """More credit for a read we serve (already added to its outbound stream)."""

    stream: int
    credit: int


@dataclass(frozen=True, slots=True)
class ReadCancelled:
    stream: int


@dataclass(frozen=True, slots=True)
class PushOpened:
    request: OpenMapOutput


@dataclass(frozen=True, slots=True)
class PushDataArrived:
    frame: PushData


@dataclass(frozen=True, slots=True)
class PushPlacedArrived:
    """A writer put a packed group in a slot of the connection's shared memory (§6.3)."""

    frame: PushPlaced


@dataclass(frozen=True, slots=True)
class CommitRequested:
    writer: int
    pushes: int


@dataclass(frozen=True, slots=True)
class AbortRequested:
    writer: int


@dataclass(frozen=True, slots=True)
class PushOutOfTurn:
    """A commit or abort their push's table does not allow (before its first credit, or a second commit):
    the shell fails the push with `error` (MAP_OUTPUT_STATE, §12.2), in turn with its other requests."""

    writer: int
    error: ShuffledError


@dataclass(frozen=True, slots=True)
class AdminRequested:
    request: AdminRequest


@dataclass(frozen=True, slots=True)
class BufferArrived:
    """A data buffer or the end of one of our reads (the read leaves the table at its end)."""

    frame: BufferResponse


@dataclass(frozen=True, slots=True)
class BuffersPlaced:
    """Data buffers of one of our reads that the daemon put in the connection's shared memory (§6.3)."""

    frame: BufferPlaced


@dataclass(frozen=True, slots=True)
class SlotsReturned:
    """The client is done with slots of its region that served buffers were put in (§6.3)."""

    slots: list[int]


@dataclass(frozen=True, slots=True)
class PushCredited:
    """More credit for one of our pushes (already added to its outbound stream)."""

    writer: int
    credit: int


@dataclass(frozen=True, slots=True)
class Committed:
    writer: int
    lengths: list[int]


@dataclass(frozen=True, slots=True)
class Aborted:
    writer: int


@dataclass(frozen=True, slots=True)
class AdminAnswered:
    request: int
    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StreamFailed:
    """The other side ended one of our streams with an error."""

    stream: int
    error: ShuffledError


@dataclass(frozen=True, slots=True)
class StreamRefused:
    """We refused one of their streams (a limit, an unknown id) and told them why on that stream."""

    stream: int
    error: ShuffledError


@dataclass(frozen=True, slots=True)
class ConnectionFailed:
    """The other side reported a fatal error (stream 0), or refused the handshake."""

    error: ShuffledError


@dataclass(frozen=True, slots=True)
class CloseRequested:
    pass


Event = (
    HelloReceived
    | Authenticated
    | HandshakeDone
    | ReadRequested
    | CreditAdded
    | ReadCancelled
    | PushOpened
    | PushDataArrived
    | PushPlacedArrived
    | CommitRequested
    | AbortRequested
    | PushOutOfTurn
    | AdminRequested
    | BufferArrived
    | BuffersPlaced
    | SlotsReturned
    | PushCredited
    | Committed
    | Aborted
    | AdminAnswered
    | StreamFailed
    | StreamRefused
    | ConnectionFailed
    | CloseRequested
)
