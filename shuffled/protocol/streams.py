"""The stream table of one end of a connection (connection.py): the streams this side opened ("own") and
those the other side opened ("theirs"), of which kind, where their data lands, the id rules (never 0, never
one still open) and the per-connection limits.

Own and theirs are separate id spaces, as the spec says: on a peer link both daemons read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .credit import OutboundStream
from .errors import LimitExceeded, ProtocolError
from .frames import MAX_STREAMS_PER_CONNECTION, FrameType

#: where a stream's next data payload goes: (memory to fill, token that comes back as the frame's payload)
Target = Callable[[int], tuple[memoryview, Any]]


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
        self.theirs[sid] = Stream(kind)
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

    def payload_target(self, ftype: FrameType, stream: int, length: int) -> tuple[memoryview, Any] | None:
        """Where a data frame's payload lands (the FrameReader asks): the target the shell registered for its
        stream, None for a stream not open (the payload is then skipped)."""
        table = self.theirs if ftype == FrameType.PUSH_DATA else self.own
        entry = table.get(stream)
        if entry is None or entry.target is None:
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
