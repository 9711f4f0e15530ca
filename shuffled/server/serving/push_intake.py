"""What a push's data frames become (push_session.py owns the push; this is its data path).

Each PushData or PushPlaced uses one unit of the push's credit, which is one promised segment of its window:
a PushData's payload was read into that segment; a PushPlaced's is copied there from a slot of the
connection's shared memory (push_slots.py). Either is stored once its sequence number, CRC32C
and packed group are right. A PushData whose sequence number was already received (a writer retrying after
a lost reply) is dropped: its bytes are not stored twice, and the segment becomes push credit again.
"""

from __future__ import annotations

from typing import Any

from ...buffers import Buffer
from ...protocol.credit import SequenceChecker
from ...protocol.errors import CorruptData, CreditViolation, ShuffledError
from ...protocol.frames import PLACED_FIELDS, PushData, PushPlaced
from ...protocol.integrity import checksum
from ...protocol.packed import check_push
from ..storage.writer import MapOutputWriter
from .environment import ShuffleEnvironment
from .push_slots import SlotCredit
from .push_window import PushWindow

#: a stored piece, as replicas are sent it: the buffer, its CRC32C and its runs' bytes
Stored = tuple[Buffer, int, int]


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

    def credited(self) -> Buffer:
        """The segment a unit of credit stands for, now filled. Credit granted and not yet used is exactly
        the window's promised segments."""
        pool = self.window.pool
        if pool is None or pool.promised <= 0:
            raise CreditViolation(f"writer {self.writer}: PushData without push credit")
        buf = pool.request()
        assert buf is not None, "a promised segment is always held"
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
            buf.release()
            raise
        return self._store(buf, frame.sequence, frame.crc or 0)

    def placed(self, frame: PushPlaced) -> list[Stored]:
        """What the groups a PushPlaced names stored, in order (duplicates left out); a ShuffledError discards
        the attempt. All its groups are copied out of their slots before the first is stored, so that slots
        that follow each other go in one call; every slot is free again once copied or refused."""
        slots = self.slots
        assert slots is not None, "PushPlaced comes only with shared memory"
        taken: list[tuple[int, memoryview]] = []
        #: the segments copied into, with each group's sequence number and the CRC32C it was sent with
        kept: list[tuple[Buffer, int, int]] = []
        try:
            self._take(frame.placed, slots, taken, kept)
            slots.copy_out(taken)
            taken = []
            kept.reverse()
            stored: list[Stored] = []
            while kept:
                buf, sequence, crc = kept.pop()
                stored.append(self._store(buf, sequence, crc))
                self.counters.placed_buffers += 1
            return stored
        except ShuffledError:  # the segments not stored are credit again, the push ends
            slots.dropped(slot for slot, _ in taken)
            for buf, _, _ in kept:
                buf.release()
            raise

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
            buf = self.credited()
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

    def _store(self, buf: Buffer, sequence: int, sent_crc: int) -> Stored:
        """The buffer leaves the window for the store (the global pool's again when the store frees it)."""
        pool = self.window.pool
        assert pool is not None
        pool.detach(buf, self.env.pool.give)
        try:
            crc = checksum(buf.data())
            if crc != sent_crc:
                raise CorruptData(
                    f"PushData {sequence} of writer {self.writer} failed its CRC32C check (got {crc:08x}, "
                    f"the writer sent {sent_crc:08x}); the attempt is discarded"
                )
            group = check_push(buf.data(), self.out.attempt, self.out.partitions)
            self.out.add(buf, crc, group)
        except ShuffledError:
            if buf.refs:
                buf.release()
            raise
        self.received += 1
        self.counters.pushed_buffers += 1
        self.counters.pushed_bytes += group.data_bytes
        return buf, crc, group.data_bytes
