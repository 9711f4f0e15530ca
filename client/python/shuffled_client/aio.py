"""asyncio client: push map output into the local daemon and read reduce partitions.

The client speaks the same frames as the daemons and reuses the daemon's codec,
credit state machines and pool: writes are batched into pool segments per
partition (the work per buffer, never per record), pushed under the daemon's push
credit, and committed; reads arrive straight into the client's own pool segments
and each chunk's buffer becomes credit again when the caller is done with it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from shuffled.buffers import Buffer, GlobalPool, LocalPool
from shuffled.net.channel import InputChannel
from shuffled.net.connection import FrameConnection, endpoint_name
from shuffled.net.soon import Soon
from shuffled.net.streams import PushEvent, PushStream
from shuffled.protocol.auth import app_token, secret_bytes
from shuffled.protocol.compression import OVERHEAD, check_codec, compress_in_place, decompress
from shuffled.protocol.connection import ProtocolConnection, Side, release_payload
from shuffled.protocol.credit import DEFAULT_EXCLUSIVE, DEFAULT_FLOATING, ChannelCredit, FloatingPool
from shuffled.protocol.errors import (
    ConnectionLost,
    InvalidRequest,
    MapOutputStateError,
    ShuffledError,
)
from shuffled.protocol.events import (
    Aborted,
    AdminAnswered,
    BufferArrived,
    CloseRequested,
    Committed,
    ConnectionFailed,
    Event,
    HandshakeDone,
    PushCredited,
    StreamFailed,
)
from shuffled.protocol.frames import MAX_REPLICAS, OpenMapOutput, PartitionRequest, Role
from shuffled.server.chunks import Chunk

#: client-side pool: enough for a few concurrent writers and readers
DEFAULT_CLIENT_POOL = 4 << 20


def parse_address(address: str) -> tuple[str, str | tuple[str, int]]:
    """'unix:/path' → ('unix', path); 'host:port' / '[v6]:port' → ('tcp', (host, port))."""
    if address.startswith("unix:"):
        return "unix", address[5:]
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InvalidRequest(f"daemon address {address!r} is neither host:port nor unix:/path")
    return "tcp", (host.strip("[]"), int(port))


class _ClientConnection(FrameConnection):
    def __init__(self, client: AsyncClient) -> None:
        # max_payload is set to the daemon's segment size by HelloAck
        who = f"shuffled at {client.address}"
        super().__init__(ProtocolConnection(Side.DIALER, Role.CLIENT, secret=client._secret, who=who))
        self.client = client

    def on_made(self) -> None:
        self.client._conn = self  # before any frame arrives, so HelloAck can find it
        self.proto.start({"name": "shuffled_client"})

    def handle_event(self, ev: Event) -> None:
        self.client._on_event(ev)

    def fail(self, exc: ShuffledError) -> None:
        self.client._fail_all(exc)  # callers see why (a wrong secret, a broken daemon), not just "lost"
        super().fail(exc)

    def on_lost(self) -> None:
        self.client._on_lost(self.close_reason)

    def on_failed(self) -> None:
        self.client._on_lost(self.close_reason)


class AsyncClient:
    """One connection to the local daemon, shared by any number of writers and readers."""

    def __init__(
        self,
        address: str,
        pool_size: int,
        exclusive: int,
        floating: int,
        secret: str | bytes | None = None,
        app_secret: str | bytes | None = None,
    ) -> None:
        self.address = address
        self._secret = secret_bytes(secret) if secret is not None else None
        self._app_secret = secret_bytes(app_secret) if app_secret is not None else None
        self._tokens: dict[str, str] = {}
        self._pool_size = pool_size
        self.exclusive = exclusive
        self.floating = floating
        self.pool: GlobalPool | None = None
        self.segment_size = 0
        self.daemon_node = ""
        self._conn: _ClientConnection | None = None
        self._ready: asyncio.Future[None] | None = None
        self._writers: dict[int, MapWriter] = {}
        self._readers: dict[int, PartitionReader] = {}
        self._admin: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._lost: ShuffledError | None = None

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        pool_size: int = DEFAULT_CLIENT_POOL,
        exclusive: int = DEFAULT_EXCLUSIVE,
        floating: int = DEFAULT_FLOATING,
        timeout: float = 30.0,
        secret: str | bytes | None = None,
        app_secret: str | bytes | None = None,
    ) -> AsyncClient:
        """Connect to a daemon at 'host:port' or 'unix:/path' and do the handshake.

        `secret` is the cluster's shared secret (the daemon's --secret-file); with it
        the client and the daemon prove to each other that they know it, and a wrong
        one fails here with AuthFailed. `app_secret` proves which applications this
        client may touch: the first writer of an application binds it to its
        secret, and requests about it with another secret fail with AuthFailed.
        """
        client = cls(address, pool_size, exclusive, floating, secret, app_secret)
        kind, where = parse_address(address)
        loop = asyncio.get_running_loop()
        client._ready = loop.create_future()
        try:
            if kind == "unix":
                assert isinstance(where, str)
                coro = loop.create_unix_connection(lambda: _ClientConnection(client), where)
            else:
                assert isinstance(where, tuple)
                coro = loop.create_connection(lambda: _ClientConnection(client), where[0], where[1])
            await asyncio.wait_for(coro, timeout)
            await asyncio.wait_for(client._ready, timeout)
        except (TimeoutError, OSError) as exc:
            raise ConnectionLost(f"cannot connect to shuffled at {address}: {exc or 'timed out'}") from None
        return client

    # -- public API

    async def open_writer(
        self,
        app: str,
        shuffle: int,
        map_index: int,
        attempt: int,
        partitions: int,
        compression: str | None = None,
        replicas: int | None = None,
    ) -> MapWriter:
        """Open one map attempt's output; waits for the daemon's first push credit.

        `compression="lz4"` compresses each buffer (PROTOCOL.md §10.5); every writer and reader of the
        application must then use it. `replicas` (1..4) asks for that many copies of the output, the
        daemon's own included, so it stays readable when a daemon is lost; None leaves it to the daemon's
        `replicas` setting (PROTOCOL.md §7.8).
        """
        check_codec(compression)
        check_replicas(replicas)
        self._check()
        proto = self._proto()
        writer = MapWriter(self, proto.new_stream_id(), partitions, compression)
        self._writers[writer.stream.stream] = writer
        req = OpenMapOutput(
            writer.stream.stream, app, shuffle, map_index, attempt, partitions, self._token(app), replicas
        )
        proto.open_push(req, writer.stream)
        await writer._opened
        return writer

    def read(
        self,
        app: str,
        shuffle: int,
        start: int,
        end: int,
        locations: dict[str, list[int]],
        compression: str | None = None,
    ) -> PartitionReader:
        """Read reduce partitions [start, end) from the named map attempts.

        `locations` maps each daemon address ("" for the local daemon) to the map
        attempt ids whose output it holds. Use as `async with` / `async for`.
        `compression` must match what the application's writers used.
        """
        check_codec(compression)
        self._check()
        req = PartitionRequest(0, 0, app, shuffle, start, end, locations, self._token(app))
        return PartitionReader(self, self._proto().new_stream_id(), req, compressed=compression is not None)

    async def unregister_shuffle(self, app: str, shuffle: int, propagate: bool = True) -> dict[str, Any]:
        return await self._admin_call("unregister_shuffle", {"app": app, "shuffle": shuffle, "propagate": propagate})

    async def remove_application(self, app: str, propagate: bool = True) -> dict[str, Any]:
        return await self._admin_call("remove_application", {"app": app, "propagate": propagate})

    async def flush(self, app: str, shuffle: int | None = None) -> dict[str, Any]:
        """Write the daemon's in-memory data of a shuffle (or of every shuffle of `app`) to its disk.

        Call it when a map stage is complete: the memory is then free for the next
        stage, and the data survives a daemon restart. Needs a daemon with --data-dir.
        """
        args: dict[str, Any] = {"app": app} if shuffle is None else {"app": app, "shuffle": shuffle}
        return await self._admin_call("flush", args)

    async def stats(self) -> dict[str, Any]:
        return await self._admin_call("stats", {})

    @property
    def local_address(self) -> str:
        """This side's address of the connection, as the daemon names it ("ip:port", "unix" over a Unix
        socket): `shuffled drain` checks the daemon sees it connect from here, not some relay."""
        assert self._conn is not None and self._conn.transport is not None
        return endpoint_name(self._conn.transport.get_extra_info("sockname"))

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close("client closed")
            await self._conn.lost

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals

    def _token(self, app: str) -> str | None:
        """The application token requests about `app` carry (None without an app secret)."""
        if self._app_secret is None:
            return None
        token = self._tokens.get(app)
        if token is None:
            token = self._tokens[app] = app_token(self._app_secret, app)
        return token

    def _check(self) -> None:
        if self._lost is not None:
            raise self._lost

    def _proto(self) -> ProtocolConnection:
        assert self._conn is not None
        return self._conn.proto

    def _wake(self, stream: PushStream) -> None:
        assert self._conn is not None
        self._conn.sender.wake(stream)

    async def _admin_call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        return await self._admin_request(op, args)

    def _admin_request(self, op: str, args: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        """Send an admin request now; its answer comes in the future returned (requests go out, and are
        handled by the daemon, in the order they are made)."""
        self._check()
        token = self._token(args["app"]) if "app" in args else None
        if token is not None:
            args = {**args, "token": token}
        sid = self._proto().request_admin(op, args)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._admin[sid] = fut
        return fut

    def _on_event(self, ev: Event) -> None:
        match ev:
            case BufferArrived(frame):
                reader = self._readers.get(frame.receiver)
                if reader is not None:
                    reader.on_buffer(frame)
                else:
                    release_payload(frame)
            case PushCredited(writer):
                w = self._writers.get(writer)
                if w is not None:
                    w._on_credit()
            case Committed(writer, lengths):
                w = self._writers.pop(writer, None)
                if w is not None:
                    w._on_done(lengths)
            case Aborted(writer):
                w = self._writers.pop(writer, None)
                if w is not None:
                    w._on_done(None)
            case AdminAnswered(request, result):
                fut = self._admin.pop(request, None)
                if fut is not None and not fut.done():
                    fut.set_result(result)
            case StreamFailed(stream, exc):
                self._on_error(stream, exc)
            case ConnectionFailed(exc):
                self._fail_all(exc)
                assert self._conn is not None
                self._conn.close(f"daemon reported {exc.code.name}")
            case HandshakeDone(info):
                self._on_ready(info)
            case CloseRequested():
                assert self._conn is not None
                self._conn.close("daemon sent Close")

    def _on_ready(self, info: dict[str, Any]) -> None:
        self.segment_size = int(info.get("segment_size", 32 << 10))
        self.daemon_node = str(info.get("node", ""))
        segments = max(self._pool_size // self.segment_size, 16)
        # Readers' exclusive buffers may use a reserve that writers waiting for memory cannot take:
        # eight readers' worth, but at most a quarter of the pool, so that floating buffers (taken
        # while more than twice the reserve is free) stay possible with large segments too.
        reserve = min(segments // 4, 8 * self.exclusive)
        self.pool = GlobalPool(segments * self.segment_size, self.segment_size, reserve=reserve)
        self._proto().reader.set_max_payload(self.segment_size)
        assert self._ready is not None
        if not self._ready.done():
            self._ready.set_result(None)

    def _on_error(self, stream: int, exc: ShuffledError) -> None:
        if stream in self._writers:
            self._writers.pop(stream)._on_error(exc)
        elif stream in self._readers:
            self._readers[stream]._on_error(exc)
        elif stream in self._admin:
            fut = self._admin.pop(stream)
            if not fut.done():
                fut.set_exception(exc)

    def _fail_all(self, exc: ShuffledError) -> None:
        if self._lost is None:
            self._lost = exc
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(exc)
        for w in list(self._writers.values()):
            w._on_error(exc)
        self._writers.clear()
        for r in list(self._readers.values()):
            r._on_error(exc)
        for fut in self._admin.values():
            if not fut.done():
                fut.set_exception(exc)
        self._admin.clear()

    def _on_lost(self, reason: str) -> None:
        self._fail_all(ConnectionLost(f"connection to shuffled at {self.address} lost: {reason}"))


class MapWriter:
    """Buffers writes per partition into pool segments and pushes full ones under push credit."""

    def __init__(self, client: AsyncClient, stream_id: int, partitions: int, compression: str | None = None) -> None:
        self.client = client
        self.partitions = partitions
        self.compression = compression
        #: bytes written per partition before compression (what `commit()` returns is what the daemon stores)
        self.uncompressed_lengths = [0] * partitions
        self._room = OVERHEAD if compression else 0
        self.stream = PushStream(stream_id)
        self._open: dict[int, Buffer] = {}
        loop = asyncio.get_running_loop()
        self._opened: asyncio.Future[None] = loop.create_future()
        self._done: asyncio.Future[list[int] | None] = loop.create_future()
        self._finished = False
        self.bytes_written = 0

    async def write(self, partition: int, data: bytes | bytearray | memoryview) -> None:
        """Append bytes to a reduce partition (copied into pool segments, pushed when full)."""
        if self._finished:
            raise MapOutputStateError("write after commit or abort")
        if not 0 <= partition < self.partitions:
            raise InvalidRequest(f"partition {partition} outside 0..{self.partitions - 1}")
        self._raise_if_failed()
        view = memoryview(data).cast("B")
        self.bytes_written += len(view)
        self.uncompressed_lengths[partition] += len(view)
        while len(view):
            buf = self._open.get(partition)
            if buf is None:
                buf = await self._take_buffer()
                self._open[partition] = buf
            capacity = len(buf.memory) - self._room
            n = min(capacity - buf.length, len(view))
            buf.memory[buf.length : buf.length + n] = view[:n]
            buf.length += n
            view = view[n:]
            if buf.length == capacity:
                del self._open[partition]
                self._push(Chunk(buf, partition, 0))

    async def _take_buffer(self) -> Buffer:
        pool = self.client.pool
        assert pool is not None
        got = pool.try_take(1)
        if got is None and self._open:
            # Out of client memory: push the fullest partial buffer to make room.
            p = max(self._open, key=lambda k: self._open[k].length)
            self._push(Chunk(self._open.pop(p), p, 0))
        if got is None:
            # Wait for memory, or for the daemon to fail this writer (then stop waiting).
            take = pool.take_later(1)
            waits: set[asyncio.Future[Any]] = {take, self._done}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if self._done.done():
                if take.done() and not take.cancelled():
                    for b in take.result():
                        pool.give(b)
                take.cancel()
                self._raise_if_failed()
                raise MapOutputStateError("map output finished while waiting for memory")
            got = take.result()
        buf = got[0]
        buf.set_recycler(pool.give)
        return buf

    def _push(self, chunk: Chunk) -> None:
        if self.stream.closed:  # the daemon failed this writer: nothing more goes out
            chunk.buffer.release()
            return
        if self.compression:
            buf = chunk.buffer
            buf.length = compress_in_place(buf.memory, buf.length)
        self.stream.push_data(chunk)
        self.client._wake(self.stream)

    async def commit(self) -> list[int]:
        """Push what is buffered and commit; returns bytes per reduce partition as the daemon stored them."""
        self._finish(PushEvent.COMMIT)
        lengths = await self._done
        assert lengths is not None
        return lengths

    async def abort(self) -> None:
        """Drop this map attempt's output; the daemon frees its buffers."""
        if self._finished and self._done.done():
            return
        self._finish(PushEvent.ABORT)
        await self._done

    def _finish(self, event: PushEvent) -> None:
        if self._finished:
            raise MapOutputStateError("map output already committed or aborted")
        self._raise_if_failed()
        self._finished = True
        for p, buf in sorted(self._open.items()):
            self._push(Chunk(buf, p, 0))
        self._open.clear()
        self.stream.push_event(event)
        self.client._wake(self.stream)

    def _raise_if_failed(self) -> None:
        if self._done.done() and self._done.exception() is not None:
            raise self._done.exception()  # type: ignore[misc]

    def _on_credit(self) -> None:
        """Push credit arrived (the protocol connection added it to this writer's stream)."""
        if not self._opened.done():
            self._opened.set_result(None)
        self.client._wake(self.stream)

    def _on_done(self, lengths: list[int] | None) -> None:
        if not self._done.done():
            self._done.set_result(lengths)

    def _on_error(self, exc: ShuffledError) -> None:
        self._finished = True
        self.stream.shutdown()
        for buf in self._open.values():
            buf.release()
        self._open.clear()
        for fut in (self._opened, self._done):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved here; raised to the caller via _raise_if_failed or await


class ReadChunk:
    """One chunk of a reduce partition; `data` is valid until `release()` (or the next iteration)."""

    __slots__ = ("_buffer", "_compressed", "_data", "attempt", "partition")

    def __init__(self, buffer: Buffer, partition: int, attempt: int, compressed: bool = False) -> None:
        self._buffer: Buffer | None = buffer
        self.partition = partition
        self.attempt = attempt
        self._compressed = compressed
        self._data: memoryview | None = None

    @property
    def data(self) -> memoryview:
        """The chunk's bytes (decompressed on first use for a compressed application; the pool buffer,
        and so its credit, is held until `release()` either way, which keeps a reader's memory bounded)."""
        if self._buffer is None:
            raise ValueError("chunk already released")
        if not self._compressed:
            return self._buffer.data()
        if self._data is None:
            self._data = decompress(self._buffer.data())
        return self._data

    def release(self) -> None:
        """Give the buffer back: it becomes credit for the daemon to send the next one."""
        if self._buffer is not None:
            buf, self._buffer = self._buffer, None
            self._data = None
            buf.release()


class PartitionReader(InputChannel):
    """An input gate with one channel (to the local daemon), credit-controlled."""

    def __init__(self, client: AsyncClient, receiver: int, req: PartitionRequest, compressed: bool = False) -> None:
        self._floating = FloatingPool(client.floating)
        super().__init__(receiver, ChannelCredit(client.exclusive, self._floating))
        self.client = client
        self.req = req
        self._pool: LocalPool | None = None
        self._queue: deque[ReadChunk] = deque()
        self._wake = asyncio.Event()
        self._error: ShuffledError | None = None
        self._ended = False
        self._started = False
        self._current: ReadChunk | None = None
        #: the application's writers compress their buffers (see AsyncClient.read)
        self.compressed = compressed
        self._announce_soon = Soon(self._announce)
        self._closed = False

    async def _start(self) -> None:
        if self._started:
            return
        self._started = True
        pool = self.client.pool
        assert pool is not None
        self._pool = await pool.create_local_pool(self.client.exclusive, self.client.exclusive, use_reserve=True)
        self._floating.memory = self._pool
        if self.client._lost is not None:  # lost while this waited for memory: nothing would ever arrive
            self._error = self.client._lost
            return
        self.client._readers[self.receiver] = self
        r = self.req
        self.client._proto().request_read(
            PartitionRequest(
                self.receiver, self.credit.exclusive, r.app, r.shuffle, r.start, r.end, r.locations, r.token
            ),
            self.target,
        )

    # -- InputChannel

    def local_pool(self) -> LocalPool | None:
        return self._pool

    def deliver(self, chunk: Chunk) -> None:
        self._queue.append(ReadChunk(chunk.buffer, chunk.partition, chunk.attempt, self.compressed))
        self._wake.set()

    def on_end(self) -> None:
        self._ended = True
        self.client._readers.pop(self.receiver, None)
        self._wake.set()

    def on_stream_error(self, exc: ShuffledError) -> None:
        self._on_error(exc)
        self.client._proto().cancel_read(self.receiver)

    def announce(self) -> None:
        self._announce_soon()

    def _announce(self) -> None:
        n = self.credit.take_announcement()
        if n and not self.credit.closed and self.client._lost is None:
            self.client._proto().add_credit(self.receiver, n)

    def _on_error(self, exc: ShuffledError) -> None:
        if self._error is None and not self._ended:
            self._error = exc
        self.client._readers.pop(self.receiver, None)
        self._wake.set()

    async def next_chunk(self) -> ReadChunk | None:
        """The next chunk (the previous one is released), or None at the end of the partitions."""
        if not self._started:  # checked here: awaiting a coroutine per chunk was 1 % of a reading client
            await self._start()
        if self._current is not None:
            self._current.release()
            self._current = None
        while not self._queue:
            if self._error is not None:
                await self.aclose()
                raise self._error
            if self._ended:
                await self.aclose()
                return None
            self._wake.clear()
            await self._wake.wait()
        self._current = self._queue.popleft()
        return self._current

    def __aiter__(self) -> AsyncIterator[ReadChunk]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ReadChunk]:
        while True:
            chunk = await self.next_chunk()
            if chunk is None:
                return
            yield chunk

    async def read_all(self) -> bytes:
        """Convenience for small partitions: every chunk's bytes, concatenated."""
        parts = []
        async for chunk in self:
            parts.append(bytes(chunk.data))
        return b"".join(parts)

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
        if not self._ended and self._error is None and self._started and self.client._lost is None:
            self.client._proto().cancel_read(self.receiver)
        self.client._readers.pop(self.receiver, None)
        self._ended = True
        self.release_floating()
        while self._queue:
            self._queue.popleft().release()
        if self._pool is not None:
            self._pool.destroy()


def check_replicas(replicas: int | None) -> None:
    """Refuse here what the daemon would find malformed: a bad `replicas` would close the whole connection."""
    if replicas is not None and (type(replicas) is not int or not 1 <= replicas <= MAX_REPLICAS):
        raise ValueError(f"replicas must be an integer in 1..{MAX_REPLICAS} or None, got {replicas!r}")
