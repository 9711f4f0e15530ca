"""The subpartition reader: serving a local read whose chunks are partly on disk, in order, with bounded memory.

The stream's items are the store's snapshot: in-memory chunks (already holding a
reference on their segment) and spilled chunks (a file range and its CRC32C).
Memory chunks are queued as they come up. A spilled chunk is read into a segment
only when the consumer has credit for it that no queued buffer already uses, so a
read never holds more loaded segments than its consumer's credit (at most its
exclusive plus floating buffers), however large the partition. Consecutive
spilled chunks that lie back to back in one file are read with one `preadv`, and
since the store hands them out sorted by offset, each file is read front to back.
Segments come from the read reserve, so stored data can always be read back.

Every remaining item counts as backlog (`deferred`), so the consumer's credit
grows as if everything were already queued.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Callable

from ...buffers import Buffer, Chunk
from ...net.streams import BufferResponseStream
from ...protocol.errors import CorruptData, PartitionNotFound, ShuffledError
from ..storage.store import DiskChunk
from .environment import ShuffleEnvironment

#: most chunks loaded with one preadv
MAX_BATCH = 16


class SubpartitionReader(BufferResponseStream):
    __slots__ = ("_fd", "_fd_path", "_finished", "_loading", "_reading", "env", "items", "on_done", "on_error")

    def __init__(
        self,
        stream: int,
        credit: int,
        on_end: Callable[[BufferResponseStream], None],
        env: ShuffleEnvironment,
        items: list[Chunk | DiskChunk],
        on_done: Callable[[], None],
        on_error: Callable[[ShuffledError], None],
    ) -> None:
        super().__init__(stream, credit, on_end)
        self.env = env
        self.items: deque[Chunk | DiskChunk] = deque(items)
        self.deferred = len(items)
        #: called once every item is queued (the stream may then end)
        self.on_done = on_done
        self.on_error = on_error
        self._loading: asyncio.Task[None] | None = None
        self._reading = False
        self._fd: int | None = None
        self._fd_path = ""
        self._finished = False

    def push_data(self, chunk: Chunk) -> None:
        """Everything this stream queues comes from this daemon's own store (memory or disk): count it."""
        counters = self.env.counters
        counters.served_local_bytes += chunk.buffer.length
        counters.served_local_buffers += 1
        super().push_data(chunk)

    def add_credit(self, n: int) -> None:
        super().add_credit(n)
        self.pump()

    def pump(self) -> None:
        """Queue what can go now; start loading the next spilled chunks if credit is free for them."""
        if self.closed or self._loading is not None:
            return
        items = self.items
        while items and isinstance(head := items[0], Chunk):
            items.popleft()
            self.deferred -= 1
            self.push_data(head)
        if self.sender is not None:
            self.sender.wake(self)
        if not items:
            if not self._finished:
                self._finished = True
                self._close_fd()
                self.on_done()
            return
        room = self.credit - self.queued
        if room <= 0:
            return
        # The batch is cut to what memory has free when its segments are taken (`_take`), not here.
        limit = min(room, MAX_BATCH)
        batch: list[DiskChunk] = []
        for item in items:
            if not isinstance(item, DiskChunk) or len(batch) >= limit:
                break
            if batch and (item.path != batch[-1].path or item.offset != batch[-1].offset + batch[-1].length):
                break
            batch.append(item)
        self._loading = asyncio.create_task(self._load(batch))

    async def _load(self, batch: list[DiskChunk]) -> None:
        pool = self.env.pool
        disk = self.env.disk
        assert disk is not None
        buffers = await self._take(len(batch))  # cancelled by shutdown
        del batch[len(buffers) :]
        for buf, chunk in zip(buffers, batch, strict=True):
            buf.set_recycler(pool.give)
            buf.length = chunk.length
        path = batch[0].path
        if self._fd is not None and self._fd_path != path:
            self._close_fd()
        error: ShuffledError | None = None
        self._reading = True  # from here the thread writes into the buffers: no cancelling
        try:
            self._fd, crcs = await disk.read(self._fd, path, batch[0].offset, [b.data() for b in buffers])
            self._fd_path = path
            bad = [c for c, crc in zip(batch, crcs, strict=True) if c.crc != crc]
            if bad:
                error = CorruptData(
                    f"spilled data of partition {bad[0].partition} (map attempt {bad[0].attempt}) failed its "
                    f"CRC32C check at offset {bad[0].offset} of {path}"
                )
        except FileNotFoundError:
            self._fd = None
            error = PartitionNotFound(f"spill file {path} is gone (shuffle removed while being read?)")
        except (OSError, EOFError) as exc:
            self._fd = None
            error = CorruptData(f"reading spilled data from {path} failed: {exc}")
        finally:
            self._reading = False
            self._loading = None
        if error is not None or self.closed:
            for buf in buffers:
                buf.release()
            if self.closed:
                self._close_fd()
            elif error is not None:
                self.on_error(error)
            return
        for buf, chunk in zip(buffers, batch, strict=True):
            self.items.popleft()
            self.deferred -= 1
            self.push_data(Chunk(buf, chunk.partition, chunk.attempt, chunk.crc))
        self.pump()

    async def _take(self, want: int) -> list[Buffer]:
        """Up to `want` segments of the read reserve, counted when they are taken: whatever is free then (a
        consumer's credit may exceed what a small or busy pool can give at once), else one, waited for in
        turn (the reserve guarantees it in time), plus what the wait left free. Never more than is free, so
        a batch does not wait for memory it cannot get; what requests already waiting can use stays theirs
        (`free_for_readers`: a waiting push leaves the reserve to reads)."""
        pool = self.env.pool
        now = min(want, pool.free_for_readers)
        if now:
            got = pool.try_take(now, use_reserve=True)
            if got is not None:
                return got
        buffers = await pool.take(1, use_reserve=True)
        more = min(want - 1, pool.free_for_readers)
        if more:
            buffers += pool.try_take(more, use_reserve=True) or []
        return buffers

    def shutdown(self) -> None:
        super().shutdown()
        if self._loading is not None and not self._reading:
            self._loading.cancel()
            self._loading = None
        while self.items:
            item = self.items.popleft()
            if isinstance(item, Chunk):
                item.buffer.release()
        if not self._reading:
            self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
