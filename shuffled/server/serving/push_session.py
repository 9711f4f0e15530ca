"""Taking map output from an executor under push credit.

A PushSession owns a window (push_window.py): every segment its LocalPool holds and
has not filled is one unit of push credit the client was granted, so a PushData
always has memory to land in. A filled segment moves to the store (out of the pool)
and the pool asks the global pool for a replacement; only when one is free is new
credit granted. A full pool therefore stops pushers (back-pressure) instead of growing.

What each PushData (or, through shared memory, PushPlaced) becomes is the push's intake's
(push_intake.py).

A client's push may be replicated (cluster/replication.py): its replica pushes open before
the first credit, every stored buffer is forwarded to them by reference, credit
waits while a replica lags, and the replicas commit before the local commit. A
replica lost on the way fails the attempt with PEER_UNAVAILABLE, which Spark retries
(the task, not the stage): a CommitAck means every copy it could have is there.

A session goes through the phases of `PHASES` and no others; which frames its stream may carry in each
is the protocol's table (protocol/streams.py), checked before a frame reaches the session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections.abc import Callable
from enum import Enum
from functools import partial
from typing import Any, Protocol

from ...buffers import Buffer, LocalPool
from ...buffers.shm import SharedRegion
from ...logs import event
from ...net.once_per_turn import OncePerTurn
from ...protocol.connection import ProtocolConnection
from ...protocol.errors import (
    MapOutputStateError,
    PeerUnavailable,
    ShuffledError,
)
from ...protocol.frames import OpenMapOutput, PushData, PushPlaced
from ..accounting.shares import Share
from ..cluster.replication import ReplicaLinks
from ..storage.writer import MapOutputWriter
from .environment import ShuffleEnvironment
from .push_intake import PushIntake, Stored
from .push_slots import SlotCredit
from .push_window import PushWindow

log = logging.getLogger(__name__)


class Phase(Enum):
    OPENING = "opening"  # replicas opening, the guaranteed minimum awaited: no credit yet
    RECEIVING = "receiving"  # the pool is the writer's credit: its data lands there
    COMMITTING = "committing"  # a replicated commit waits for its replicas: nothing more may come
    CLOSED = "closed"  # committed, aborted, failed or dropped: everything given back


#: a phase -> the phases it may go to
PHASES: dict[Phase, frozenset[Phase]] = {
    Phase.OPENING: frozenset({Phase.RECEIVING, Phase.CLOSED}),
    Phase.RECEIVING: frozenset({Phase.COMMITTING, Phase.CLOSED}),
    Phase.COMMITTING: frozenset({Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
}


class PushConnection(Protocol):
    """The connection a map output is pushed over, as its session sees it (a connection's `PushService`)."""

    @property
    def is_open(self) -> bool: ...

    @property
    def proto(self) -> ProtocolConnection: ...

    @property
    def push_share(self) -> Share | None: ...

    @property
    def shm(self) -> SharedRegion | None: ...

    def send_error(self, stream: int, exc: ShuffledError) -> None: ...

    def flush(self) -> None: ...

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
        self.writer = req.writer
        self.out = out
        self.phase = Phase.OPENING
        out.on_failure = self.fail
        self.window = PushWindow(env, conn.push_share, out, self.fail, self._top_up)
        self._unannounced = 0
        self._announce_soon = OncePerTurn(self._announce)
        #: the frames of one read are all taken before the window is refilled once for them
        self._top_up_soon = OncePerTurn(self._top_up)
        #: on a connection with shared memory, the credit as slots of it (push_slots.py)
        self.slots = SlotCredit(conn.shm, req.writer) if conn.shm is not None else None
        self.intake = PushIntake(req.writer, self.window, out, env, self.slots)
        # a PushPlaced's groups out of the window: their credit told at once, not once stored, so the writer fills
        # slots meanwhile (rate 0.8-1.6x, median 1.2); not replicated pushes, whose lag counts stored groups
        self.intake.copied = partial(self._top_up, at_once=True) if links is None else None
        #: opening the replicas and the pool, then a replicated commit
        self.task: asyncio.Task[None] | None = None
        #: the replica pushes of a replicated client push
        self.links = links
        #: new credit waits until no replica lags
        self.held_back = False
        if links is not None:
            links.on_failure = self._replica_failed
            links.on_progress = self._top_up

    @property
    def closed(self) -> bool:
        return self.phase is Phase.CLOSED

    def _enter(self, phase: Phase) -> None:
        if phase not in PHASES[self.phase]:
            raise RuntimeError(f"writer {self.writer}: a push cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase

    async def start(self) -> None:
        if self.window.hopeless():
            return
        if self.links is not None:
            try:
                await self.links.open()
            except ShuffledError as exc:
                self.fail(exc)
                return
            if not self.links.links:  # degraded to this copy alone: an ordinary push from here on
                self.links = None
        if not await self.window.open():  # the session was closed meanwhile
            return
        self._enter(Phase.RECEIVING)
        self._top_up()

    def target(self, length: int) -> tuple[memoryview, Buffer]:
        buf = self.intake.credited()
        return buf.room, buf

    def on_data(self, frame: PushData) -> None:
        self._took(self.intake.data, frame)

    def on_placed(self, frame: PushPlaced) -> None:
        self._took(self.intake.placed, frame)

    def _took(self, take: Callable[[Any], Stored | list[Stored] | None], frame: PushData | PushPlaced) -> None:
        """A data frame's groups went into the store (to the replicas too), or were duplicates; new credit
        follows."""
        try:
            stored = take(frame)
        except ShuffledError as exc:
            self.fail(exc)
            return
        if stored and self.links is not None:
            for piece in stored if isinstance(stored, list) else (stored,):
                self.links.forward(*piece)
        self._top_up_soon()

    def _top_up(self, at_once: bool = False) -> None:
        """Refill the window and grant one credit per new free segment (none while a replica lags); told this
        loop turn, or `at_once` (written now: before a frame is stored, the spiller's brake holds from the next)."""
        if self.phase is not Phase.RECEIVING:
            return
        window, pool = self.window, self.window.pool
        assert pool is not None
        new = window.fill()
        if new > 0 and self.links is not None:
            self.held_back = self.links.lagging()
        if new <= 0:
            window.wait_if_empty()
        elif self.links is None or not self.held_back:  # else the links call again once no replica lags
            pool.promise(new)
            self.counters.push_credit_granted += new
            self._unannounced += new
        if not _tell_now(self._unannounced, pool):
            return
        if at_once:
            self._announce()
            self.conn.flush()
        else:
            self._announce_soon()  # one PushCredit per loop turn carries all new credit

    @property
    def outstanding(self) -> int:
        """Credit granted to the writer and not used (the last of it perhaps not told yet)."""
        pool = self.window.pool
        return pool.promised if pool is not None else 0

    def _announce(self) -> None:
        n, self._unannounced = self._unannounced, 0
        if n and self.phase is Phase.RECEIVING and self.conn.is_open:
            proto = self.conn.proto
            if self.slots is not None:  # with shared memory: slots as far as its tmpfs has room (§6.3)
                slots = self.slots.grant(n)
                if slots:
                    proto.grant_push_credit(self.writer, len(slots), slots)
                n -= len(slots)
            if n:
                proto.grant_push_credit(self.writer, n)

    def commit(self, pushes: int) -> None:
        if pushes != self.intake.received:
            received = self.intake.received
            self.fail(MapOutputStateError(f"commit after {pushes} pushes, but the daemon received {received}"))
            return
        if (self.links is None and not self.out.syncs_commits) or not self.out.writable:
            self._commit()  # storage refuses one no longer open (its shuffle was dropped meanwhile), saying why
            return
        self._enter(Phase.COMMITTING)
        self.window.close()  # nothing more may come (the protocol's table refuses a PushData now)
        self.task = asyncio.create_task(self._commit_later(self.links))

    async def _commit_later(self, links: ReplicaLinks | None) -> None:
        """Replicas commit first, then this copy (synced with `--fsync commit`): a CommitAck means all are there."""
        try:
            copies = await links.commit(self.out.pushed()) if links is not None else ()  # compared with theirs
        except ShuffledError as exc:
            self._replica_failed(exc)
            return
        try:
            lengths = await self.out.commit_synced(copies)
        except ShuffledError as exc:
            self.fail(exc)
            return
        self._acked(lengths)

    def _commit(self) -> None:
        try:
            lengths = self.out.commit()
        except ShuffledError as exc:
            return self.fail(exc)
        self._acked(lengths)

    def _acked(self, lengths: array[int]) -> None:
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
            self._enter(Phase.CLOSED)
            self.conn.closed(self.writer)
        self.window.close()
        if self.slots is not None:
            self.slots.close()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.links is not None:
            self.links.abort()


def _tell_now(unannounced: int, pool: LocalPool) -> bool:
    """Whether a writer hears of its new push credit now: a quarter of its window at a time, or at once when the
    credit it knows of is down to half (a PushCredit per segment cost both sides a system call per 32 KiB)."""
    return unannounced > 0 and (4 * unannounced >= pool.size or 2 * (pool.promised - unannounced) <= pool.size)
