"""Two `ProtocolConnection`s wired together in memory, with the sending half of a shell.

The protocol connections write control frames themselves; data frames come from
`OutboundStream`s under their credit, framed here as the daemon's and the
client's send loops frame them. Used by the two-party property tests and by
proto/vectors/record.py, which records conversations as golden vectors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shuffled.protocol.codec import encode, encode_abort, encode_buffer_response, encode_push_data
from shuffled.protocol.connection import ProtocolConnection
from shuffled.protocol.credit import OutboundStream
from shuffled.protocol.events import Event
from shuffled.protocol.frames import BufferKind, CommitMapOutput

DIALER = "dialer"
ACCEPTOR = "acceptor"


class MemoryConnection(ProtocolConnection):
    """A protocol connection whose transport is an outbox in memory: what it says waits there until taken.

    A subclass of the interpreted tree's class, as the whole suite runs the tree interpreted (the compiled
    wheel's daemons are test_compiled.py's); mypyc's compiled class could not be subclassed here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.outbox: list[bytes] = []
        super().__init__(*args, send=self.outbox.append, **kwargs)

    def receive_data(self, data: bytes, handle: Callable[[Event], None] | None = None) -> list[Event]:
        """Feed bytes (copied in, in as many reads as the reader's buffers take), collect every event; `handle`
        acts on each as it comes, as a shell does, before the next frame is judged."""
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

    def data_to_send(self) -> bytes:
        out = b"".join(self.outbox)
        self.outbox.clear()
        return out


def landing(length: int) -> tuple[memoryview, bytearray]:
    """A payload target: fresh memory, handed back as the frame's payload."""
    buf = bytearray(length)
    return memoryview(buf), buf


@dataclass
class Pair:
    dialer: MemoryConnection
    acceptor: MemoryConnection
    #: (who sent, the bytes) in the order they crossed
    steps: list[tuple[str, bytes]] = field(default_factory=list)

    def side(self, who: str) -> MemoryConnection:
        return self.dialer if who == DIALER else self.acceptor

    def deliver(self, frm: str, handle: Callable[[Event], None] | None = None) -> list[Event]:
        """Move what `frm` has written to the other side; the events it made of them, each given to
        `handle` as it comes (as a shell acts on one event before the next frame is judged)."""
        data = self.side(frm).data_to_send()
        if not data:
            return []
        self.steps.append((frm, data))
        return self.side(ACCEPTOR if frm == DIALER else DIALER).receive_data(data, handle)


def send_buffers(conn: ProtocolConnection, out: OutboundStream[Any], receiver: int) -> bool:
    """Frame what a served read may send under its credit (its items are payloads: packed groups, as bytes);
    True once its end went out."""
    while out.ready():
        item, seq, backlog, is_event = out.pop()
        if is_event:
            conn.send(encode_buffer_response(receiver, seq, backlog, BufferKind.END_OF_PARTITION, b""))
            conn.read_finished(receiver)
            return True
        conn.send(encode_buffer_response(receiver, seq, backlog, BufferKind.DATA, item))
    return False


#: the events a push's outbound stream queues after its data
COMMIT = "commit"
ABORT = "abort"


def send_pushes(conn: ProtocolConnection, out: OutboundStream[Any], writer: int) -> None:
    """Frame a push's data (payloads: one packed group each, as bytes) under its push credit, then its commit or
    abort once queued."""
    while out.ready():
        item, seq, _, is_event = out.pop()  # data goes before the event: its sequence counts the pushes
        if is_event:
            conn.send(encode(CommitMapOutput(writer, seq)) if item == COMMIT else encode_abort(writer))
            return
        conn.send(encode_push_data(writer, seq, item))
