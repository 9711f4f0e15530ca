"""A draining daemon hands its committed data over to other daemons before it stops (drain.py, phase
*copying*).

For every committed attempt held here, the copies elsewhere are counted by asking the daemons where
placement puts them (the primary, and the first `replica-search` candidates of the primary's
placement) with the admin `holds`, one call per daemon and shuffle; a daemon that does not answer within
a share of the drain's remaining time holds nothing and is not asked again, so copying still starts
in time. An answer counts only as far as it checks out, like a client's frame: attempts it was asked
about, each with the bytes stored here (`held`). An attempt with fewer copies
elsewhere than its replica count gets copies on the first candidates that lack it, as replica pushes
fed from the store: a reader whose primary is gone looks for copies exactly there (serving/input_gate.py), and a
copy of a replica names the same primary, so it is found the same way. The count wanted elsewhere is
the full replica count, so an attempt keeps its redundancy once this daemon is gone (a host that does
not come back loses nothing); the price is that a rolling restart copies every replicated attempt
once more.

A copy carries the digest of the token its application is bound to (journaled with the shuffle, so
known after a restart too); an attempt whose application's binding is unknown is not copied. A copy
that fails is logged and the drain goes on. What an attempt still lacks at the end is counted once
(`settle`): as `failed` when no other daemon holds it, which makes the hand-over *incomplete* (Spark
recomputes that attempt if its data is needed, as without a hand-over, unless this daemon comes back on
its data dir), as `short` when another daemon does (fewer copies than wanted, as while a daemon is
lost; nothing is lost with this one). A copy pushes the attempt's pieces as they are, in push order,
so the target holds the same pieces; at most `PARALLEL` copies run at once, each with at most
`replica-lag` pieces unsent and one batch of spilled pieces read back in pool segments (the memory
pieces it sends are the store's own).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...buffers import GlobalPool
from ...config import DaemonConfig
from ...logs import event
from ...net.streams import Payload
from ...ops.stats import DrainStats
from ...protocol.errors import (
    ConnectionLost,
    CorruptData,
    InvalidRequest,
    PartitionNotFound,
    PeerUnavailable,
    ShuffledError,
    ShuttingDown,
    TimedOut,
)
from ...protocol.frames import REPLICA, OpenMapOutput
from ...protocol.packed import LengthTally, group_entries
from ..storage.disk import Disk
from ..storage.loader import PieceLoader, run, take
from ..storage.objects import ObjectStore
from ..storage.plan import lookup
from ..storage.shuffles import MapOutput, ShuffleData
from ..storage.store import Store
from .membership import Membership
from .replication import ReplicaLink, ReplicaPeer

log = logging.getLogger(__name__)

#: copies (and `holds` calls) at once: enough to keep a few peers busy, few enough for a small pool
PARALLEL = 4
#: most spilled pieces read back with one preadv (back to back in the file)
LOAD_BATCH = 8
#: most of the drain's remaining time one `holds` call may take: a silent daemon must leave time to copy
SURVEY_SHARE = 0.25
#: failures that make a daemon no target for the rest of the drain
GONE = (PeerUnavailable, ConnectionLost, ShuttingDown, TimedOut, TimeoutError, ConnectionError)


class AdminCalls(Protocol):
    """The admin calls this daemon makes over a peer connection (its `AdminService`)."""

    async def request(self, op: str, args: dict[str, Any], timeout: float) -> dict[str, Any]: ...


class CopyTarget(ReplicaPeer, Protocol):
    """A connection to another daemon, as the hand-over asks and copies over it (a `DaemonConnection`)."""

    @property
    def admin(self) -> AdminCalls: ...


class Targets(Protocol):
    """The daemon's peer connections (its `PeerManager`)."""

    async def get(self, addr: str) -> CopyTarget: ...


class HandOverHost(Protocol):
    """The daemon, as its hand-over sees it: what it holds, where copies go and how to reach them."""

    @property
    def config(self) -> DaemonConfig: ...

    @property
    def node(self) -> str: ...

    @property
    def store(self) -> Store: ...

    @property
    def pool(self) -> GlobalPool: ...

    @property
    def disk(self) -> Disk | None: ...

    @property
    def objects(self) -> ObjectStore | None: ...

    @property
    def membership(self) -> Membership: ...

    @property
    def peers(self) -> Targets: ...


@dataclass(slots=True, eq=False)
class HandOver:
    """One committed attempt held here and where its copies are."""

    data: ShuffleData
    attempt: int
    #: the node a reader names for it: this daemon, or the primary this one holds a replica of
    primary: str
    #: its replica count, which is also how many copies it should have on other daemons than this one
    replicas: int
    #: where copies are placed and looked for, this daemon left out
    candidates: list[str]
    #: other daemons that hold it committed
    holders: set[str] = field(default_factory=set)
    #: what it still lacks has been counted (`Drainer.settle`)
    settled: bool = False

    @property
    def missing(self) -> int:
        return max(0, self.replicas - len(self.holders))


def held(answer: dict[str, Any], data: ShuffleData, asked: list[HandOver]) -> set[int]:
    """The attempts a `holds` answer says its daemon holds, checked as a client's frame is: attempts it was
    asked about, each with the bytes stored here for it (a daemon that claims what it lacks must not keep
    an attempt from being copied). Raises InvalidRequest."""
    attempts, sizes = answer.get("attempts"), answer.get("bytes")
    if not isinstance(attempts, list) or not isinstance(sizes, list) or len(attempts) != len(sizes):
        raise InvalidRequest("'attempts' and 'bytes' must be lists of one length")
    wanted = {h.attempt for h in asked}
    found: set[int] = set()
    for attempt, size in zip(attempts, sizes, strict=True):
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt not in wanted:
            raise InvalidRequest(f"it names attempt {str(attempt)[:40]}, which it was not asked about")
        out = data.committed.get(attempt)
        stored = 0 if out is None else out.bytes
        if not isinstance(size, int) or isinstance(size, bool) or size != stored:
            raise InvalidRequest(f"it holds {str(size)[:40]} bytes of attempt {attempt}, {stored} are stored here")
        found.add(attempt)
    return found


class Pace:
    """At most `rate` bytes a second, a second's worth of burst: a token bucket its users wait on."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.allowance = float(rate)
        self.at = time.monotonic()

    async def take(self, n: int) -> None:
        now = time.monotonic()
        self.allowance = min(float(self.rate), self.allowance + (now - self.at) * self.rate) - n
        self.at = now
        if self.allowance < 0:
            await asyncio.sleep(-self.allowance / self.rate)  # the pace itself, not a wait for an event


class Drainer:
    """One drain's hand-over: `run` surveys, then copies with `PARALLEL` workers, counting into the
    daemon's `DrainStats`."""

    def __init__(self, host: HandOverHost, progress: DrainStats) -> None:
        self.host = host
        self.progress = progress
        #: bounds the `holds` calls in flight; copies are bounded by their workers
        self.limit = asyncio.Semaphore(PARALLEL)
        #: daemons that did not answer `holds`, could not be reached or are shutting down themselves: no
        #: copy is tried there (each try could cost a connect timeout, and the drain has a deadline)
        self.unavailable: set[str] = set()
        #: every committed attempt held here (`survey`), and whether the survey of their holders finished
        self.found: list[HandOver] = []
        self.surveyed = False
        #: bounds the bytes a second copies send (healing's; a drain copies as fast as it can)
        self.pace: Pace | None = None

    async def run(self, deadline: float) -> bool:
        """Hand over what lacks copies; True if that ended before `deadline`. Whatever an attempt still lacks
        then is counted (`settle`), also when the deadline or a bug ended the hand-over."""
        progress = self.progress
        in_time = False
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                todo = [h for h in await self.survey(deadline) if h.missing]
                self.surveyed = True
                progress.to_copy = sum(h.missing for h in todo)
                event(log, "handing over", attempts=len(todo), copies=progress.to_copy)
                queue = deque(todo)
                async with asyncio.TaskGroup() as workers:  # a bug in one cancels the others
                    for _ in range(PARALLEL):
                        workers.create_task(self._work(queue))
            in_time = True
        except TimeoutError:
            event(log, "hand-over timed out", logging.WARNING, to_copy=progress.to_copy, copied=progress.copied)
        except Exception:  # a bug: the hand-over ends here, and the drain goes on to stop the daemon
            event(log, "hand-over failed", logging.ERROR, exc_info=True, copied=progress.copied)
        if not self.surveyed:  # as far as the survey got: what it did not hear of is held here only
            progress.to_copy = sum(h.missing for h in self.found)
        for h in self.found:
            self.settle(h)
        if progress.failed:
            event(
                log,
                "hand-over incomplete",
                logging.WARNING,
                copies_failed=progress.failed,
                copied=progress.copied,
                reason="attempts no other daemon holds are lost with this daemon unless it comes back on its data dir",
            )
        elif progress.short:
            event(
                log,
                "hand-over short of copies",
                copies_short=progress.short,
                copied=progress.copied,
                reason="fewer daemons took a copy than the replica count wants; each attempt is on another daemon",
            )
        return in_time

    def settle(self, h: HandOver) -> None:
        """Count, once, the copies `h` still lacks: `failed` when no other daemon holds it (it is lost with
        this daemon), `short` when one does (fewer copies than wanted, none lost)."""
        if h.settled:
            return
        h.settled = True
        progress = self.progress
        if h.data.removed:  # unregistered meanwhile: nothing left to copy
            progress.to_copy -= h.missing
        elif h.holders:
            progress.short += h.missing
        else:
            progress.failed += h.missing

    def wanted(self, data: ShuffleData, attempt: int) -> int | None:
        """Copies an attempt held here needs on other daemons (None: it is not surveyed): a draining daemon
        wants its full replica count elsewhere, as it is leaving."""
        return data.replicas.get(attempt, self.host.config.replicas)

    async def survey(self, deadline: float) -> list[HandOver]:
        """Every committed attempt held here, with the other daemons that hold it too (as far as they
        answered in time: copying waits for the whole survey, so one silent daemon must not hold it up)."""
        host = self.host
        node = host.node
        groups: dict[tuple[int, str], list[HandOver]] = {}
        shuffles = {id(d): d for s in host.store.apps.values() for d in s.values()}
        self.found = []
        for data in shuffles.values():
            for attempt in data.committed:
                primary = data.replica_of.get(attempt, node)
                wanted = self.wanted(data, attempt)
                if wanted is None:
                    continue
                group = groups.get((id(data), primary))
                if group is None:
                    placed = host.membership.candidates(primary, data.app, data.shuffle)
                    group = groups[id(data), primary] = []
                    cands = [c for c in placed if c != node]
                else:
                    cands = group[0].candidates
                group.append(HandOver(data, attempt, primary, wanted, cands))
                self.found.append(group[-1])
        asks = []
        for (key, primary), group in groups.items():
            asked = group[0].candidates + ([primary] if primary != node else [])
            asks += [self._ask(addr, shuffles[key], group, deadline) for addr in asked]
        await asyncio.gather(*asks)
        return [h for group in groups.values() for h in group]

    async def _ask(self, addr: str, data: ShuffleData, group: list[HandOver], deadline: float) -> None:
        """Which of the group's attempts `addr` holds; a daemon that cannot answer within a share of the
        drain's remaining time (or failed to before) holds none."""
        args: dict[str, Any] = {"app": data.app, "shuffle": data.shuffle, "attempts": [h.attempt for h in group]}
        if addr in self.unavailable:
            return
        try:
            async with self.limit:
                if addr in self.unavailable:  # it failed while this call waited its turn
                    return
                wait = min(self.host.config.admin_timeout, (deadline - time.monotonic()) * SURVEY_SHARE)
                async with asyncio.timeout(max(0.0, wait)):
                    conn = await self.host.peers.get(addr)
                    answer = await conn.admin.request("holds", args, self.host.config.admin_timeout)
        except (ShuffledError, TimeoutError, ConnectionError) as exc:
            if addr not in self.unavailable:
                self.unavailable.add(addr)
                event(log, "holds not answered", logging.WARNING, peer=addr, reason=str(exc) or "timed out")
            return
        try:
            found = held(answer, data, group)
        except InvalidRequest as exc:
            event(log, "holds answer refused", logging.WARNING, peer=addr, reason=exc.message)
            return
        for h in group:
            if h.attempt in found:
                h.holders.add(addr)

    async def _work(self, queue: deque[HandOver]) -> None:
        while queue:
            await self.hand_over(queue.popleft())

    async def hand_over(self, h: HandOver) -> None:
        """Copy the attempt to candidates that lack it, in placement order, until it has its copies."""
        if h.data.app not in self.host.store.app_keys:
            # Sent as "no token", a copy would bind the application so on the target, or be refused there.
            event(
                log,
                "hand-over skipped: the application's token binding is unknown",
                logging.WARNING,
                app=h.data.app,
                shuffle=h.data.shuffle,
                attempt=h.attempt,
            )
            self.settle(h)
            return
        for target in h.candidates:
            if not h.missing or h.data.removed:
                break
            if target in h.holders or target in self.unavailable:
                continue
            try:
                copied = await self.copy(h, target)
            except (ShuffledError, TimeoutError, ConnectionError) as exc:
                if isinstance(exc, GONE):
                    self.unavailable.add(target)
                event(
                    log,
                    "hand-over copy failed",
                    logging.WARNING,
                    peer=target,
                    app=h.data.app,
                    shuffle=h.data.shuffle,
                    attempt=h.attempt,
                    reason=str(exc) or "timed out",
                )
                continue
            h.holders.add(target)
            self.progress.copied += 1
            self.progress.copied_bytes += copied
        self.settle(h)

    async def copy(self, h: HandOver, target: str) -> int:
        """One replica push of the attempt to `target`, fed from the store; the bytes copied once `target`
        acknowledged exactly the bytes per partition the pieces sent hold."""
        host, data = self.host, h.data
        conn = await host.peers.get(target)
        if REPLICA not in conn.proto.features:
            raise PeerUnavailable(f"{target} does not take replica pushes")
        key = host.store.app_keys.get(data.app)
        if data.removed or key is None:
            raise PartitionNotFound(f"shuffle {data.app}/{data.shuffle} was removed")
        found = lookup(host.store, data.app, data.shuffle, 0, data.partitions, [h.attempt], digest=key)
        assert found is not None
        (out,) = found[1]
        link = ReplicaLink(host.config)
        req = OpenMapOutput(
            0,
            data.app,
            data.shuffle,
            out.map_index,
            h.attempt,
            data.partitions,
            replicas=h.replicas,
            replica_of=h.primary,
            app_key=key.hex(),
        )
        sent = LengthTally()
        try:
            await link.open(conn, req)
            await self._send(link, out, sent)
            lengths = await link.commit()
        finally:
            link.abort()  # a no-op once committed
        stored = sent.lengths(data.partitions).tolist()
        if lengths != stored:
            raise CorruptData(
                f"{target} committed {sum(lengths)} bytes of attempt {h.attempt}, {sum(stored)} were sent"
            )
        return out.bytes

    async def _send(self, link: ReplicaLink, out: MapOutput, sent: LengthTally) -> None:
        """Every piece in push order, one PushData each (so the copy's pieces are the primary's): memory
        pieces as they are, spilled ones loaded back into segments of the read reserve (stored data can
        always be read back). At most the link's lag of pieces wait unsent. Pieces are found by index each
        time, as a spill may move them to disk meanwhile."""
        data = out.shuffle
        pool = self.host.pool
        loader = PieceLoader(self.host.disk, self.host.objects)
        i = 0
        try:
            while i < out.pieces:
                await link.caught_up()
                if data.removed:
                    raise PartitionNotFound(f"shuffle {data.app}/{data.shuffle} was removed while being copied")
                buf = out.buffer(i)
                if buf is not None:
                    buf.retain()
                    got = [buf]
                else:
                    batch = run(out, range(i, out.spilled), LOAD_BATCH)
                    got = await loader.load(out, batch, await take(pool, len(batch), pool.give))
                for buf in got:
                    sent.add(group_entries(buf.data()))
                    size = buf.length
                    link.send(Payload(buf, out.crcs[i]))
                    i += 1
                    if self.pace is not None:
                        await self.pace.take(size)
        finally:
            loader.close()
