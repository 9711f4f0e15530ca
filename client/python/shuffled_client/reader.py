"""Reading reduce partitions into the client's own pool segments, under credit (see aio.py for the whole
client): each run of a partition is one chunk, each packed group one group, and a segment becomes credit
again when iteration has passed its last run."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from itertools import chain
from typing import TypeVar

from shuffled.buffers import Buffer, LocalPool
from shuffled.net.channel import InputChannel
from shuffled.net.once_per_turn import OncePerTurn
from shuffled.protocol.compression import decompress_run
from shuffled.protocol.credit import ChannelCredit, FloatingPool
from shuffled.protocol.errors import ProtocolError, ShuffledError
from shuffled.protocol.frames import PartitionRequest
from shuffled.protocol.packed import Directory, read_payload

from .session import Session

T = TypeVar("T")


class ReadChunk:
    """One run: bytes one map attempt wrote for one reduce partition (all of them, or the next part when the
    pair spans runs, which then come one after another). `data` is valid until `release()` or the next
    iteration; the pool buffer it lies in is shared with the other runs of its BufferResponse."""

    __slots__ = ("_buffer", "_compressed", "_data", "_end", "_start", "attempt", "partition")

    def __init__(
        self, buffer: Buffer, partition: int, attempt: int, start: int, end: int, compressed: bool = False
    ) -> None:
        buffer.retain()
        self._buffer: Buffer | None = buffer
        self.partition = partition
        self.attempt = attempt
        self._start = start
        self._end = end
        self._compressed = compressed
        self._data: memoryview | None = None

    @property
    def data(self) -> memoryview:
        """The run's bytes, read-only (decompressed on first use for a compressed application; the pool buffer,
        and so its credit, is held until iteration passes its last run either way, which bounds a reader's
        memory). Read-only whichever way they came: a read in place is a view of a slot mapped read-only."""
        if self._buffer is None:
            raise ValueError("chunk already released")
        if self._data is None:
            run = self._buffer.memory[self._start : self._end].toreadonly()
            self._data = decompress_run(run) if self._compressed else run
        return self._data

    def release(self) -> None:
        """Let go of the run; its buffer becomes credit again once every run of it is let go and passed."""
        if self._buffer is not None:
            buf, self._buffer = self._buffer, None
            self._data = None
            buf.release()


class ReadGroup:
    """One packed group as it arrived (PROTOCOL.md §3.3): `lengths[k]` bytes of reduce partition `partitions[k]`,
    written by map attempt `attempt`, back to back in `data` (partitions strictly ascending, every length at
    least 1). The tuples are read from the group's directory (checked when the buffer arrived) when first asked
    for and `data` is a slice of the received buffer, so a group costs one object whatever its run count: the
    view for consumers that handle bytes in bulk (count, checksum, hand to numpy) rather than a run at a time.
    A pair (partition, attempt) may continue in the next group, as its runs do. Valid until `release()` or the
    next iteration; the buffer is shared with the other groups of its BufferResponse."""

    __slots__ = ("_buffer", "_directory", "attempt")

    def __init__(self, buffer: Buffer, d: Directory) -> None:
        buffer.retain()
        self._buffer: Buffer | None = buffer
        self._directory: Directory | None = d
        self.attempt = d.attempt

    @property
    def partitions(self) -> tuple[int, ...]:
        """The runs' partitions (read from the buffer when first asked for: a consumer of `data` alone never
        pays for an int a run)."""
        return self._held()[1].partitions

    @property
    def lengths(self) -> tuple[int, ...]:
        return self._held()[1].lengths

    @property
    def data(self) -> memoryview:
        """The runs' bytes back to back, read-only: run k is the `lengths[k]` bytes after the first k runs'."""
        buffer, d = self._held()
        return buffer.memory[d.data : d.end].toreadonly()

    def _held(self) -> tuple[Buffer, Directory]:
        if self._buffer is None or self._directory is None:
            raise ValueError("group already released")
        return self._buffer, self._directory

    def release(self) -> None:
        """Let go of the group; its buffer becomes credit again once every group of it is let go and passed
        (and its directory, a view of the buffer, goes with it)."""
        self._directory = None
        if self._buffer is not None:
            buf, self._buffer = self._buffer, None
            buf.release()


def _runs(groups: list[Directory]) -> Iterator[tuple[int, int, int, int]]:
    """(partition, attempt, start, end) of each run of a payload's groups, in order: a list made in C-level
    calls, iterated without a generator frame per run (a nested generator was a fifth of a relayed read's
    client CPU per 32 KiB buffer of one run)."""
    out: list[tuple[int, int, int, int]] = []
    for d in groups:
        d.add_runs(out)
    return iter(out)


class Arrivals:
    """The checked payloads of one read, in the order they arrived, until its end or its error: what its
    iteration takes."""

    __slots__ = ("_queue", "_wake", "ended", "error")

    def __init__(self) -> None:
        self._queue: deque[tuple[Buffer, list[Directory]]] = deque()
        self._wake = asyncio.Event()
        self.ended = False
        self.error: ShuffledError | None = None

    @property
    def over(self) -> bool:
        """The read ended or failed: nothing more will arrive."""
        return self.ended or self.error is not None

    def put(self, payload: Buffer, groups: list[Directory]) -> None:
        self._queue.append((payload, groups))
        self._wake.set()

    def end(self) -> None:
        self.ended = True
        self._wake.set()

    def fail(self, exc: ShuffledError) -> None:
        if not self.over:
            self.error = exc
        self._wake.set()

    def take(self) -> tuple[Buffer | None, list[Directory] | None]:
        """The next payload and its groups if one is queued, else (None, None)."""
        return self._queue.popleft() if self._queue else (None, None)

    async def wait(self) -> bool:
        """Until a payload is queued (True), or the read is over with none left (False)."""
        while not self._queue:
            if self.over:
                return False
            self._wake.clear()
            await self._wake.wait()
        return True

    def drop(self) -> None:
        """The reader is closed: what is queued goes back, and nothing more is taken."""
        self.ended = True
        while self._queue:
            self._queue.popleft()[0].release()


class PartitionReader(InputChannel):
    """An input gate with one channel (to the local daemon), credit-controlled.

    Iterate it for one chunk per run, or `groups()` for one view per packed group (the bulk read); one or the
    other per reader."""

    def __init__(self, session: Session, receiver: int, req: PartitionRequest, compressed: bool = False) -> None:
        self._floating = FloatingPool(session.floating)
        super().__init__(receiver, ChannelCredit(session.exclusive, self._floating))
        self.session = session
        self.req = req
        #: the attempts the request names: a group of any other is malformed (§7.6)
        self._attempts = frozenset(chain.from_iterable(req.locations.values()))
        self._pool: LocalPool | None = None
        self._arrived = Arrivals()
        self._started = False
        #: the payload iteration is in, and its runs (chunks) or groups still to come
        self._payload: Buffer | None = None
        self._runs: Iterator[tuple[int, int, int, int]] = iter(())
        self._groups: Iterator[Directory] = iter(())
        #: what the caller was handed last (released when it asks for the next)
        self._current: ReadChunk | ReadGroup | None = None
        #: "chunks" or "groups", once the caller chose
        self._mode = ""
        #: the application's writers compress their runs (see AsyncClient.read)
        self.compressed = compressed
        self._announce_soon = OncePerTurn(self._announce)
        self._closed = False

    async def _start(self) -> None:
        if self._started:
            return
        self._started = True
        pool = self.session.pool
        assert pool is not None
        self._pool = await pool.create_local_pool(self.session.exclusive, self.session.exclusive, gate=True)
        self._floating.memory = self._pool
        if self.session.lost is not None:  # lost while this waited for memory: nothing would ever arrive
            self._arrived.fail(self.session.lost)
            return
        self.session.add_reader(self.receiver, self)
        r = self.req
        self.session.proto.request_read(
            PartitionRequest(
                self.receiver, self.credit.exclusive, r.app, r.shuffle, r.start, r.end, r.locations, r.token
            ),
            self.target,
        )

    # -- InputChannel

    def local_pool(self) -> LocalPool | None:
        return self._pool

    def deliver(self, payload: Buffer, crc: int) -> None:
        """The CRC checked out; now the groups' structure (§7.6): a malformed payload fails the read."""
        try:
            groups = read_payload(payload.data(), self.req.start, self.req.end, self._attempts)
        except ProtocolError as exc:
            payload.release()
            self.on_stream_error(ProtocolError(f"read stream {self.receiver}: {exc.message}"))
            return
        self._arrived.put(payload, groups)

    def on_end(self) -> None:
        self._arrived.end()
        self.session.reader_done(self.receiver)

    def on_stream_error(self, exc: ShuffledError) -> None:
        self.on_error(exc)
        self.session.proto.cancel_read(self.receiver)

    def announce(self) -> None:
        self._announce_soon()

    def _announce(self) -> None:
        n = self.credit.take_announcement()
        if n and not self.credit.closed and self.session.lost is None:
            self.session.proto.add_credit(self.receiver, n)

    def on_error(self, exc: ShuffledError) -> None:
        self._arrived.fail(exc)
        self.session.reader_done(self.receiver)

    async def next_chunk(self) -> ReadChunk | None:
        """The next run (the previous one is released), or None at the end of the partitions."""
        if self._mode != "chunks":
            await self._begin("chunks")
        if self._current is not None:
            self._current.release()
            self._current = None
        while True:
            run = next(self._runs, None)
            if run is not None:
                assert self._payload is not None
                chunk = self._current = ReadChunk(self._payload, *run, self.compressed)
                return chunk
            groups = self._take_queued()  # a payload at hand needs no coroutine (most do, when reads keep up)
            if groups is None:
                groups = await self._next_payload()
                if groups is None:
                    return None
            self._runs = _runs(groups)

    async def next_group(self) -> ReadGroup | None:
        """The next packed group as received (the previous one is released), or None at the end of the partitions.

        The bulk read: one object per group (a 32 KiB buffer holds one or a few), never one per run. Refused for
        a compressed application, whose runs are LZ4 blocks that decompress a run at a time: iterate chunks."""
        if self.compressed:
            raise ValueError("a compressed read decompresses each run on its own: iterate its chunks, not groups")
        if self._mode != "groups":
            await self._begin("groups")
        if self._current is not None:
            self._current.release()
            self._current = None
        while True:
            d = next(self._groups, None)
            if d is not None:
                assert self._payload is not None
                group = self._current = ReadGroup(self._payload, d)
                return group
            groups = self._take_queued()
            if groups is None:
                groups = await self._next_payload()
                if groups is None:
                    return None
            self._groups = iter(groups)

    async def _begin(self, mode: str) -> None:
        """The first step of an iteration: start the read (if `async with` did not) in this `mode`, the only one
        this reader then takes. Called once, not per chunk: awaiting a coroutine per chunk was 1 % of a reader."""
        if self._mode:
            raise ValueError(f"this reader hands out {self._mode}: one kind of iteration per reader")
        self._mode = mode
        await self._start()

    def _take_queued(self) -> list[Directory] | None:
        """Let go of the payload iteration passed, then the next one's groups if it is queued already."""
        if self._payload is not None:
            self._payload.release()
        self._payload, groups = self._arrived.take()
        return groups

    async def _next_payload(self) -> list[Directory] | None:
        """Let go of the payload iteration passed, then the next one's groups (waiting for it), or None at the end."""
        groups = self._take_queued()
        if groups is None and not await self._arrived.wait():
            error = self._arrived.error
            await self.aclose()
            if error is not None:
                raise error
            return None
        return groups if groups is not None else self._take_queued()

    def __aiter__(self) -> AsyncIterator[ReadChunk]:
        return _steps(self.next_chunk)

    def groups(self) -> AsyncIterator[ReadGroup]:
        """`async for group in reader.groups()`: every packed group, in the order received (see `next_group`)."""
        return _steps(self.next_group)

    async def read_all(self) -> bytes:
        """Convenience for small partitions: every run's bytes, concatenated (a copy per group unless compressed)."""
        if self.compressed:
            return b"".join([bytes(chunk.data) async for chunk in self])
        return b"".join([bytes(group.data) async for group in self.groups()])

    async def __aenter__(self) -> PartitionReader:
        await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop reading: cancel at the daemon if not finished and give every buffer back."""
        if self._closed:
            return
        self._closed = True
        if self._current is not None:
            self._current.release()
            self._current = None
        if self._payload is not None:
            self._payload.release()
            self._payload = None
        self._runs = iter(())
        self._groups = iter(())
        if not self._arrived.over and self._started and self.session.lost is None:
            self.session.proto.cancel_read(self.receiver)
        self.session.reader_done(self.receiver)
        self._arrived.drop()
        self.release_floating()
        if self._pool is not None:
            self._pool.destroy()


async def _steps(step: Callable[[], Awaitable[T | None]]) -> AsyncIterator[T]:
    """What `step` returns, one after the other, until it returns None (a reader's chunks or groups)."""
    while True:
        item = await step()
        if item is None:
            return
        yield item
