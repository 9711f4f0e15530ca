"""Large objects in an S3-compatible store, in the daemon's terms: the layer the object-store tier builds on.

`ObjectStore` writes one object from a sequence of memoryviews (pool segments: the client takes them
without copying), reads a byte range of one into caller-provided memory, deletes one object or every
object under a prefix, lists objects with their ages for the sweep that removes what a crashed daemon
left, and probes at start that the bucket can be written, read back and cleaned. Every call is bounded
in time and raises `StorageError` with a reason an operator can act on (wrong credentials, no such
bucket, access denied, unreachable endpoint, server errors, timeouts); secrets appear nowhere.

The client is obstore (the Rust `object_store` crate): it signs, retries and moves the bytes on threads
of its own without the GIL, so uploads and reads cost the event loop little (measured against aiobotocore:
docs/performance.md, "Object store client").

Writes are atomic: an object bigger than `part_size` goes up as a multipart upload whose parts are
`part_size` bytes (at least S3's 5 MiB, the last one aside), and the object exists only once the upload
completed, which is when `write` returns. When a part or the completion fails, the client aborts the
upload before raising, so no parts stay behind. A cancelled client call would drop the upload without
aborting it, so a write is never cancelled: when its deadline passes (or its caller is cancelled), the
caller gets the error at once and the upload is left to finish or fail by the client's own bounds, and
its key is deleted then (`close` waits for those). A write that fails deletes its key before raising, as
a PUT whose answer was lost may have stored the object. Keys are therefore written once (a failed write
of a key takes an older object of that key with it). What an abort cannot reach
(the server down, the daemon killed) stays as an incomplete upload, which obstore cannot list: the
bucket needs a lifecycle rule that aborts incomplete uploads (docs/operations.md).

Its settings are an `ObjectStoreConfig` (object_config.py); how its requests went, counted, timed and
explained, `Requests`' (object_requests.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import obstore
from obstore.store import S3Store

from ...logs import event
from ...ops.stats import ObjectStoreStats
from ...protocol.errors import StorageError
from . import credentials
from .object_config import ObjectStoreConfig
from .object_requests import Requests

log = logging.getLogger(__name__)


#: what a listing or bulk delete asks for per page (S3's most)
PAGE = 1000
#: the operations counted and timed (bounded metric labels)
OPERATIONS = ("put", "get", "delete", "list")
#: the probe's object, under the prefix; random so daemons sharing a prefix do not race
PROBE_DIR = ".probe"


class ObjectNotFound(StorageError):
    """The object asked for does not exist (deleted, or never written)."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    #: seconds since the store last modified it (by the store's clock against this host's)
    age: float


class ObjectStore:
    """One bucket and prefix; keys are relative to the prefix."""

    def __init__(
        self,
        config: ObjectStoreConfig,
        stats: ObjectStoreStats | None = None,
        observe: Callable[[str, float], None] | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        self.stats = stats if stats is not None else ObjectStoreStats()
        self.stats.url = config.url
        self.requests = Requests(config, self.stats, observe)
        #: objects this process wrote and has not deleted: key -> size
        self._held: dict[str, int] = {}
        #: uploads whose caller gave up on them (deadline, cancellation), still finishing in the client
        self._orphans: set[asyncio.Future[Any]] = set()
        self._store: S3Store | None = None
        #: why no client could be made (no credentials); every call then fails with it
        self._unusable: str | None = None
        try:
            creds = credentials.find(environ)
        except credentials.NoCredentials as exc:
            self._unusable = str(exc)
            self.credential_source = "none"
            return
        self.credential_source = creds.source if creds is not None else "client (web identity or container)"
        self.requests.secrets = creds.secrets() if creds is not None else ()
        self._store = s3_client(config, creds)

    def __repr__(self) -> str:
        return f"ObjectStore({self.config.url}, endpoint={self.config.endpoint}, credentials={self.credential_source})"

    @property
    def client(self) -> S3Store:
        """The obstore client as this layer configured it: for measuring the layer against the client alone."""
        return self._client_or_raise("get", "")

    # -- the operations

    async def write(self, key: str, chunks: Sequence[memoryview | bytes], *, single: bool = False) -> int:
        """Store `chunks`, in order, as object `key`; returns its size once the object is complete.

        The chunks are read by the client's threads without a copy until this returns (and, after a
        deadline, until the abandoned upload ends): the caller must not change them before. `single`: one
        PUT whatever the size (an object a little over one part would otherwise cost two PUTs).
        """
        cfg = self.config
        size = sum(len(c) for c in chunks)
        parts = 1 if single else max(1, math.ceil(size / cfg.part_size))
        multipart = parts > 1
        deadline = cfg.request_bound() * (math.ceil(parts / cfg.concurrency) + (2 if multipart else 0))
        store = self._client_or_raise("put", key)
        started = time.monotonic()
        upload: asyncio.Future[Any] = asyncio.ensure_future(
            obstore.put_async(
                store,
                key,
                list(chunks),
                use_multipart=multipart,
                chunk_size=cfg.part_size,
                max_concurrency=cfg.concurrency,
            )
        )
        try:
            await asyncio.wait_for(asyncio.shield(upload), deadline)
        except (TimeoutError, asyncio.CancelledError) as exc:
            self._abandon(key, upload)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise self.requests.failed("put", key, started, f"did not complete within {deadline:.0f}s") from None
        except Exception as exc:
            reason = self.requests.reason(exc)
            await self._discard(key)  # a PUT whose answer was lost may have stored the object all the same
            raise self.requests.failed("put", key, started, reason) from None
        self.requests.done("put", started)
        stats = self.stats
        stats.bytes_up += size
        stats.parts += parts if multipart else 0
        if key not in self._held:
            stats.objects_held += 1
        stats.bytes_held += size - self._held.get(key, 0)
        self._held[key] = size
        return size

    async def read_into(self, key: str, start: int, targets: Sequence[memoryview]) -> int:
        """Fill `targets`, in order, with the object's bytes from `start` on: one ranged GET for the whole
        range, copied once into the targets (the client hands back memory of its own)."""
        length = sum(len(t) for t in targets)
        if length == 0:
            return 0
        store = self._client_or_raise("get", key)
        started = time.monotonic()
        try:
            data = await asyncio.wait_for(
                obstore.get_range_async(store, key, start=start, length=length), self.config.request_bound()
            )
        except TimeoutError:
            raise self.requests.failed(
                "get", key, started, f"no answer within {self.config.request_bound():.0f}s"
            ) from None
        except Exception as exc:
            if self.requests.missing(exc):
                self.requests.failed("get", key, started, "no such object")
                raise ObjectNotFound(f"object store get {self.config.url}/{key}: no such object") from None
            raise self.requests.failed("get", key, started, self.requests.reason(exc)) from None
        view = memoryview(data)
        if len(view) != length:
            got = len(view)
            raise self.requests.failed(
                "get", key, started, f"asked for {length} bytes at {start}, the object had {got}"
            )
        offset = 0
        for target in targets:
            target[:] = view[offset : offset + len(target)]
            offset += len(target)
        self.requests.done("get", started)
        self.stats.bytes_down += length
        return length

    async def delete(self, keys: str | Sequence[str]) -> None:
        """Delete these objects (missing ones are no error: deleting is idempotent)."""
        batch = [keys] if isinstance(keys, str) else list(keys)
        for i in range(0, len(batch), PAGE):
            page = batch[i : i + PAGE]
            store = self._client_or_raise("delete", page[0])
            started = time.monotonic()
            try:
                await self._bounded(obstore.delete_async(store, page if len(page) > 1 else page[0]))
            except Exception as exc:
                if not self.requests.missing(exc):
                    raise self.requests.failed("delete", page[0], started, self.requests.reason(exc)) from None
            self.requests.done("delete", started)
            for key in page:
                self._forget(key)

    async def list_objects(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under `prefix` (relative to the store's), with its size and age."""
        store = self._client_or_raise("list", prefix)
        started = time.monotonic()
        try:
            metas = await self._bounded(obstore.list(store, prefix or None, chunk_size=PAGE).collect_async())
        except Exception as exc:
            raise self.requests.failed("list", prefix, started, self.requests.reason(exc)) from None
        self.requests.done("list", started)
        now = datetime.now(UTC)
        return [ObjectInfo(m["path"], m["size"], (now - m["last_modified"]).total_seconds()) for m in metas]

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`; how many there were."""
        found = await self.list_objects(prefix)
        await self.delete([o.key for o in found])
        return len(found)

    async def close(self, timeout: float | None = None) -> None:
        """Wait (bounded) for abandoned uploads to end and their objects to be deleted."""
        if self._orphans:
            await asyncio.wait(set(self._orphans), timeout=timeout or self.config.request_bound())

    # -- helpers

    def _client_or_raise(self, op: str, key: str) -> S3Store:
        if self._store is None:
            raise self.requests.failed(op, key, time.monotonic(), self._unusable or "no client")
        return self._store

    async def _bounded(self, call: Any) -> Any:
        """A client call that may be cancelled safely (it changes nothing half-way), within one request's bound."""
        try:
            return await asyncio.wait_for(call, self.config.request_bound())
        except TimeoutError:
            raise TimeoutError(f"no answer within {self.config.request_bound():.0f}s") from None

    async def _discard(self, key: str) -> None:
        """Delete what a write that did not succeed may have stored (its caller was told it failed)."""
        try:
            await self.delete(key)
        except StorageError as exc:
            event(log, "object of a failed write not deleted", logging.WARNING, key=key, reason=exc.message)

    def _abandon(self, key: str, upload: asyncio.Future[Any]) -> None:
        """The caller stopped waiting for this upload: once the client is done with it, delete the key
        (whether it completed, failed or was aborted, nothing of it may stay)."""

        async def settle() -> None:
            with contextlib.suppress(Exception):
                await upload
            await self._discard(key)

        task = asyncio.ensure_future(settle())
        self._orphans.add(task)
        task.add_done_callback(self._orphans.discard)

    def _forget(self, key: str) -> None:
        size = self._held.pop(key, None)
        if size is not None:
            self.stats.objects_held -= 1
            self.stats.bytes_held -= size


def s3_client(cfg: ObjectStoreConfig, creds: credentials.Credentials | None) -> S3Store:
    """The obstore client for this store: its bounds, retries and back-off, and these credentials (None: the
    client finds its own)."""
    https = cfg.endpoint is None or cfg.endpoint.startswith("https://")
    s3: dict[str, Any] = {
        "virtual_hosted_style_request": not cfg.path_style,
        # as the AWS SDKs do: TLS already protects the payload; over plain HTTP its signature is the check
        "unsigned_payload": https,
    }
    if cfg.endpoint is not None:
        s3["endpoint"] = cfg.endpoint
    if cfg.region is not None:
        s3["region"] = cfg.region
    if creds is not None:
        s3["access_key_id"] = creds.access_key
        s3["secret_access_key"] = creds.secret_key
        if creds.token:
            s3["session_token"] = creds.token
    window = cfg.retry_window()
    return S3Store(
        cfg.bucket,
        prefix=cfg.prefix or None,
        config=s3,  # type: ignore[arg-type]
        client_options={
            "allow_http": not https,
            "timeout": timedelta(seconds=cfg.timeout),
            "connect_timeout": timedelta(seconds=cfg.connect_timeout),
        },
        retry_config={
            "max_retries": cfg.retries,
            "retry_timeout": timedelta(seconds=window),
            "backoff": {
                "init_backoff": timedelta(milliseconds=100),
                "max_backoff": timedelta(seconds=min(5.0, cfg.timeout)),
                "base": 2,
            },
        },
    )
