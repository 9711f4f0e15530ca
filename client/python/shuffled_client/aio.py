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
import ssl
from collections.abc import Container
from typing import Any

from shuffled.buffers import GlobalPool
from shuffled.buffers.shm import MappedRegion
from shuffled.net.connection import FrameConnection, endpoint_name
from shuffled.net.tls import dialer_context
from shuffled.protocol.auth import secret_bytes
from shuffled.protocol.compression import check_codec
from shuffled.protocol.connection import ProtocolConnection, Side
from shuffled.protocol.credit import DEFAULT_EXCLUSIVE, DEFAULT_FLOATING
from shuffled.protocol.errors import (
    ConnectionLost,
    InvalidRequest,
    ShuffledError,
)
from shuffled.protocol.events import (
    CloseRequested,
    ConnectionFailed,
    Event,
    HandshakeDone,
)
from shuffled.protocol.frames import DURABILITIES, FSYNCS, SHM, SHM_READ, OpenMapOutput, PartitionRequest, Role

from .admin import AdminCalls
from .reader import PartitionReader
from .session import Session
from .writer import DEFAULT_WRITER_BUFFER, MapWriter, check_replicas

#: client-side pool: enough for a few concurrent writers and readers
DEFAULT_CLIENT_POOL = 4 << 20


def parse_address(address: str) -> tuple[str, str | tuple[str, int]]:
    """'unix:/path' → ('unix', path); 'host:port' / '[v6]:port' → ('tcp', (host, port)); 'tls:host:port'
    → ('tls', (host, port))."""
    if address.startswith("unix:"):
        return "unix", address[5:]
    kind, rest = ("tls", address[4:]) if address.startswith("tls:") else ("tcp", address)
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InvalidRequest(f"daemon address {address!r} is neither [tls:]host:port nor unix:/path")
    return kind, (host.strip("[]"), int(port))


class _Unmapped(Exception):
    """The daemon offered shared memory this client could not map (another user's region, a full tmpfs)."""


def _map_region(offer: Any, slot_size: int, features: Container[str]) -> MappedRegion:
    """The region a HelloAck's `shm` names, mapped (§6.3): with `shm-read` agreed, its read slots' file too."""
    reads_in_place = SHM_READ in features
    if not _names_file(offer) or (reads_in_place and not _names_file(offer.get("reads"))):
        raise ValueError(f"the daemon's shm offer {offer!r} names no region")
    reads = (offer["reads"]["path"], offer["reads"]["size"]) if reads_in_place else None
    return MappedRegion(offer["path"], offer["size"], slot_size, reads)


def _names_file(offer: Any) -> bool:
    return isinstance(offer, dict) and isinstance(offer.get("path"), str) and isinstance(offer.get("size"), int)


def _client_pool(size: int, segment_size: int, exclusive: int) -> GlobalPool:
    segments = max(size // segment_size, 16)
    # Readers' exclusive buffers may use a reserve that writers waiting for memory cannot take:
    # eight readers' worth, but at most a quarter of the pool, so that floating buffers (taken
    # while more than twice the reserve is free) stay possible with large segments too. The
    # application's own reads are not held to the reserve (the daemon's are: see GlobalPool).
    reserve = min(segments // 4, 8 * exclusive)
    return GlobalPool(segments * segment_size, segment_size, reserve, reads_in_reserve=False)


async def _dial(
    client: AsyncClient, kind: str, where: str | tuple[str, int], tls: ssl.SSLContext | None, timeout: float
) -> None:
    """Connect `client` and do the handshake (its `_ready` says the daemon took it)."""
    loop = asyncio.get_running_loop()
    client._ready = loop.create_future()
    try:
        if kind == "unix":
            assert isinstance(where, str)
            coro = loop.create_unix_connection(lambda: _ClientConnection(client), where)
        else:
            assert isinstance(where, tuple)
            context = (tls or dialer_context()) if kind == "tls" else None
            coro = loop.create_connection(lambda: _ClientConnection(client), where[0], where[1], ssl=context)
        await asyncio.wait_for(coro, timeout)
        await asyncio.wait_for(client._ready, timeout)
    except (TimeoutError, OSError) as exc:  # ssl.SSLError (a certificate refused) is an OSError
        raise ConnectionLost(f"cannot connect to shuffled at {client.address}: {exc or 'timed out'}") from None


class _ClientConnection(FrameConnection):
    def __init__(self, client: AsyncClient) -> None:
        # max_payload is set to the daemon's segment size by HelloAck
        who = f"shuffled at {client.address}"
        super().__init__(ProtocolConnection(Side.DIALER, Role.CLIENT, secret=client._secret, who=who))
        self.client = client

    def on_made(self) -> None:
        self.client._conn = self.client.session.conn = self  # before any frame arrives, so HelloAck finds it
        self.proto.start({"name": "shuffled_client", **({"features": [SHM, SHM_READ]} if self.client._shm else {})})

    def handle_event(self, ev: Event) -> None:
        if not self.client.session.on_event(ev):  # about a stream (nearly every event), else the connection
            self.client._on_event(ev)

    def fail(self, exc: ShuffledError) -> None:
        self.client._fail_all(exc)  # callers see why (a wrong secret, a broken daemon), not just "lost"
        super().fail(exc)

    def on_lost(self) -> None:
        self.client._on_lost(self.close_reason)

    def on_failed(self) -> None:
        self.client._on_lost(self.close_reason)


class AsyncClient(AdminCalls):
    """One connection to the local daemon, shared by any number of writers and readers."""

    def __init__(
        self,
        address: str,
        pool_size: int,
        exclusive: int,
        floating: int,
        secret: str | bytes | None = None,
        app_secret: str | bytes | None = None,
        shared_memory: bool = False,
    ) -> None:
        self.address = address
        #: ask the daemon for shared memory (§6.3)
        self._shm = shared_memory
        self._secret = secret_bytes(secret) if secret is not None else None
        self._pool_size = pool_size
        #: the connection's streams, pool and credit settings, as the writers and readers share them
        self.session = Session(
            address, exclusive, floating, secret_bytes(app_secret) if app_secret is not None else None
        )
        self.segment_size = 0
        self.daemon_node = ""
        self._conn: _ClientConnection | None = None
        self._ready: asyncio.Future[None] | None = None

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
        tls: ssl.SSLContext | None = None,
        shared_memory: bool = True,
    ) -> AsyncClient:
        """Connect to a daemon at 'host:port', 'tls:host:port' or 'unix:/path' and do the handshake.

        `secret` is the cluster's shared secret (the daemon's --secret-file); with it
        the client and the daemon prove to each other that they know it, and a wrong
        one fails here with AuthFailed. `app_secret` proves which applications this
        client may touch: the first writer of an application binds it to its
        secret, and requests about it with another secret fail with AuthFailed.

        A 'tls:' address reaches the daemon's client TLS port: `tls` is the context that checks the
        daemon's certificate (`shuffled_client.tls_context(ca, cert, key)`; None: the system's CAs).

        Over a 'unix:' address the client pushes through shared memory with the daemon when the daemon
        offers it (`shared_memory=False`: through the socket); a region it cannot map is not an error,
        the client connects again without it.
        """
        kind, where = parse_address(address)
        if tls is not None and kind != "tls":
            raise InvalidRequest(f"a TLS context needs a tls:host:port address, got {address!r}")
        client = cls(address, pool_size, exclusive, floating, secret, app_secret, shared_memory and kind == "unix")
        try:
            await _dial(client, kind, where, tls, timeout)
        except _Unmapped:  # the socket will do
            await client.close()
            client = cls(address, pool_size, exclusive, floating, secret, app_secret)
            await _dial(client, kind, where, tls, timeout)
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
        fsync: str | None = None,
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
        `fsync="commit"`: `commit` returns once the output is on the daemons' disks (docs/durability.md).
        """
        check_codec(compression)
        check_replicas(replicas)
        if durability is not None and durability not in DURABILITIES:
            raise ValueError(f"durability must be one of {', '.join(DURABILITIES)} or None, got {durability!r}")
        if fsync is not None and fsync not in FSYNCS:
            raise ValueError(f"fsync must be one of {', '.join(FSYNCS)} or None, got {fsync!r}")
        if buffer_size < 0:
            raise ValueError(f"buffer_size must be at least 0, got {buffer_size}")
        self.session.check()
        proto = self.session.proto
        writer = MapWriter(self.session, proto.streams.new_id(), attempt, partitions, compression, buffer_size)
        self.session.add_writer(writer.stream.stream, writer)
        req = OpenMapOutput(
            writer.stream.stream,
            app,
            shuffle,
            map_index,
            attempt,
            partitions,
            self.session.token(app),
            replicas,
            durability=durability,
            fsync=fsync,
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
        self.session.check()
        req = PartitionRequest(0, 0, app, shuffle, start, end, locations, self.session.token(app))
        return PartitionReader(
            self.session, self.session.proto.streams.new_id(), req, compressed=compression is not None
        )

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

    def _on_event(self, ev: Event) -> None:
        """An event about the connection (the session takes those about its streams)."""
        match ev:
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
        self.session.pool = _client_pool(self._pool_size, self.segment_size, self.session.exclusive)
        self.session.proto.reader.set_max_payload(self.segment_size)
        assert self._ready is not None
        if SHM in self.session.proto.features:
            try:
                self.session.use_region(_map_region(info.get("shm"), self.segment_size, self.session.proto.features))
            except (OSError, ValueError) as exc:
                self._ready.set_exception(_Unmapped(str(exc)))
                return
        if not self._ready.done():
            self._ready.set_result(None)

    def _fail_all(self, exc: ShuffledError) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(exc)
        self.session.fail_all(exc)

    def _on_lost(self, reason: str) -> None:
        self._fail_all(ConnectionLost(f"connection to shuffled at {self.address} lost: {reason}"))
