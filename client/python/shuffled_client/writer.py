"""One map attempt's output, pushed under the daemon's push credit (see aio.py for the whole client)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from itertools import chain, repeat
from operator import add
from typing import Any

from shuffled.buffers import Buffer
from shuffled.net.streams import Payload, Placed, PlacedPushStream, PushEvent, PushStream
from shuffled.protocol.compression import compress_block
from shuffled.protocol.errors import InvalidRequest, MapOutputStateError, ShuffledError
from shuffled.protocol.frames import MAX_REPLICAS
from shuffled.protocol.integrity import checksum
from shuffled.protocol.packed import RunPacker

from .session import Session
from .write_buffer import WriteBuffer

#: bytes a writer collects before it orders them by partition and pushes them
DEFAULT_WRITER_BUFFER = 8 << 20


class MapWriter:
    """One map attempt's output: writes collected in one bounded buffer (write_buffer.py), pushed ordered by
    partition. A flush packs what the buffer holds into full segments (`RunPacker`) in partition order, so
    every flush is one ascending sequence of packed groups and a partition's writes keep their order.
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
        #: bytes written per partition before compression (what `commit()` returns is what the daemon stores)
        self.uncompressed_lengths = [0] * partitions
        region = session.region
        self.stream = PushStream(stream_id) if region is None else PlacedPushStream(stream_id, region)
        self._buffer = WriteBuffer(buffer_size)
        #: held while a flush packs from the buffer: writes wait for it to end
        self._flushing = asyncio.Lock()
        #: set by the next push credit, for a writer waiting for a slot of shared memory
        self._credited: asyncio.Future[None] | None = None
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
        if self._flushing.locked() or not self._buffer.put(partition, data):
            return False
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
        What `write` buffered goes out first, then `data` is packed straight into segments (no copy into the
        buffer, a few C-level calls per segment however many partitions); it may be reused on return."""
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
            held = self._buffer.take()
            if held is not None:
                order, lengths, data = held
                await self._push_packed(RunPacker(order, lengths, data, ascending=True))

    async def _push_packed(self, packer: RunPacker) -> None:
        stream = self.stream
        while not packer.done:
            memory, buf, slot = await self._room()
            if self.compression:
                n = packer.pack_blocks_into(memory, self.attempt, compress_block)
            else:
                n = packer.pack_into(memory, self.attempt)
            if stream.closed or self._ended:  # the daemon failed this writer, or it ended while this waited
                if buf is not None:
                    buf.release()
                self._raise_if_failed()
                raise MapOutputStateError("map output already committed or aborted")
            if buf is None:
                stream.push_data(Placed(slot, n, checksum(memory[:n])))
            else:
                buf.length = n
                stream.push_data(Payload(buf))
            self.session.wake(stream)

    async def _room(self) -> tuple[memoryview, Buffer | None, int]:
        """Where the next group is packed: a segment of the client's pool, or with shared memory straight into
        a slot the daemon granted (no copy on the way out), waiting for its next PushSlots while none is. A slot
        is taken only while the push goes on: the slots of one that failed or ended may be another's now."""
        stream = self.stream
        if not isinstance(stream, PlacedPushStream):
            buf = await self.session.segment(self._done)
            if buf is not None:
                return buf.memory, buf, -1
        else:
            while not (self._done.done() or stream.closed or self._ended):
                slot = stream.take_slot()
                if slot is not None:
                    return stream.region.slot(slot), None, slot
                if stream.take_plain():  # the daemon's tmpfs had no room for a slot: through the socket
                    buf = await self.session.segment(self._done)
                    if buf is not None:
                        return buf.memory, buf, -1
                if self._credited is None or self._credited.done():  # one future, so every waiter wakes
                    self._credited = asyncio.get_running_loop().create_future()
                either: set[asyncio.Future[Any]] = {self._credited, self._done}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        self._raise_if_failed()
        raise MapOutputStateError("map output finished while waiting for memory")

    async def commit(self) -> list[int]:
        """Push what is buffered and commit; returns bytes per reduce partition as the daemon stored them."""
        self._finish()
        await self._flush()
        self._buffer.clear(for_good=True)
        self._send(PushEvent.COMMIT)
        lengths = await self._done
        assert lengths is not None
        return lengths

    async def abort(self) -> None:
        """Drop this map attempt's output; the daemon frees its buffers."""
        if self._finished and self._done.done():
            return
        self._finish()
        self._buffer.clear(for_good=True)
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
        if self._credited is not None and not self._credited.done():
            self._credited.set_result(None)
        self.session.wake(self.stream)

    def on_done(self, lengths: list[int] | None) -> None:
        if not self._done.done():
            self._done.set_result(lengths)

    def on_error(self, exc: ShuffledError) -> None:
        self._finished = True
        self.stream.shutdown()
        self._buffer.clear(for_good=True)
        for fut in (self._opened, self._done):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved here; raised to the caller via _raise_if_failed or await


def check_replicas(replicas: int | None) -> None:
    """Refuse here what the daemon would find malformed: a bad `replicas` would close the whole connection."""
    if replicas is not None and (type(replicas) is not int or not 1 <= replicas <= MAX_REPLICAS):
        raise ValueError(f"replicas must be an integer in 1..{MAX_REPLICAS} or None, got {replicas!r}")
