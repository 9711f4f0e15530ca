"""A map writer's buffer: its writes held in the order they come, handed to a flush by partition.

Writes are copied, in the order they come, into one buffer mapped once per writer and reused by every flush:
a bytearray grown per write, or a buffer made per flush, costs its page faults again each time (several
times the copy). Writes that came in ascending partition order (a sorted writer's, or one partition's) are
flushed from where they lie; others are first gathered by partition, each partition's writes in the order
they came, into a second buffer of the same size, also reused.
"""

from __future__ import annotations

import mmap


class WriteBuffer:
    __slots__ = ("_buffer", "_gathered", "_held", "_in_order", "_last", "_writes", "held_bytes", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.held_bytes = 0
        #: bytes held per partition, in the order the partitions were first written since the last flush
        self._held: dict[int, int] = {}
        #: the writes held, as (partition, bytes), in the order they lie in the buffer
        self._writes: list[tuple[int, int]] = []
        #: the partition last written, and whether every write since the last take kept ascending order
        self._last = -1
        self._in_order = True
        self._buffer: mmap.mmap | None = None
        self._gathered: mmap.mmap | None = None

    def put(self, partition: int, data: bytes | memoryview) -> bool:
        """Copy a write in; False, having done nothing, when it does not fit what is left."""
        n = len(data)
        start = self.held_bytes
        if start + n > self.size:
            return False
        if self._buffer is None:
            self._buffer = _anonymous(self.size)
        self._buffer[start : start + n] = data
        self._held[partition] = self._held.get(partition, 0) + n
        self._writes.append((partition, n))
        if partition < self._last:
            self._in_order = False
        self._last = partition
        self.held_bytes = start + n
        return True

    def take(self) -> tuple[list[int], list[int], memoryview] | None:
        """What is held, by partition: the partitions ascending, their lengths and their bytes back to back
        (valid until the next `put`); None when nothing is. The buffer is empty again."""
        if not self._held:
            return None
        if self._in_order:
            order = list(self._held)
            assert self._buffer is not None
            data = memoryview(self._buffer)[: self.held_bytes]
        else:
            order = sorted(self._held)
            data = self._gather(order)
        lengths = list(map(self._held.__getitem__, order))
        self.clear()
        return order, lengths, data

    def _gather(self, order: list[int]) -> memoryview:
        assert self._buffer is not None
        if self._gathered is None:
            self._gathered = _anonymous(self.size)
        at: dict[int, int] = {}
        offset = 0
        for partition in order:
            at[partition] = offset
            offset += self._held[partition]
        source = memoryview(self._buffer)
        into = memoryview(self._gathered)
        start = 0
        for partition, n in self._writes:
            dest = at[partition]
            into[dest : dest + n] = source[start : start + n]
            at[partition] = dest + n
            start += n
        return into[:offset]

    def clear(self, *, for_good: bool = False) -> None:
        """Forget what is held; `for_good`: the writer is done, and its memory goes too."""
        if for_good:
            self._buffer = self._gathered = None
        self._held = {}
        self.held_bytes = 0
        self._writes = []
        self._last = -1
        self._in_order = True


def _anonymous(size: int) -> mmap.mmap:
    """Memory whose pages are made as they are first written, and stay for the writer's life: a writer of a
    few bytes costs a page, not the whole buffer zeroed."""
    return mmap.mmap(-1, size)
