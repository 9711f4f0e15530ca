"""Blocking client for code without an event loop (scripts, PySpark Python workers).

Each call runs the asyncio client on a private event loop until it completes; the
loop does not run between calls, which is fine because flow control is credit
based: the daemon only sends what the reader has room for.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from .aio import DEFAULT_CLIENT_POOL, AsyncClient
from .reader import PartitionReader, ReadChunk, ReadGroup
from .writer import DEFAULT_WRITER_BUFFER, MapWriter

T = TypeVar("T")


class Client:
    def __init__(
        self,
        address: str,
        *,
        pool_size: int = DEFAULT_CLIENT_POOL,
        timeout: float = 30.0,
        secret: str | bytes | None = None,
        app_secret: str | bytes | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """See AsyncClient.connect for `secret`, `app_secret` and `tls`."""
        self._loop = asyncio.new_event_loop()
        try:
            self._aio = self._run(
                AsyncClient.connect(
                    address, pool_size=pool_size, timeout=timeout, secret=secret, app_secret=app_secret, tls=tls
                )
            )
        except BaseException:
            self._loop.close()
            raise

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    def open_writer(
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
    ) -> Writer:
        """See AsyncClient.open_writer for `compression`, `replicas`, `buffer_size` and `durability`."""
        aio = self._aio.open_writer(
            app, shuffle, map_index, attempt, partitions, compression, replicas, buffer_size, durability
        )
        return Writer(self, self._run(aio))

    def read(
        self,
        app: str,
        shuffle: int,
        start: int,
        end: int,
        locations: dict[str, list[int]],
        compression: str | None = None,
    ) -> Reader:
        return Reader(self, self._aio.read(app, shuffle, start, end, locations, compression))

    def unregister_shuffle(self, app: str, shuffle: int, propagate: bool = True) -> dict[str, Any]:
        result: dict[str, Any] = self._run(self._aio.unregister_shuffle(app, shuffle, propagate))
        return result

    def remove_application(self, app: str, propagate: bool = True) -> dict[str, Any]:
        result: dict[str, Any] = self._run(self._aio.remove_application(app, propagate))
        return result

    def flush(self, app: str, shuffle: int | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self._run(self._aio.flush(app, shuffle))
        return result

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._run(self._aio.stats())
        return result

    def pool(self) -> dict[str, Any]:
        result: dict[str, Any] = self._run(self._aio.pool())
        return result

    def drain_challenge(self, nonce: str) -> dict[str, Any]:
        result: dict[str, Any] = self._run(self._aio.drain_challenge(nonce))
        return result

    def drain(self, handoff: bool = True, timeout: int | None = None, proof: str | None = None) -> dict[str, Any]:
        async def ask() -> dict[str, Any]:  # the request is sent inside the client's loop
            answer: dict[str, Any] = await self._aio.drain(handoff, timeout, proof)
            return answer

        result: dict[str, Any] = self._run(ask())
        return result

    def close(self) -> None:
        if not self._loop.is_closed():
            self._run(self._aio.close())
            self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Writer:
    def __init__(self, client: Client, writer: MapWriter) -> None:
        self._client = client
        self._w = writer

    def write(self, partition: int, data: bytes | bytearray | memoryview) -> None:
        """See MapWriter.write; the event loop runs only when the buffer is full."""
        if not self._w.write_nowait(partition, data):
            self._client._run(self._w.write(partition, data))

    def write_sorted(self, lengths: Sequence[int], data: bytes | bytearray | memoryview) -> None:
        """See MapWriter.write_sorted."""
        self._client._run(self._w.write_sorted(lengths, data))

    def commit(self) -> list[int]:
        lengths: list[int] = self._client._run(self._w.commit())
        return lengths

    def abort(self) -> None:
        self._client._run(self._w.abort())


class Reader:
    """Iterate chunks, one per run, or `groups()`, one per packed group; what it hands out is valid until the
    next one is requested."""

    def __init__(self, client: Client, reader: PartitionReader) -> None:
        self._client = client
        self._r = reader

    def __iter__(self) -> Iterator[ReadChunk]:
        return self._steps(self._r.next_chunk)

    def groups(self) -> Iterator[ReadGroup]:
        """See PartitionReader.next_group: the bulk read, one view per packed group."""
        return self._steps(self._r.next_group)

    def _steps(self, step: Callable[[], Awaitable[T | None]]) -> Iterator[T]:
        """What `step` returns, each run on the client's loop, until it returns None."""
        while True:
            item: T | None = self._client._run(step())
            if item is None:
                return
            yield item

    def read_all(self) -> bytes:
        data: bytes = self._client._run(self._r.read_all())
        return data

    def close(self) -> None:
        self._client._run(self._r.aclose())

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
