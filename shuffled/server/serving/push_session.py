"""Taking map output from an executor under push credit.

A PushSession owns a LocalPool: every segment it holds and has not filled is one
unit of push credit the client was granted, so a PushData always has memory to
land in. A filled segment moves to the store (out of the pool) and the pool asks
the global pool for a replacement; only when one is free is new credit granted.
A full pool therefore stops pushers (back-pressure) instead of growing. While the
spiller works above its high watermark, sessions take no new memory at all until
it is done (`Spiller.admitted`). How far a window grows beyond its guaranteed
floor is bounded by its connection's and its application's shares (`accounting/shares.py`).

A PushData whose sequence number was already received (a writer retrying after a
lost reply) is dropped: its bytes are not stored twice, and the segment it landed
in becomes push credit again.

A client's push may be replicated (cluster/replication.py): its replica pushes open before
the first credit, every stored buffer is forwarded to them by reference, credit
waits while a replica lags, and the replicas commit before the local commit. A
replica lost on the way fails the attempt with PEER_UNAVAILABLE, which Spark retries
(the task, not the stage): a CommitAck means every copy it could have is there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from ...buffers import Buffer, LocalPool
from ...logs import event
from ...net.once_per_turn import OncePerTurn
from ...protocol.connection import ProtocolConnection
from ...protocol.credit import SequenceChecker
from ...protocol.errors import (
    CorruptData,
    CreditViolation,
    MapOutputStateError,
    PeerUnavailable,
    ShuffledError,
    StorageError,
)
from ...protocol.frames import OpenMapOutput, PushData
from ...protocol.integrity import checksum
from ...protocol.packed import check_push
from ..accounting.shares import Share
from ..cluster.replication import ReplicaLinks
from ..storage.writer import MapOutputWriter
from .environment import ShuffleEnvironment

log = logging.getLogger(__name__)


class PushConnection(Protocol):
    """The connection a map output is pushed over, as its session sees it (a connection's `PushService`)."""

    @property
    def is_open(self) -> bool: ...

    @property
    def proto(self) -> ProtocolConnection: ...

    @property
    def push_share(self) -> Share | None: ...

    def send_error(self, stream: int, exc: ShuffledError) -> None: ...

    def closed(self, writer: int) -> None: ...


class PushSession:
    def __init__(
        self,
        conn: PushConnection,
        req: OpenMapOutput,
        out: MapOutputWriter,
        env: ShuffleEnvironment[Any],
        links: ReplicaLinks | None = None,
    ) -> None:
        self.conn = conn
        self.env = env
        self.counters = env.counters
        self.opened_at = time.monotonic()
        #: monotonic time since when the session waits for memory with no credit left (None: not waiting)
        self.waiting_since: float | None = None
        self.writer = req.writer
        self.out = out
        self.pool: LocalPool | None = None
        self.received = 0
        self.seq = SequenceChecker()
        self.duplicates = 0
        self.closed = False
        out.on_failure = self.fail
        #: the floor of this map output's window is reserved in its shares (see accounting/shares.py) until `_close`
        self.shares = env.shares
        self.app_share = self.shares.reserve(conn.push_share, out.app)
        #: segments beyond the floor charged to those shares
        self._extras = 0
        self._waiting: asyncio.Task[None] | None = None
        self._unannounced = 0
        self._announce_soon = OncePerTurn(self._announce)
        #: opening the replicas and the pool, then a replicated commit
        self.task: asyncio.Task[None] | None = None
        #: the replica pushes of a replicated client push
        self.links = links
        #: new credit waits until no replica lags
        self.held_back = False
        if links is not None:
            links.on_failure = self._replica_failed
            links.on_progress = self._top_up

    async def start(self) -> None:
        cfg = self.env.config
        if self._hopeless():
            return
        if self.links is not None:
            try:
                await self.links.open()
            except ShuffledError as exc:
                self.fail(exc)
                return
            if not self.links.links:  # degraded to this copy alone: an ordinary push from here on
                self.links = None
        self.waiting_since = time.monotonic()  # no credit until the guaranteed minimum is free
        pool = await self.env.pool.create_local_pool(cfg.push_min, cfg.push_window, holder=self.out.app)
        self._stop_waiting()
        if self.closed:
            pool.destroy()
            return
        self.pool = pool
        self._top_up()

    def target(self, length: int) -> tuple[memoryview, Buffer]:
        # Credit granted and not yet used is exactly the pool's promised segments.
        if self.pool is None or self.pool.promised <= 0:
            raise CreditViolation(f"writer {self.writer}: PushData without push credit")
        buf = self.pool.request()
        assert buf is not None, "a promised segment is always held"
        return buf.room, buf

    def on_data(self, frame: PushData) -> None:
        buf: Buffer = frame.payload
        buf.length = frame.length
        assert self.pool is not None
        if self.seq.is_duplicate(frame.sequence):
            self.duplicates += 1
            buf.release()  # back into this session's pool: credit again
            self._top_up()
            return
        env = self.env
        self.pool.detach(buf, env.pool.give)
        try:
            self.seq.check(frame.sequence)
            crc = checksum(buf.data())
            if crc != frame.crc:
                raise CorruptData(
                    f"PushData {frame.sequence} of writer {self.writer} failed its CRC32C check (got {crc:08x}, "
                    f"the writer sent {frame.crc or 0:08x}); the attempt is discarded"
                )
            group = check_push(buf.data(), self.out.attempt, self.out.partitions)
            self.out.add(buf, crc, group)
            if self.links is not None:
                self.links.forward(buf, crc, group.data_bytes)
        except ShuffledError as exc:
            if buf.refs:
                buf.release()
            self.fail(exc)
            return
        self.received += 1
        counters = self.counters
        counters.pushed_buffers += 1
        counters.pushed_bytes += group.data_bytes
        self._top_up()

    def _top_up(self) -> None:
        """Refill the pool towards its target and grant one credit per new free segment."""
        pool = self.pool
        if pool is None or self.closed:
            return
        spilling = self.out.holding()
        self._charge()  # pushed data left the window since
        while not spilling and pool.size < pool.target and self._may_grow(pool) and pool.grow():
            self._charge()
        new = pool.available - pool.promised
        if new > 0 and self.links is not None:
            self.held_back = self.links.lagging()
            if self.held_back:
                return  # the links call again once no replica lags
        if new > 0:
            pool.promise(new)
            self.counters.push_credit_granted += new
            self._unannounced += new
            self._announce_soon()  # one PushCredit per loop turn carries all new credit
        elif pool.available == 0 and pool.size < pool.min and self._waiting is None and not self._hopeless():
            self._waiting = asyncio.create_task(self._wait_for_memory())
            self.waiting_since = time.monotonic()

    def _may_grow(self, pool: LocalPool) -> bool:
        """Up to its floor always; beyond it only while its connection, its application and all windows'
        extras are within their shares. A window never waits for memory beyond its floor (`_top_up`): when
        it may not grow it keeps its floor, and its next push asks again."""
        return pool.size < pool.min or self.shares.may_grow(self.conn.push_share, self.app_share)

    def _charge(self) -> None:
        """Keep the shares' count of this window's segments beyond its floor up to date."""
        pool = self.pool
        extras = max(0, pool.size - pool.min) if pool is not None else 0
        if extras != self._extras:
            self.shares.charge(self.conn.push_share, self.app_share, extras - self._extras)
            self._extras = extras

    def _hopeless(self) -> bool:
        """Fail the push now if the memory it would wait for can never come (see `Spiller.push_memory_error`)."""
        need = 1 if self.pool is not None else self.env.config.push_min
        error = self.out.memory_error(need)
        if error is not None:
            self.fail(error)
        return error is not None

    def check_wait(self) -> None:
        """A wait that began while memory could still come: end it if that is no longer so, or once it took
        `push-wait-timeout` (memory that reads or other windows hold comes back only as their parties go on,
        which a party may never do: every writer gets memory or an error)."""
        if self.waiting_since is None or self.closed or self._hopeless():
            return
        waited, env = time.monotonic() - self.waiting_since, self.env
        if waited >= env.config.push_wait_timeout:
            held = env.storage.memory_held()
            self.fail(StorageError(f"no memory for this push after {waited:.0f} s (push-wait-timeout): {held}"))

    def _announce(self) -> None:
        n, self._unannounced = self._unannounced, 0
        if n and not self.closed and self.conn.is_open:
            self.conn.proto.grant_push_credit(self.writer, n)

    async def _wait_for_memory(self) -> None:
        assert self.pool is not None
        try:
            await self.out.admitted()
            await self.pool.grow_wait()
        finally:
            self._waiting = None
            self._stop_waiting()
        self._top_up()

    def waiting_for(self, now: float) -> float:
        """Seconds this session has been waiting for memory so far."""
        return now - self.waiting_since if self.waiting_since is not None else 0.0

    def _stop_waiting(self) -> None:
        self.counters.push_wait_seconds += self.waiting_for(time.monotonic())
        self.waiting_since = None

    def commit(self, pushes: int) -> None:
        if pushes != self.received:
            self.fail(MapOutputStateError(f"commit after {pushes} pushes, but the daemon received {self.received}"))
            return
        if self.links is None or not self.out.writable:
            self._commit()  # storage refuses one no longer open (its shuffle was dropped meanwhile), saying why
            return
        assert self.pool is not None
        self.pool.destroy()  # nothing more may come (a PushData now is a credit violation)
        self.pool = None
        lengths = self.out.pushed()  # compared with the replicas'
        self.task = asyncio.create_task(self._commit_replicated(self.links, lengths))

    async def _commit_replicated(self, links: ReplicaLinks, lengths: list[int]) -> None:
        """The replicas commit first, then this copy: the client's CommitAck means all are there."""
        try:
            copies = await links.commit(lengths)
        except ShuffledError as exc:
            self._replica_failed(exc)
            return
        self._commit(copies)

    def _commit(self, copies: tuple[str, ...] = ()) -> None:
        try:
            lengths = self.out.commit(copies)
        except ShuffledError as exc:
            self.fail(exc)
            return
        self._close()
        self.env.metrics.observe_push(time.monotonic() - self.opened_at)
        self.conn.proto.ack_commit(self.writer, lengths)

    def abort(self) -> None:
        self.out.abort()
        self._close()
        self.conn.proto.ack_abort(self.writer)

    def _replica_failed(self, exc: ShuffledError) -> None:
        if not self.closed:
            self.counters.replication_failed += 1
            self.fail(PeerUnavailable(f"a replica of this push was lost ({exc.message}); the attempt is discarded"))

    def fail(self, exc: ShuffledError) -> None:
        if self.closed:
            return
        event(log, "push failed", writer=self.writer, code=exc.code.name, reason=exc.message)
        self.out.abort()
        self._close()
        self.conn.send_error(self.writer, exc)

    def drop(self) -> None:
        """The client vanished: abort, free everything."""
        self.out.abort()
        self._close()

    def _close(self) -> None:
        if not self.closed:
            self.shares.release(self.conn.push_share, self.out.app, self.app_share, self._extras)
            self._extras = 0
            self.conn.closed(self.writer)
        self.closed = True
        if self._waiting is not None:
            self._waiting.cancel()
        self._stop_waiting()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.links is not None:
            self.links.abort()
        if self.pool is not None:
            self.pool.destroy()
