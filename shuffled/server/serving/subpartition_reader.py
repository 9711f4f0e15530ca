"""The subpartition reader: serving a local read whose chunks are partly on disk, in order, with bounded memory.

The stream's items are the store's snapshot: in-memory chunks (already holding a
reference on their segment) and spilled chunks (a file range and its CRC32C).
Memory chunks are queued as they come up. A spilled chunk is read into a segment
only when the consumer has credit for it that no queued buffer already uses, so a
read never holds more loaded segments than its consumer's credit (at most its
exclusive plus floating buffers), however large the partition. Consecutive
spilled chunks that lie back to back in one file are read with one `preadv`, and
since the store hands them out sorted by offset, each file is read front to back.
Segments come from the read reserve, so stored data can always be read back
(storage/loader.py loads them).

Every remaining item counts as backlog (`deferred`), so the consumer's credit
grows as if everything were already queued.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from ...buffers import Chunk
from ...net.streams import BufferResponseStream
from ...protocol.errors import ShuffledError
from ..storage.loader import ChunkLoader, run, take
from ..storage.store import DiskChunk
from .environment import ShuffleEnvironment

#: most chunks loaded with one preadv
MAX_BATCH = 16


class SubpartitionReader(BufferResponseStream):
    __slots__ = ("_finished", "_loader", "_loading", "env", "items", "on_done", "on_error")

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
        self._loader = ChunkLoader(env.disk)
        self._loading: asyncio.Task[None] | None = None
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
                self._loader.close()
                self.on_done()
            return
        room = self.credit - self.queued
        if room <= 0:
            return
        # The batch is cut to what memory has free when its segments are taken (`take`), not here.
        self._loading = asyncio.create_task(self._load(run(items, min(room, MAX_BATCH))))

    async def _load(self, batch: list[DiskChunk]) -> None:
        pool = self.env.pool
        try:
            buffers = await take(pool, len(batch), pool.give)  # cancelled by shutdown, as is the load
            chunks = await self._loader.load(batch[: len(buffers)], buffers)
        except ShuffledError as exc:
            self._loading = None
            self.on_error(exc)
            return
        self._loading = None
        for chunk in chunks:
            self.items.popleft()
            self.deferred -= 1
            self.push_data(chunk)
        self.pump()

    def shutdown(self) -> None:
        super().shutdown()
        if self._loading is not None:
            self._loading.cancel()  # a read under way gives its segments back once its thread is done
            self._loading = None
        while self.items:
            item = self.items.popleft()
            if isinstance(item, Chunk):
                item.buffer.release()
        self._loader.close()
