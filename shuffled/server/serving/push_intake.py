"""What a push's data frames become (push_session.py owns the push; this is its data path).

Each PushData or PushPlaced uses one unit of the push's credit, which is one promised segment of its window:
a PushData's payload was read into that segment; a PushPlaced's is copied there from a slot of the
connection's shared memory (push_slots.py). Either is stored once its sequence number, CRC32C
and packed group are right. A PushData whose sequence number was already received (a writer retrying after
a lost reply) is dropped: its bytes are not stored twice, and the segment becomes push credit again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ...buffers import Buffer
from ...protocol.credit import SequenceChecker
from ...protocol.errors import CorruptData, CreditViolation, ShuffledError
from ...protocol.frames import PLACED_FIELDS, PushData, PushPlaced
from ...protocol.integrity import checksum
from ...protocol.packed import PushedGroup, check_push
from ..storage.writer import MapOutputWriter
from .environment import ShuffleEnvironment
from .push_slots import SlotCredit
from .push_window import PushWindow

#: a stored piece, as replicas are sent it: the buffer, its CRC32C and its runs' bytes
Stored = tuple[Buffer, int, int]
#: a checked piece, as the store takes it: the buffer, its CRC32C and its directory
Piece = tuple[Buffer, int, PushedGroup]


class PushIntake:
    def __init__(
        self,
        writer: int,
        window: PushWindow,
        out: MapOutputWriter,
        env: ShuffleEnvironment[Any],
        slots: SlotCredit | None,
    ) -> None:
        self.writer = writer
        self.window = window
        self.out = out
        self.env = env
        self.counters = env.counters
        #: on a connection with shared memory, the credit as slots of it
        self.slots = slots
        self.received = 0
        self.duplicates = 0
        self.seq = SequenceChecker()
        #: told once a PushPlaced's groups are copied out of their slots and out of the window, before they are
        #: checked and stored (the session grants the credit they stood for then)
        self.copied: Callable[[], None] | None = None

    def credited(self) -> Buffer:
        """The segment a unit of credit stands for, now filled. Credit granted and not yet used is exactly
        the window's promised segments."""
        pool = self.window.pool
        if pool is None or pool.promised <= 0:
            raise CreditViolation(f"writer {self.writer}: PushData without push credit")
        buf = pool.request()
        assert buf is not None, "a promised segment is always held"
        if self.slots is not None:
            self.slots.within(pool.promised)
        return buf

    def data(self, frame: PushData) -> Stored | None:
        """What a PushData stored (None: a duplicate); a ShuffledError discards the attempt."""
        buf: Buffer = frame.payload
        buf.length = frame.length
        if self.seq.is_duplicate(frame.sequence):
            self._duplicate(buf)
            return None
        try:
            self.seq.check(frame.sequence)
        except ShuffledError:
            buf.release()  # into the window, which goes back whole as the push fails
            raise
        self._detach(buf)
        piece = self._checked(buf, frame.sequence, frame.crc or 0)
        self.out.add_all([piece])
        return self._counted([piece])[0]

    def placed(self, frame: PushPlaced) -> list[Stored]:
        """What the groups a PushPlaced names stored, in order (duplicates left out); a ShuffledError discards
        the attempt. A frame's groups are taken together: copied out of their slots (slots that follow each
        other in one call), checked, then stored; every slot is free again once copied or refused, every
        segment not stored is released."""
        slots = self.slots
        assert slots is not None, "PushPlaced comes only with shared memory"
        taken: list[tuple[int, memoryview]] = []
        #: the segments copied into, with each group's sequence number and the CRC32C it was sent with
        kept: list[tuple[Buffer, int, int]] = []
        try:
            self._take(frame.placed, slots, taken, kept)
        except ShuffledError:
            slots.dropped(slot for slot, _ in taken)
            _release(buf for buf, _, _ in kept)
            raise
        try:
            slots.copy_out(taken)  # frees every slot, copied or not
        except ShuffledError:  # the client shrank its region: the segments are credit again, the push ends
            _release(buf for buf, _, _ in kept)
            raise
        for buf, _, _ in kept:
            self._detach(buf)
        if self.copied is not None:
            try:
                self.copied()
            except BaseException:  # detached: in neither the window nor the store
                _release(buf for buf, _, _ in kept)
                raise
        checked: list[Piece] = []
        try:
            for buf, sequence, crc in kept:
                checked.append(self._checked(buf, sequence, crc))
        except ShuffledError:
            _release(piece[0] for piece in checked)
            _release(buf for buf, _, _ in kept[len(checked) + 1 :])
            raise
        self.out.add_all(checked)
        self.counters.placed_buffers += len(checked)
        return self._counted(checked)

    def _take(
        self,
        entries: list[int],
        slots: SlotCredit,
        taken: list[tuple[int, memoryview]],
        kept: list[tuple[Buffer, int, int]],
    ) -> None:
        """Each entry's slot used up and a segment of the window for its group (in `taken` and `kept`), its
        sequence number checked; a duplicate's slot and segment are free again at once."""
        for i in range(0, len(entries), PLACED_FIELDS):
            sequence, crc, slot, length = entries[i : i + PLACED_FIELDS]
            slots.placed(slot, length)
            buf = self.credited()  # a granted slot stands for credit outstanding (`SlotCredit.within`)
            if self.seq.is_duplicate(sequence):
                slots.dropped((slot,))
                self._duplicate(buf)
                continue
            buf.length = length
            taken.append((slot, buf.memory[:length]))
            kept.append((buf, sequence, crc))
            self.seq.check(sequence)

    def _duplicate(self, buf: Buffer) -> None:
        self.duplicates += 1
        buf.release()  # back into the window: credit again

    def _detach(self, buf: Buffer) -> None:
        """The buffer leaves the window for the store: the global pool's again when the store frees it, or at
        once if it is refused."""
        pool = self.window.pool
        assert pool is not None
        pool.detach(buf, self.env.pool.give)

    def _checked(self, buf: Buffer, sequence: int, sent_crc: int) -> Piece:
        """A group (its buffer detached) whose CRC32C and directory are right, ready for the store; a refused
        one is released."""
        try:
            crc = checksum(buf.data())
            if crc != sent_crc:
                raise CorruptData(
                    f"PushData {sequence} of writer {self.writer} failed its CRC32C check (got {crc:08x}, "
                    f"the writer sent {sent_crc:08x}); the attempt is discarded"
                )
            return buf, crc, check_push(buf.data(), self.out.attempt, self.out.partitions)
        except ShuffledError:
            buf.release()
            raise

    def _counted(self, pieces: list[Piece]) -> list[Stored]:
        """Stored pieces, counted, as replicas are sent them."""
        self.received += len(pieces)
        counters = self.counters
        counters.pushed_buffers += len(pieces)
        stored = [(buf, crc, group.data_bytes) for buf, crc, group in pieces]
        counters.pushed_bytes += sum(piece[2] for piece in stored)
        return stored


def _release(buffers: Iterable[Buffer]) -> None:
    for buf in buffers:
        buf.release()
