"""One map attempt's output, pushed under the daemon's push credit (see aio.py for the whole client)."""

from __future__ import annotations

import asyncio
import mmap
from collections.abc import Sequence
from itertools import chain, repeat
from operator import add

from shuffled.buffers import Buffer
from shuffled.net.streams import Payload, PlacedPushStream, PushEvent, PushStream
from shuffled.protocol.compression import compress_block
from shuffled.protocol.errors import InvalidRequest, MapOutputStateError, ShuffledError
from shuffled.protocol.frames import MAX_REPLICAS
from shuffled.protocol.packed import RunPacker

from .session import Session

#: bytes a writer collects before it orders them by partition and pushes them
DEFAULT_WRITER_BUFFER = 8 << 20


class MapWriter:
    """One map attempt's output: writes collected in one bounded buffer, pushed ordered by partition.

    Writes are copied, in the order they come, into one buffer of `buffer_size` mapped once per writer and
    reused by every flush (a bytearray grown per write, or a buffer made per flush, costs its page faults
    again each time: several times the copy). A flush packs it into full segments (`RunPacker`) in partition
    order, so every flush is one ascending sequence of packed groups and a partition's writes keep their
    order. Writes that came in ascending partition order (a sorted writer's, or one partition's) are packed
    from where they lie; others are first gathered by partition into a second reused buffer.
    """

    def __init__(
        self,
        session: Session,
        stream_id: int,
        attempt: int,
        partitions: int,
        compression: str | None = None,
        buffer_size: int = DEFAULT_WRITER_BUFFER,
    ) -> None:
        self.session = session
        self.attempt = attempt
        self.partitions = partitions
        self.compression = compression
        self.buffer_size = buffer_size
        #: bytes written per partition before compression (what `commit()` returns is what the daemon stores)
        self.uncompressed_lengths = [0] * partitions
        region = session.region
        self.stream = PushStream(stream_id) if region is None else PlacedPushStream(stream_id, region)
        #: bytes held per partition, in the order the partitions were first written since the last flush
        self._held: dict[int, int] = {}
        self._held_bytes = 0
        #: the writes held, as (partition, bytes), in the order they lie in the buffer
        self._writes: list[tuple[int, int]] = []
        #: the partition last written, and whether every write since the last flush kept ascending order
        self._last = -1
        self._in_order = True
        self._buffer: mmap.mmap | None = None
        self._gathered: mmap.mmap | None = None
        #: held while a flush packs from the buffer: writes wait for it to end
        self._flushing = asyncio.Lock()
        loop = asyncio.get_running_loop()
        self._opened: asyncio.Future[None] = loop.create_future()
        self._done: asyncio.Future[list[int] | None] = loop.create_future()
        self._finished = False
        #: the commit or abort is queued: no data may follow it on the stream
        self._ended = False
        self.bytes_written = 0

    def write_nowait(self, partition: int, data: bytes | bytearray | memoryview) -> bool:
        """`write` when the buffer has room (a copy of `data` goes in it); False, having done nothing, when the
        buffer must be flushed first: then call `write`."""
        if type(data) is not bytes or self._finished or not 0 <= partition < self.partitions:
            data = self._accept(partition, data)  # what is wrong, or any other buffer as a view of bytes
        n = len(data)
        if not n:
            return True
        start = self._held_bytes
        if start + n > self.buffer_size or self._flushing.locked():
            return False
        if self._buffer is None:
            self._buffer = _anonymous(self.buffer_size)
        self._buffer[start : start + n] = data
        self._held[partition] = self._held.get(partition, 0) + n
        self._writes.append((partition, n))
        if partition < self._last:
            self._in_order = False
        self._last = partition
        self._held_bytes = start + n
        self.bytes_written += n
        self.uncompressed_lengths[partition] += n
        return True

    async def write(self, partition: int, data: bytes | bytearray | memoryview) -> None:
        """Append bytes to a reduce partition. They are copied: `data` may be reused when this returns."""
        if self.write_nowait(partition, data):
            return
        await self._flush()
        if self.write_nowait(partition, data):
            return
        view = self._accept(partition, data)  # larger than the whole buffer: packed straight from `data`
        self.bytes_written += len(view)
        self.uncompressed_lengths[partition] += len(view)
        await self._push_packed(RunPacker((partition,), (len(view),), view))

    async def write_sorted(self, lengths: Sequence[int], data: bytes | bytearray | memoryview) -> None:
        """Write data already grouped by partition: `lengths[p]` bytes of partition p, back to back in `data`
        (the shape of a Spark index file; zeros for empty partitions, partitions past `len(lengths)` empty).

        What `write` buffered goes out first, then `data` is packed straight into segments: no copy into the
        buffer, and a few C-level calls per segment however many partitions. `data` may be reused when this
        returns."""
        self._check_open()
        if len(lengths) > self.partitions:
            raise InvalidRequest(f"{len(lengths)} lengths for a map output of {self.partitions} partitions")
        view = memoryview(data).cast("B")
        packer = RunPacker.from_lengths(lengths, view)  # ValueError: lengths that do not describe `data`
        await self._flush()
        if self.bytes_written:
            self.uncompressed_lengths = list(map(add, self.uncompressed_lengths, chain(lengths, repeat(0))))
        else:  # the first write: one C-level copy, not the sums above (20 ns a partition)
            self.uncompressed_lengths[: len(lengths)] = lengths
        self.bytes_written += len(view)
        await self._push_packed(packer)

    def _check_open(self) -> None:
        if self._finished:
            raise MapOutputStateError("write after commit or abort")
        self._raise_if_failed()

    def _accept(self, partition: int, data: bytes | bytearray | memoryview) -> memoryview:
        """`data` as bytes to write to `partition`, or the error writing it is."""
        self._check_open()
        if not 0 <= partition < self.partitions:
            raise InvalidRequest(f"partition {partition} outside 0..{self.partitions - 1}")
        return memoryview(data).cast("B")

    async def _flush(self) -> None:
        """Push what the buffer holds: one ascending sequence of full groups."""
        async with self._flushing:
            if not self._held:
                return
            if self._in_order:
                order = list(self._held)
                assert self._buffer is not None
                data = memoryview(self._buffer)[: self._held_bytes]
            else:
                order = sorted(self._held)
                data = self._gather(order)
            lengths = list(map(self._held.__getitem__, order))
            self._clear()
            await self._push_packed(RunPacker(order, lengths, data, ascending=True))

    def _gather(self, order: list[int]) -> memoryview:
        """The held writes copied into the second buffer grouped by partition, in `order`, each partition's
        writes in the order they came."""
        assert self._buffer is not None
        if self._gathered is None:
            self._gathered = _anonymous(self.buffer_size)
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

    def _clear(self, *, for_good: bool = False) -> None:
        """Forget what is held; `for_good`: the writer is done with its buffers too."""
        if for_good:
            self._buffer = self._gathered = None
        self._held = {}
        self._held_bytes = 0
        self._writes = []
        self._last = -1
        self._in_order = True

    async def _push_packed(self, packer: RunPacker) -> None:
        while not packer.done:
            buf = await self._take_buffer()
            if self.compression:
                buf.length = packer.pack_blocks_into(buf.memory, self.attempt, compress_block)
            else:
                buf.length = packer.pack_into(buf.memory, self.attempt)
            if self.stream.closed:  # the daemon failed this writer: nothing more goes out
                buf.release()
                self._raise_if_failed()
                return
            if self._ended:  # a write that waited for memory while the output was committed or aborted
                buf.release()
                raise MapOutputStateError("map output already committed or aborted")
            self.stream.push_data(Payload(buf))
            self.session.wake(self.stream)

    async def _take_buffer(self) -> Buffer:
        buf = await self.session.segment(self._done)
        if buf is None:
            self._raise_if_failed()
            raise MapOutputStateError("map output finished while waiting for memory")
        return buf

    async def commit(self) -> list[int]:
        """Push what is buffered and commit; returns bytes per reduce partition as the daemon stored them."""
        self._finish()
        await self._flush()
        self._clear(for_good=True)
        self._send(PushEvent.COMMIT)
        lengths = await self._done
        assert lengths is not None
        return lengths

    async def abort(self) -> None:
        """Drop this map attempt's output; the daemon frees its buffers."""
        if self._finished and self._done.done():
            return
        self._finish()
        self._clear(for_good=True)
        self._send(PushEvent.ABORT)
        await self._done

    def _finish(self) -> None:
        if self._finished:
            raise MapOutputStateError("map output already committed or aborted")
        self._raise_if_failed()
        self._finished = True

    def _send(self, event: PushEvent) -> None:
        self._raise_if_failed()
        self._ended = True
        self.stream.push_event(event)
        self.session.wake(self.stream)

    def _raise_if_failed(self) -> None:
        if self._done.done() and self._done.exception() is not None:
            raise self._done.exception()  # type: ignore[misc]

    def on_credit(self) -> None:
        """Push credit arrived (the protocol connection added it to this writer's stream)."""
        if not self._opened.done():
            self._opened.set_result(None)
        self.session.wake(self.stream)

    def on_done(self, lengths: list[int] | None) -> None:
        if not self._done.done():
            self._done.set_result(lengths)

    def on_error(self, exc: ShuffledError) -> None:
        self._finished = True
        self.stream.shutdown()
        self._clear(for_good=True)
        for fut in (self._opened, self._done):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved here; raised to the caller via _raise_if_failed or await


def _anonymous(size: int) -> mmap.mmap:
    """Memory whose pages are made as they are first written, and stay for the writer's life: a writer of a
    few bytes costs a page, not the whole buffer zeroed."""
    return mmap.mmap(-1, size)


def check_replicas(replicas: int | None) -> None:
    """Refuse here what the daemon would find malformed: a bad `replicas` would close the whole connection."""
    if replicas is not None and (type(replicas) is not int or not 1 <= replicas <= MAX_REPLICAS):
        raise ValueError(f"replicas must be an integer in 1..{MAX_REPLICAS} or None, got {replicas!r}")
