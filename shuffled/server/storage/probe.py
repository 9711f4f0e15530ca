"""Whether the object store works, as readiness sees it: probed at start in the background (a bad
endpoint takes up to its timeouts to tell), again every `OBJECT_STORE_REPROBE` seconds while the
last probe failed. The daemon is not ready while a probe is under way or the last one failed."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from ...logs import event
from ...ops.stats import ObjectStoreStats
from ...protocol.errors import StorageError
from .objects import PROBE_DIR, ObjectStore

log = logging.getLogger(__name__)

#: seconds between probes of an object store whose probe failed (readiness follows the last one)
OBJECT_STORE_REPROBE = 10.0
#: seconds a stopping daemon waits for a probe under way to delete its object
PROBE_STOP_WAIT = 5.0


class ObjectStoreProbe:
    def __init__(self, objects: ObjectStore | None, stats: ObjectStoreStats) -> None:
        self.objects = objects
        self.stats = stats
        self._task: asyncio.Task[None] | None = None
        self._probed_at = 0.0

    def start(self) -> None:
        """Probe now unless there is no object store or a probe is under way."""
        objects = self.objects
        if objects is None or (self._task is not None and not self._task.done()):
            return
        self.stats.state = "probing"
        self._probed_at = time.monotonic()

        async def probing() -> None:
            reason = await probe(objects)
            if reason is None:
                event(log, "object store ready", store=repr(objects))
            else:
                event(log, "object store probe failed", logging.ERROR, store=repr(objects), reason=reason)

        self._task = asyncio.create_task(probing())

    def check(self, now: float) -> None:
        """Probe again if the last probe failed long enough ago (monotonic `now`)."""
        if self.stats.state == "failed" and now - self._probed_at > OBJECT_STORE_REPROBE:
            self.start()

    def reasons(self) -> list[str]:
        """Why the daemon is not ready as far as the object store goes (empty: it works, or there is none)."""
        stats = self.stats
        if stats.state == "probing":
            return [f"object store {stats.url}: probing"]
        return [stats.reason] if stats.state == "failed" else []

    async def close(self) -> None:
        """Stop probing; let the store finish what it abandoned (bounded). A probe under way is given
        `PROBE_STOP_WAIT` to end, as it deletes its object last: cancelled at once, it would leave it behind."""
        task = self._task
        if task is not None and not task.done():
            done, _ = await asyncio.wait({task}, timeout=PROBE_STOP_WAIT)
            if not done:
                task.cancel()
        if self.objects is not None:
            await self.objects.close()


async def probe(objects: ObjectStore) -> str | None:
    """Write, read back and delete a small object under the store's prefix: None when all of that worked, else
    why not (the first step that failed). Takes at most three requests' bounds."""
    stats = objects.stats
    stats.state = "probing"
    key = f"{PROBE_DIR}/{uuid.uuid4().hex[:16]}"
    payload = f"shuffled probe {key}".encode()
    reason: str | None = None
    try:
        await objects.write(key, [payload])
        try:
            back = bytearray(len(payload))
            await objects.read_into(key, 0, [memoryview(back)])
            if back != payload:
                reason = "the probe object read back differs from what was written"
        finally:
            await objects.delete(key)
    except StorageError as exc:
        reason = reason or exc.message
    stats.state, stats.reason = ("failed", reason) if reason else ("ready", "")
    return reason
