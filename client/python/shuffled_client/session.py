"""What the writers and readers of one client connection share: the connection, the client's pool and credit
settings, and the streams open on it with what the daemon's answers mean for them.

The session registers every writer, reader and admin request, and only it removes them: a stream tells it
when it is done (`reader_done`), and the daemon's events reach each stream through it. When the connection
is lost or fails, every stream open on it fails with the reason (`fail_all`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from shuffled.buffers import Buffer, GlobalPool
from shuffled.buffers.shm import MappedRegion
from shuffled.net.connection import FrameConnection
from shuffled.net.streams import PushStream
from shuffled.protocol.auth import app_token
from shuffled.protocol.connection import ProtocolConnection, release_payload
from shuffled.protocol.errors import ShuffledError
from shuffled.protocol.events import (
    Aborted,
    AdminAnswered,
    BufferArrived,
    BuffersPlaced,
    Committed,
    Event,
    PushCredited,
    StreamFailed,
)
from shuffled.protocol.frames import SHM_READ, BufferResponse

from .in_place import ReadsInPlace


class Writing(Protocol):
    """A map output being pushed, as the session reports to it (a `MapWriter`)."""

    def on_credit(self) -> None: ...

    def on_done(self, lengths: list[int] | None) -> None: ...

    def on_error(self, exc: ShuffledError) -> None: ...


class Reading(Protocol):
    """A read, as the session reports to it (a `PartitionReader`)."""

    def on_buffer(self, frame: BufferResponse) -> None: ...

    def on_placed(
        self, sequence: int, backlog: int, crc: int, slot: memoryview, give_back: Callable[[], None]
    ) -> None: ...

    def on_error(self, exc: ShuffledError) -> None: ...


class Session:
    def __init__(self, address: str, exclusive: int, floating: int, app_secret: bytes | None = None) -> None:
        self.address = address
        self._app_secret = app_secret
        self._tokens: dict[str, str] = {}
        #: a read's exclusive buffers and its most floating ones
        self.exclusive = exclusive
        self.floating = floating
        #: the client's pool, made once the daemon said its segment size
        self.pool: GlobalPool | None = None
        self.conn: FrameConnection | None = None
        #: the connection's region of shared memory, where pushes place their data (None: through the socket)
        self.region: MappedRegion | None = None
        #: reads whose buffers the daemon puts in the region (None: they come through the socket)
        self.in_place: ReadsInPlace | None = None
        #: why the connection is gone (every request then fails with it)
        self.lost: ShuffledError | None = None
        self._writers: dict[int, Writing] = {}
        self._readers: dict[int, Reading] = {}
        self._admin: dict[int, asyncio.Future[dict[str, Any]]] = {}

    @property
    def proto(self) -> ProtocolConnection:
        assert self.conn is not None
        return self.conn.proto

    def wake(self, stream: PushStream) -> None:
        assert self.conn is not None
        self.conn.sender.wake(stream)

    async def segment(self, until: asyncio.Future[Any]) -> Buffer | None:
        """A segment of the client's pool for a writer (it goes back to the pool when released), waiting for
        one while memory is short; None if `until` (the writer's end) comes first."""
        pool = self.pool
        assert pool is not None
        got = pool.try_take(1)
        if got is None:
            take = pool.take_later(1)
            await asyncio.wait({take, until}, return_when=asyncio.FIRST_COMPLETED)
            if until.done():
                if take.done() and not take.cancelled():
                    for b in take.result():
                        pool.give(b)
                take.cancel()
                return None
            got = take.result()
        buf = got[0]
        buf.set_recycler(pool.give)
        return buf

    def use_region(self, region: MappedRegion) -> None:
        """The connection's region is mapped: pushes place their groups there, and with `shm-read` the daemon
        puts the reads' buffers there too (§6.3)."""
        self.region = region
        if SHM_READ in self.proto.features:
            self.in_place = ReadsInPlace(region, self.proto)

    def check(self) -> None:
        if self.lost is not None:
            raise self.lost

    def add_writer(self, sid: int, writer: Writing) -> None:
        self._writers[sid] = writer

    def add_reader(self, rid: int, reader: Reading) -> None:
        self._readers[rid] = reader

    def reader_done(self, rid: int) -> None:
        self._readers.pop(rid, None)

    def token(self, app: str) -> str | None:
        """The application token requests about `app` carry (None without an app secret)."""
        if self._app_secret is None:
            return None
        token = self._tokens.get(app)
        if token is None:
            token = self._tokens[app] = app_token(self._app_secret, app)
        return token

    def admin_request(self, op: str, args: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        """Send an admin request now (with the application's token when it names one); its answer comes in
        the future returned (requests go out, and are handled by the daemon, in the order they are made)."""
        self.check()
        token = self.token(args["app"]) if "app" in args else None
        sid = self.proto.request_admin(op, {**args, "token": token} if token is not None else args)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._admin[sid] = fut
        return fut

    def on_event(self, ev: Event) -> bool:
        """Hand an event about one of the streams to it; False for an event about the connection."""
        match ev:
            case BufferArrived(frame):
                reader = self._readers.get(frame.receiver)
                if reader is not None:
                    reader.on_buffer(frame)
                else:
                    release_payload(frame)
            case BuffersPlaced(frame):
                assert self.in_place is not None  # the feature is agreed only with a region
                self.in_place.arrived(frame, self._readers.get)
            case PushCredited(writer):
                if (w := self._writers.get(writer)) is not None:
                    w.on_credit()
            case Committed(writer, lengths):
                if (w := self._writers.pop(writer, None)) is not None:
                    w.on_done(lengths)
            case Aborted(writer):
                if (w := self._writers.pop(writer, None)) is not None:
                    w.on_done(None)
            case AdminAnswered(request, result):
                fut = self._admin.pop(request, None)
                if fut is not None and not fut.done():
                    fut.set_result(result)
            case StreamFailed(stream, exc):
                self._failed(stream, exc)
            case _:
                return False
        return True

    def _failed(self, stream: int, exc: ShuffledError) -> None:
        if stream in self._writers:
            self._writers.pop(stream).on_error(exc)
        elif stream in self._readers:
            self._readers[stream].on_error(exc)
        elif stream in self._admin:
            fut = self._admin.pop(stream)
            if not fut.done():
                fut.set_exception(exc)

    def fail_all(self, exc: ShuffledError) -> None:
        """The connection is gone or failed: every stream on it fails with `exc`, and so does what comes."""
        if self.lost is None:
            self.lost = exc
        writers, self._writers = list(self._writers.values()), {}
        for w in writers:
            w.on_error(exc)
        for r in list(self._readers.values()):
            r.on_error(exc)
        admin, self._admin = list(self._admin.values()), {}
        for fut in admin:
            if not fut.done():
                fut.set_exception(exc)
