"""asyncio client: push map output into the local daemon and read reduce partitions.

The client speaks the same frames as the daemons and reuses the daemon's codec,
credit state machines and pool. A writer collects the writes for all partitions in
one bounded buffer; when it is full (and at commit) the bytes go out ordered by
partition, packed into full pool segments (many partitions per segment, PROTOCOL.md
§3.3: the work is per segment, never per record), pushed under the daemon's push
credit, and committed. Reads arrive straight into the client's own pool segments;
each run of a partition is one chunk, and a segment becomes credit again when
iteration has passed its last run.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from itertools import chain, repeat
from operator import add
from typing import Any, TypeVar

from shuffled.buffers import Buffer, GlobalPool, LocalPool
from shuffled.net.channel import InputChannel
from shuffled.net.connection import FrameConnection, endpoint_name
from shuffled.net.once_per_turn import OncePerTurn
from shuffled.net.streams import Payload, PushEvent, PushStream
from shuffled.protocol.auth import app_token, secret_bytes
from shuffled.protocol.compression import check_codec, compress_block, decompress_run
from shuffled.protocol.connection import ProtocolConnection, Side, release_payload
from shuffled.protocol.credit import DEFAULT_EXCLUSIVE, DEFAULT_FLOATING, ChannelCredit, FloatingPool
from shuffled.protocol.errors import (
    ConnectionLost,
    InvalidRequest,
    MapOutputStateError,
    ProtocolError,
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
from shuffled.protocol.frames import DURABILITIES, MAX_REPLICAS, OpenMapOutput, PartitionRequest, Role
from shuffled.protocol.packed import Directory, RunPacker, read_payload

#: client-side pool: enough for a few concurrent writers and readers
DEFAULT_CLIENT_POOL = 4 << 20
#: bytes a writer collects before it orders them by partition and pushes them
DEFAULT_WRITER_BUFFER = 8 << 20

T = TypeVar("T")


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
        buffer_size: int = DEFAULT_WRITER_BUFFER,
        durability: str | None = None,
    ) -> MapWriter:
        """Open one map attempt's output; waits for the daemon's first push credit.

        `compression="lz4"` compresses each run (PROTOCOL.md §10.5); every writer and reader of the
        application must then use it. `replicas` (1..4) asks for that many copies of the output, the
        daemon's own included, so it stays readable when a daemon is lost; None leaves it to the daemon's
        `replicas` setting (PROTOCOL.md §7.8). `buffer_size` bounds the bytes `write` collects before they
        go out ordered by partition: the larger, the fewer times a partition's data is cut (each flush
        pushes every partition it holds once). `durability="object-store"` asks the daemon to upload the
        committed output to its object store, so any daemon can serve it once this one's host is lost
        (`"none"`: not even when the daemon's `durability` setting says so; None: as it says; §12.5).
        """
        check_codec(compression)
        check_replicas(replicas)
        if durability is not None and durability not in DURABILITIES:
            raise ValueError(f"durability must be one of {', '.join(DURABILITIES)} or None, got {durability!r}")
        if buffer_size < 0:
            raise ValueError(f"buffer_size must be at least 0, got {buffer_size}")
        self._check()
        proto = self._proto()
        writer = MapWriter(self, proto.new_stream_id(), attempt, partitions, compression, buffer_size)
        self._writers[writer.stream.stream] = writer
        req = OpenMapOutput(
            writer.stream.stream,
            app,
            shuffle,
            map_index,
            attempt,
            partitions,
            self._token(app),
            replicas,
            durability=durability,
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

    async def drain_challenge(self, nonce: str) -> dict[str, Any]:
        """The daemon's proof that it has the peer secret, over `nonce` (fresh, `protocol.auth.new_nonce()`),
        naming itself and the address it sees this client at (PROTOCOL.md §13): check it before `drain`,
        whose proof is made over the daemon's nonce in the answer."""
        return await self._admin_call("drain_challenge", {"nonce": nonce})

    def drain(
        self, handoff: bool = True, timeout: int | None = None, proof: str | None = None, wait: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        """Ask the daemon to stop after its drain (PROTOCOL.md §13); sent at once, so requests made after it
        are handled after it. Its answer: the drain's state, or with `wait` how the drain ended, once it has
        (`stats()["drain"]` follows it meanwhile). `handoff` copies committed data to other daemons first;
        `timeout` (whole seconds) replaces the daemon's drain-timeout. With authentication on, the daemon
        wants `proof`: `protocol.auth.drain_proof` over the nonces of the `drain_challenge` just answered on
        this connection and these arguments.
        """
        args: dict[str, Any] = {"handoff": handoff}
        if timeout is not None:
            args["timeout"] = timeout
        if proof is not None:
            args["proof"] = proof
        if wait:
            args["wait"] = True
        return self._admin_request("drain", args)

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
        # while more than twice the reserve is free) stay possible with large segments too. The
        # application's own reads are not held to the reserve (the daemon's are: see GlobalPool).
        reserve = min(segments // 4, 8 * self.exclusive)
        self.pool = GlobalPool(segments * self.segment_size, self.segment_size, reserve, reads_in_reserve=False)
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
    """One map attempt's output: writes collected in one bounded buffer, pushed ordered by partition.

    The buffer holds each partition's bytes appended in write order (one growing bytearray per partition
    written since the last flush, so a write is a dict lookup and one copy, whatever the partition count);
    a flush joins them in partition order and packs the result into full segments (`RunPacker`), so every
    flush is one ascending sequence of packed groups and a partition's writes keep their order.
    """

    def __init__(
        self,
        client: AsyncClient,
        stream_id: int,
        attempt: int,
        partitions: int,
        compression: str | None = None,
        buffer_size: int = DEFAULT_WRITER_BUFFER,
    ) -> None:
        self.client = client
        self.attempt = attempt
        self.partitions = partitions
        self.compression = compression
        self.buffer_size = buffer_size
        #: bytes written per partition before compression (what `commit()` returns is what the daemon stores)
        self.uncompressed_lengths = [0] * partitions
        self.stream = PushStream(stream_id)
        self._held: dict[int, bytearray] = {}
        self._held_bytes = 0
        loop = asyncio.get_running_loop()
        self._opened: asyncio.Future[None] = loop.create_future()
        self._done: asyncio.Future[list[int] | None] = loop.create_future()
        self._finished = False
        self.bytes_written = 0

    def write_nowait(self, partition: int, data: bytes | bytearray | memoryview) -> bool:
        """`write` when the buffer has room (a copy of `data` goes in it); False, having done nothing, when the
        buffer must be flushed first: then call `write`."""
        if type(data) is not bytes or self._finished or not 0 <= partition < self.partitions:
            data = self._accept(partition, data)  # what is wrong, or any other buffer as a view of bytes
        n = len(data)
        if self._held_bytes + n > self.buffer_size:
            return False
        held = self._held.get(partition)
        if held is None:
            self._held[partition] = bytearray(data)
        else:
            held += data
        self._held_bytes += n
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
        if not self._held:
            return
        order = sorted(self._held)
        held = list(map(self._held.__getitem__, order))
        lengths = list(map(len, held))
        data = b"".join(held)
        del held
        self._held = {}
        self._held_bytes = 0
        await self._push_packed(RunPacker(order, lengths, data, ascending=True))

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
            self.stream.push_data(Payload(buf))
            self.client._wake(self.stream)

    async def _take_buffer(self) -> Buffer:
        pool = self.client.pool
        assert pool is not None
        got = pool.try_take(1)
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

    async def commit(self) -> list[int]:
        """Push what is buffered and commit; returns bytes per reduce partition as the daemon stored them."""
        self._finish()
        await self._flush()
        self._send(PushEvent.COMMIT)
        lengths = await self._done
        assert lengths is not None
        return lengths

    async def abort(self) -> None:
        """Drop this map attempt's output; the daemon frees its buffers."""
        if self._finished and self._done.done():
            return
        self._finish()
        self._held.clear()
        self._send(PushEvent.ABORT)
        await self._done

    def _finish(self) -> None:
        if self._finished:
            raise MapOutputStateError("map output already committed or aborted")
        self._raise_if_failed()
        self._finished = True

    def _send(self, event: PushEvent) -> None:
        self._raise_if_failed()
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
        self._held.clear()
        for fut in (self._opened, self._done):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved here; raised to the caller via _raise_if_failed or await


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
        """The run's bytes (decompressed on first use for a compressed application; the pool buffer, and so
        its credit, is held until iteration passes its last run either way, which bounds a reader's memory)."""
        if self._buffer is None:
            raise ValueError("chunk already released")
        if self._data is None:
            run = self._buffer.memory[self._start : self._end]
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
    least 1). The tuples are the directory as parsed when the buffer was checked and `data` is a slice of the
    received buffer, so a group costs one object whatever its run count: the view for consumers that handle
    bytes in bulk (count, checksum, hand to numpy) rather than a run at a time. A pair (partition, attempt)
    may continue in the next group, as its runs do. Valid until `release()` or the next iteration; the
    buffer is shared with the other groups of its BufferResponse."""

    __slots__ = ("_buffer", "_end", "_start", "attempt", "lengths", "partitions")

    def __init__(self, buffer: Buffer, d: Directory) -> None:
        buffer.retain()
        self._buffer: Buffer | None = buffer
        self.attempt = d.attempt
        self.partitions = d.partitions
        self.lengths = d.lengths
        self._start = d.data
        self._end = d.end

    @property
    def data(self) -> memoryview:
        """The runs' bytes back to back: run k is the `lengths[k]` bytes after the first k runs'."""
        if self._buffer is None:
            raise ValueError("group already released")
        return self._buffer.memory[self._start : self._end]

    def release(self) -> None:
        """Let go of the group; its buffer becomes credit again once every group of it is let go and passed."""
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


class PartitionReader(InputChannel):
    """An input gate with one channel (to the local daemon), credit-controlled.

    Iterate it for one chunk per run, or `groups()` for one view per packed group (the bulk read); one or the
    other per reader."""

    def __init__(self, client: AsyncClient, receiver: int, req: PartitionRequest, compressed: bool = False) -> None:
        self._floating = FloatingPool(client.floating)
        super().__init__(receiver, ChannelCredit(client.exclusive, self._floating))
        self.client = client
        self.req = req
        #: the attempts the request names: a group of any other is malformed (§7.6)
        self._attempts = frozenset(chain.from_iterable(req.locations.values()))
        self._pool: LocalPool | None = None
        self._queue: deque[tuple[Buffer, list[Directory]]] = deque()
        self._wake = asyncio.Event()
        self._error: ShuffledError | None = None
        self._ended = False
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
        pool = self.client.pool
        assert pool is not None
        self._pool = await pool.create_local_pool(self.client.exclusive, self.client.exclusive, gate=True)
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

    def deliver(self, payload: Buffer, crc: int) -> None:
        """The CRC checked out; now the groups' structure (§7.6): a malformed payload fails the read."""
        try:
            groups = read_payload(payload.data(), self.req.start, self.req.end, self._attempts)
        except ProtocolError as exc:
            payload.release()
            self.on_stream_error(ProtocolError(f"read stream {self.receiver}: {exc.message}"))
            return
        self._queue.append((payload, groups))
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
            self._payload = None
        if not self._queue:
            return None
        self._payload, groups = self._queue.popleft()
        return groups

    async def _next_payload(self) -> list[Directory] | None:
        """Let go of the payload iteration passed, then the next one's groups (waiting for it), or None at the end."""
        if self._payload is not None:
            self._payload.release()
            self._payload = None
        while not self._queue:
            if self._error is not None:
                await self.aclose()
                raise self._error
            if self._ended:
                await self.aclose()
                return None
            self._wake.clear()
            await self._wake.wait()
        self._payload, groups = self._queue.popleft()
        return groups

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
        if not self._ended and self._error is None and self._started and self.client._lost is None:
            self.client._proto().cancel_read(self.receiver)
        self.client._readers.pop(self.receiver, None)
        self._ended = True
        self.release_floating()
        while self._queue:
            self._queue.popleft()[0].release()
        if self._pool is not None:
            self._pool.destroy()


async def _steps(step: Callable[[], Awaitable[T | None]]) -> AsyncIterator[T]:
    """What `step` returns, one after the other, until it returns None (a reader's chunks or groups)."""
    while True:
        item = await step()
        if item is None:
            return
        yield item


def check_replicas(replicas: int | None) -> None:
    """Refuse here what the daemon would find malformed: a bad `replicas` would close the whole connection."""
    if replicas is not None and (type(replicas) is not int or not 1 <= replicas <= MAX_REPLICAS):
        raise ValueError(f"replicas must be an integer in 1..{MAX_REPLICAS} or None, got {replicas!r}")
