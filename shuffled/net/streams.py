"""The two kinds of outbound data stream."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from ..buffers import Buffer, Chunk
from ..buffers.shm import MappedRegion, ReadSlots
from ..protocol.frames import (
    BUFFER_PLACED_ENTRY,
    BUFFER_RESPONSE_PREFIX,
    HEADER,
    PUSH_DATA_PREFIX,
    PUSH_PLACED_ENTRY,
    U32,
    BufferKind,
    FrameType,
    pack_buffer_response_prefix,
    pack_push_data_prefix,
)
from ..protocol.integrity import checksum
from .sender import COPY_BYTES_PER_TURN, MAX_PREFIX, Outbound


class Feed(Protocol):
    """What makes a stream's data as it goes (the daemon's plan feeds): told when the stream may take more."""

    def kick(self) -> None: ...

    def close(self) -> None: ...


class BufferResponseStream(Outbound):
    """Daemon → consumer: data chunks, then END_OF_PARTITION (an event: needs no credit)."""

    __slots__ = ("feeds", "on_end", "opened_at", "relayed")

    def __init__(self, stream: int, credit: int, on_end: Callable[[BufferResponseStream], None] | None = None) -> None:
        super().__init__(stream, credit)
        #: called once END_OF_PARTITION went to the transport (the stream is then finished)
        self.on_end = on_end
        #: for the read latency metric: when the request came, and whether other daemons' data is relayed
        self.opened_at = 0.0
        self.relayed = False
        #: what queues data on it as credit allows: kicked when frames leave or credit comes
        self.feeds: list[Feed] = []

    def on_sent(self, item: Any, is_event: bool) -> None:
        if is_event:
            if self.on_end is not None:
                self.on_end(self)
            return
        for feed in self.feeds:
            feed.kick()

    def add_credit(self, n: int) -> None:
        super().add_credit(n)
        for feed in self.feeds:
            feed.kick()

    def shutdown(self) -> None:
        feeds, self.feeds = self.feeds, []
        for feed in feeds:
            feed.close()
        super().shutdown()

    def pack(
        self, into: bytearray, offset: int, item: Any, seq: int, backlog: int, is_event: bool
    ) -> tuple[int, Buffer | None]:
        if is_event:
            pack_buffer_response_prefix(into, offset, self.stream, seq, backlog, BufferKind.END_OF_PARTITION, 0, 0)
            return BUFFER_RESPONSE_PREFIX.size, None
        chunk: Chunk = item
        buf = chunk.buffer
        pack_buffer_response_prefix(into, offset, self.stream, seq, backlog, BufferKind.DATA, buf.length, chunk.crc)
        return BUFFER_RESPONSE_PREFIX.size, buf

    def end(self) -> None:
        self.push_event(None)


class PlacedBufferResponseStream(BufferResponseStream):
    """A read served to a local client over shared memory (PROTOCOL.md §6.3): each buffer is copied into a read
    slot of the connection's region and a BufferPlaced names it, with the buffers queued behind it that credit
    and free slots allow; the pool segment is free at once, not when the kernel took it. With no slot free
    (the client holds them all, or the tmpfs is full) a buffer goes as a BufferResponse, as on any connection."""

    __slots__ = ("slots",)

    def __init__(
        self,
        stream: int,
        credit: int,
        slots: ReadSlots,
        on_end: Callable[[BufferResponseStream], None] | None = None,
    ) -> None:
        super().__init__(stream, credit, on_end)
        self.slots = slots

    def pack(
        self, into: bytearray, offset: int, item: Any, seq: int, backlog: int, is_event: bool
    ) -> tuple[int, Buffer | None]:
        slots = self.slots
        # as many slots as this frame may name: the item popped, and what credit, the queue and what is left of
        # the flush's copy budget (with large segments a frame's copies alone could pass it) allow after it
        sender = self.sender
        left = COPY_BYTES_PER_TURN - (sender.copied if sender is not None else 0)
        most = min(self.credit, self.queued, MAX_BUFFERS_PER_PLACED - 1, left // slots.slot_size - 1)
        taken = [] if is_event else slots.take(1 + max(0, most))
        if not taken:
            return super().pack(into, offset, item, seq, backlog, is_event)
        copied = 0
        entry = BUFFER_PLACED_ENTRY
        at = offset + HEADER.size
        chunk: Chunk = item
        bufs: list[Buffer] = []
        for slot in taken:
            if bufs:
                more = self.pop_more_data(chunk)
                if more is None:  # the next item is an event, or not a chunk
                    slots.returned(taken[len(bufs) :])
                    break
                chunk, seq, backlog = more, (self.sequence - 1) & 0xFFFFFFFF, self.backlog
            buf = chunk.buffer
            bufs.append(buf)
            copied += buf.length
            entry.pack_into(into, at, seq, backlog, chunk.crc, slot, buf.length)
            at += entry.size
        # together, slots that follow each other in one call (taken may hold slots given back after an event)
        slots.put([(slot, buf.data()) for slot, buf in zip(taken, bufs, strict=False)])
        for buf in bufs:
            buf.release()
        HEADER.pack_into(into, offset, len(bufs) * entry.size, FrameType.BUFFER_PLACED, 0, 0, self.stream)
        if sender is not None:
            sender.copied += copied
        return at - offset, None


class PushEvent(Enum):
    COMMIT = FrameType.COMMIT_MAP_OUTPUT
    ABORT = FrameType.ABORT_MAP_OUTPUT


@dataclass(slots=True)
class Payload:
    """One PushData payload: a pool buffer holding one packed group, and its CRC32C when it is already known."""

    buffer: Buffer
    crc: int = 0


@dataclass(slots=True)
class Placed:
    """A packed group a writer put straight into a slot it took (`PlacedPushStream.take_slot`): its length and
    CRC32C; only its PushPlaced goes out."""

    slot: int
    length: int
    crc: int


class PushStream(Outbound):
    """Client (or primary daemon) → daemon: PushData under push credit, then Commit or Abort in the same order.

    Items are `Payload`s and nothing else: compiled (mypyc), `pack` refuses any other type, duck-typed or
    not. A primary forwarding a push to a replica (server/cluster/replication.py) sets `forward_crc`: its
    payloads carry the CRC32C it checked when they arrived, so it is sent as is rather than computed again;
    and `on_progress`, to hear when its queue shrinks (the pusher's credit waits on it).
    """

    __slots__ = ("forward_crc", "on_progress", "pushed")

    def __init__(self, stream: int, credit: int = 0, forward_crc: bool = False) -> None:
        super().__init__(stream, credit)
        self.pushed = 0
        self.forward_crc = forward_crc
        #: called after each data item went to the transport
        self.on_progress: Callable[[], None] | None = None

    def on_sent(self, item: Any, is_event: bool) -> None:
        if not is_event and self.on_progress is not None:
            self.on_progress()

    def pack(
        self, into: bytearray, offset: int, item: Any, seq: int, backlog: int, is_event: bool
    ) -> tuple[int, Buffer | None]:
        if is_event:
            if item is PushEvent.COMMIT:
                HEADER.pack_into(into, offset, 4, FrameType.COMMIT_MAP_OUTPUT, 0, 0, self.stream)
                U32.pack_into(into, offset + HEADER.size, self.pushed)
                return HEADER.size + 4, None
            HEADER.pack_into(into, offset, 0, FrameType.ABORT_MAP_OUTPUT, 0, 0, self.stream)
            return HEADER.size, None
        payload: Payload = item
        buf = payload.buffer
        crc = payload.crc if self.forward_crc else checksum(buf.data())
        pack_push_data_prefix(into, offset, self.stream, self.pushed, buf.length, crc)
        self.pushed += 1
        return PUSH_DATA_PREFIX.size, buf


class PlacedPushStream(PushStream):
    """A local client's push over shared memory (PROTOCOL.md §6.3): the writer takes a slot of the connection's
    region the daemon granted (PushSlots) and packs a group straight into it, and a PushPlaced says which;
    nothing is copied on the way out or lent to the transport. Credit the daemon grants as PushCredit (its
    tmpfs had no room for more slots) is used as on any connection: a `Payload` in a pool segment, PushData."""

    __slots__ = ("_slots", "plain", "region")

    def __init__(self, stream: int, region: MappedRegion) -> None:
        super().__init__(stream)
        self.region = region
        self._slots: deque[int] = deque()
        #: credit granted as PushCredit and not yet taken by the writer
        self.plain = 0

    def add_slots(self, slots: list[int]) -> None:
        self._slots.extend(slots)
        self.credit += len(slots)

    def add_credit(self, n: int) -> None:
        super().add_credit(n)
        self.plain += n

    def close(self) -> list[Any]:
        """The push ended: its slots are the daemon's again, and no credit may be taken any more."""
        self._slots.clear()
        self.plain = 0
        return super().close()

    def take_slot(self) -> int | None:
        """A granted slot to pack into, or None while there is none. Each slot taken is pushed as one `Placed`,
        which uses that slot's credit: items never outnumber the credit."""
        return self._slots.popleft() if self._slots else None

    def take_plain(self) -> bool:
        """Whether a unit of PushCredit was there for the writer (now taken, for one `Payload`)."""
        if self.plain <= 0:
            return False
        self.plain -= 1
        return True

    def pack(
        self, into: bytearray, offset: int, item: Any, seq: int, backlog: int, is_event: bool
    ) -> tuple[int, Buffer | None]:
        """One PushPlaced for this group and the placed groups queued behind it that credit allows, up to
        `MAX_PLACED_PER_FRAME`: the daemon takes them with one frame's work."""
        if is_event or type(item) is not Placed:
            return super().pack(into, offset, item, seq, backlog, is_event)
        at = offset + HEADER.size
        entry = PUSH_PLACED_ENTRY
        placed: Placed | None = item
        n = 0
        while placed is not None:
            entry.pack_into(into, at, self.pushed, placed.crc, placed.slot, placed.length)
            self.pushed += 1
            at += entry.size
            n += 1
            placed = self.pop_more_data(item) if n < MAX_PLACED_PER_FRAME else None
        HEADER.pack_into(into, offset, n * entry.size, FrameType.PUSH_PLACED, 0, 0, self.stream)
        return at - offset, None


#: groups one PushPlaced names at most: what fits a frame's prefix in the sender's batch
MAX_PLACED_PER_FRAME = (MAX_PREFIX - HEADER.size) // PUSH_PLACED_ENTRY.size
#: served buffers one BufferPlaced names at most (the same bound)
MAX_BUFFERS_PER_PLACED = (MAX_PREFIX - HEADER.size) // BUFFER_PLACED_ENTRY.size
