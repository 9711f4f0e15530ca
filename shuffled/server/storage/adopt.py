"""Serving another node's data from its objects: *adoption* (architecture.md, "Reading a lost node's data").

A read whose daemon is gone (or a daemon that lost its own data in a restart) ends its failover at
the object store: the node's objects of the shuffle are listed (one prefix), each one's footer read
with one suffix GET (two if it is larger than a first guess), and the attempts they prove
(object_format.prove: a commit record, and exactly its pieces) become committed attempts of this
daemon's store, marked as replicas of that node, whose pieces lie in those objects. The read is then
served from this daemon's store as any local copy, and the token is checked there (`Store.lookup`):
the footer carries the digest the application is bound to, which binds it here; objects of an
application bound here to another digest are not adopted, nor are objects whose footer does not say.

Many readers of one lost node fail over at once: one listing per (application, shuffle, node) runs at a
time, and those who ask meanwhile wait for it.
"""

from __future__ import annotations

import asyncio
import logging

from ...logs import event
from ...ops.stats import TierStats
from .access import is_owner
from .disk import LoadedShuffle, StoredObject
from .object_format import FOOTER_GUESS, Footer, decode_footer, footer_span, node_prefix, prove
from .objects import ObjectInfo, ObjectStore
from .restore import restore_shuffle
from .store import Store

log = logging.getLogger(__name__)

#: footers read at once
FOOTER_READS = 8


class Adopter:
    def __init__(self, store: Store, objects: ObjectStore, stats: TierStats) -> None:
        self.store = store
        self.objects = objects
        self.stats = stats
        #: this daemon's name: its own objects adopted back stay its own
        self.node = ""
        self._running: dict[tuple[str, int, str], asyncio.Task[int]] = {}

    async def adopt(self, app: str, shuffle: int, node: str) -> int:
        """Adopt what `node`'s objects of the shuffle prove and this daemon does not hold yet; how many
        attempts that was. Raises StorageError when the store cannot be listed or read."""
        key = (app, shuffle, node)
        task = self._running.get(key)
        if task is None:
            task = self._running[key] = asyncio.create_task(self._adopt(app, shuffle, node))
            task.add_done_callback(lambda _: self._running.pop(key, None))
        return await asyncio.shield(task)

    async def _adopt(self, app: str, shuffle: int, node: str) -> int:
        listed = sorted(await self.objects.list_objects(node_prefix(app, shuffle, node)), key=lambda o: o.key)
        self.stats.adoptions += 1
        if not listed:
            return 0
        found = [
            (info, footer)
            for info, footer in zip(listed, await read_footers(self.objects, listed), strict=True)
            if footer is not None and (footer.app, footer.shuffle, footer.node) == (app, shuffle, node)
        ]
        keys = self.store.at_rest
        sealed = {f.kid for _, f in found if f.kid is not None and (keys is None or not keys.knows(f.kid))}
        if sealed:
            why = f"sealed with at-rest key {', '.join(sorted(sealed))}, which this daemon is not given"
            event(log, "objects not adopted", logging.WARNING, app=app, shuffle=shuffle, node=node, reason=why)
            return 0
        if not found:
            return 0
        digests = {footer.key for _, footer in found}
        bound = self.store.app_keys.get(app)
        digest = found[0][1].key
        if len(digests) != 1 or digest is None or (bound is not None and not is_owner(digest, bound)):
            event(
                log,
                "objects not adopted",
                logging.WARNING,
                app=app,
                shuffle=shuffle,
                node=node,
                reason="their application is bound to another token here, or they do not say which",
            )
            return 0
        proved = prove(footer for _, footer in found)
        held = self.store.apps.get(app, {}).get(shuffle)
        new = [a for a in proved.attempts if held is None or (a not in held.committed and a not in held.open)]
        if not new:
            return 0
        own = node == self.node
        loaded = LoadedShuffle(
            app,
            shuffle,
            found[0][1].partitions,
            "",
            app_key=digest,
            objects=[StoredObject(info.key, info.size, own, footer.kid) for info, footer in found],
        )
        if held is not None and held.partitions != loaded.partitions:
            return 0
        for attempt in new:
            loaded.adopt(attempt, proved.attempts[attempt], proved.commits[attempt], durable=True)
        restore_shuffle(self.store, loaded, None, None if own else node)
        self.stats.adopted_attempts += len(new)
        event(log, "adopted from the object store", app=app, shuffle=shuffle, node=node, attempts=len(new))
        return len(new)


async def read_footers(objects: ObjectStore, listed: list[ObjectInfo]) -> list[Footer | None]:
    """The footers of these objects, `FOOTER_READS` at a time; None (logged) for one that is not ours."""
    limit = asyncio.Semaphore(FOOTER_READS)

    async def read(info: ObjectInfo) -> Footer | None:
        async with limit:
            return await _footer(objects, info)

    return list(await asyncio.gather(*(read(i) for i in listed)))


async def _footer(objects: ObjectStore, info: ObjectInfo) -> Footer | None:
    """The object's footer, read from its end; None (logged) for an object that is not one of ours."""
    want = min(info.size, FOOTER_GUESS)
    tail = bytearray(want)
    await objects.read_into(info.key, info.size - want, [memoryview(tail)])
    try:
        span = footer_span(tail, info.size)
        if span > want:
            tail = bytearray(span)
            await objects.read_into(info.key, info.size - span, [memoryview(tail)])
        return decode_footer(tail, info.size)
    except ValueError as exc:
        event(log, "object not understood", logging.WARNING, key=info.key, reason=str(exc))
        return None
