"""Reads in place: buffers the daemon put in the connection's region of shared memory (PROTOCOL.md §6.3).

A BufferPlaced names, for each served buffer, the slot it is in; the reader gets the slot itself as the
buffer's memory (no copy, no socket read), and when iteration lets the buffer go its slot goes back to the
daemon with a ReturnSlots, one frame for every slot let go in a turn of the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

from shuffled.buffers.shm import MappedRegion
from shuffled.net.once_per_turn import OncePerTurn
from shuffled.protocol.codec import encode
from shuffled.protocol.connection import ProtocolConnection
from shuffled.protocol.errors import ProtocolError
from shuffled.protocol.frames import BUFFER_PLACED_FIELDS, BufferPlaced, ReturnSlots


class PlacedReader(Protocol):
    """What a read takes a buffer in place with (`InputChannel.on_placed`)."""

    def on_placed(
        self, sequence: int, backlog: int, crc: int, slot: memoryview, give_back: Callable[[], None]
    ) -> None: ...


class ReadsInPlace:
    def __init__(self, region: MappedRegion, proto: ProtocolConnection) -> None:
        self.region = region
        self.proto = proto
        self._back: list[int] = []
        self._send_soon = OncePerTurn(self._send)

    def arrived(self, frame: BufferPlaced, reader_of: Callable[[int], PlacedReader | None]) -> None:
        """Hand each buffer of `frame` to its read, looked up for each (a buffer may end the read: one that
        fails its check), or give its slot back when the read is gone; a slot outside the region or a length
        that no slot holds breaks the rules (fatal for the connection)."""
        region = self.region
        placed = frame.placed
        for i in range(0, len(placed), BUFFER_PLACED_FIELDS):
            sequence, backlog, crc, slot, length = placed[i : i + BUFFER_PLACED_FIELDS]
            if not region.slots <= slot < region.slots + region.read_slots or not 0 < length <= region.slot_size:
                raise ProtocolError(
                    f"BufferPlaced on read stream {frame.receiver}: {length} bytes in slot {slot} (the read "
                    f"slots are {region.slots}..{region.slots + region.read_slots - 1}, of {region.slot_size} bytes)"
                )
            reader = reader_of(frame.receiver)
            if reader is None:
                self.give_back(slot)
            else:
                reader.on_placed(sequence, backlog, crc, region.read_slot(slot)[:length], partial(self.give_back, slot))

    def give_back(self, slot: int) -> None:
        self._back.append(slot)
        self._send_soon()

    def _send(self) -> None:
        back, self._back = self._back, []
        if back and self.proto.is_open:
            self.proto.send(encode(ReturnSlots(0, back)))
