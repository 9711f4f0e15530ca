"""A push's credit as slots of its connection's shared memory (PROTOCOL.md §6.3).

On a connection that agreed on shared memory, each unit of push credit names a slot of the connection's
region (buffers/shm.py); the writer puts a packed group there and says so with PushPlaced. A slot the push
was not granted, or granted and already used, is a credit violation on the push's stream: slots are the
credit, so a writer that names another's slot could overwrite that push's group before the daemon took it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ...buffers.shm import SharedRegion
from ...logs import event
from ...protocol.errors import CreditViolation, InvalidRequest

log = logging.getLogger(__name__)


class SlotCredit:
    def __init__(self, region: SharedRegion, writer: int) -> None:
        self.region = region
        self.writer = writer
        #: slots granted to the writer and not yet used
        self.granted: set[int] = set()

    def grant(self, n: int) -> list[int]:
        """Up to n slots to name in credit; fewer when the region's tmpfs has no room for their pages, and
        the rest of the credit goes through the socket (said once per connection in the log)."""
        slots, full = self.region.take(n)
        if full is not None and not self.region.full_told:
            self.region.full_told = True
            event(log, "pushes through the socket", logging.WARNING, writer=self.writer, reason=full)
        self.granted.update(slots)
        return slots

    def placed(self, slot: int, length: int) -> None:
        """The writer used `slot` (the credit it stands for is used up); an error if it may not."""
        if slot not in self.granted:
            raise CreditViolation(f"writer {self.writer}: PushPlaced names slot {slot}, not granted to it")
        if not 0 < length <= self.region.slot_size:
            raise InvalidRequest(
                f"writer {self.writer}: PushPlaced of {length} bytes (1..{self.region.slot_size} fit a slot)"
            )
        self.granted.remove(slot)

    def within(self, credit: int) -> None:
        """Slots granted beyond `credit` (the push credit outstanding) are free again: the writer spent their
        credit on PushData through the socket (credit is counted, not its kind), and a slot must never stand
        for credit that is gone, or granted slots would pile up until the region has none left. A PushPlaced
        naming one of them later is refused."""
        excess = len(self.granted) - credit
        if excess > 0:
            freed = sorted(self.granted)[-excess:]
            self.granted.difference_update(freed)
            self.region.give_back(freed)

    def copy_out(self, placed: list[tuple[int, memoryview]]) -> None:
        """The placed groups `(slot, into)`, copied into `into` (segments of the push's window); their slots
        are free again."""
        self.region.copy_out(placed)

    def dropped(self, slots: Iterable[int]) -> None:
        """Slots used whose groups are not stored (duplicates, or a frame refused) are free again."""
        self.region.give_back(slots)

    def close(self) -> None:
        """The push ended: slots granted and never used are free again."""
        granted, self.granted = self.granted, set()
        self.region.give_back(granted)
