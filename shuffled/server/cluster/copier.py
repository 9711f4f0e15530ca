"""Copies of committed attempts for other daemons: what a drain hands over (handover.py) and what healing
makes again (healing.py).

An attempt lacking copies gets them on the first candidates that lack it, in placement order: a reader
whose primary is gone looks for copies exactly there (serving/input_gate.py), and a copy of a replica names
the same primary, so it is found the same way. A copy is a replica push fed from storage's view of the
attempt's pieces (storage/view.py): every piece whole, in push order, one PushData each, so the target
holds the same pieces; memory pieces are the store's own segments, spilled ones are loaded a batch at a
time into segments of the read reserve, and at most `replica-lag` pieces wait unsent. It carries the
digest of the token its application is bound to (journaled with the shuffle, so known after a restart
too); an attempt whose application's binding is unknown is not copied: sent as "no token", a copy would
bind the application so on the target, or be refused there. The target must acknowledge exactly the bytes
per partition the pieces sent hold.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ...config import DaemonConfig
from ...logs import event
from ...net.streams import Payload
from ...protocol.errors import (
    ConnectionLost,
    CorruptData,
    PartitionNotFound,
    PeerUnavailable,
    ShuffledError,
    ShuttingDown,
    TimedOut,
)
from ...protocol.frames import REPLICA, OpenMapOutput
from ...protocol.packed import LengthTally, group_entries
from ..storage.manager import StorageManager
from ..storage.view import ReadView
from .replication import Connect, ReplicaLink
from .survey import Copies

log = logging.getLogger(__name__)

#: most spilled pieces read back at once (back to back in one place)
LOAD_BATCH = 8
#: failures that make a daemon no target for the rest of a drain or a healing round
GONE = (PeerUnavailable, ConnectionLost, ShuttingDown, TimedOut, TimeoutError, ConnectionError)


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


class Copier:
    """Makes the copies attempts lack (see the module); `unavailable` are daemons no copy is tried on (the
    survey's, and those a copy found gone); `pace` bounds the bytes a second (healing's; a drain copies as
    fast as it can)."""

    def __init__(
        self,
        config: DaemonConfig,
        storage: StorageManager,
        connect: Connect,
        unavailable: set[str],
        pace: Pace | None = None,
    ) -> None:
        self.config = config
        self.storage = storage
        self.connect = connect
        self.unavailable = unavailable
        self.pace = pace

    async def replenish(self, h: Copies, copied: Callable[[int], None] = lambda size: None) -> None:
        """Copy the attempt to candidates that lack it, in placement order, until it has its copies; `copied`
        hears of each copy made, with its bytes. A copy that fails is logged and the next candidate tried."""
        held = h.held
        if self.storage.owner(held.app) is None:
            event(
                log,
                "hand-over skipped: the application's token binding is unknown",
                logging.WARNING,
                app=held.app,
                shuffle=held.shuffle,
                attempt=held.attempt,
            )
            return
        for target in h.candidates:
            if not h.missing or self.storage.held.committed_bytes(held.app, held.shuffle, held.attempt) is None:
                break
            if target in h.holders or target in self.unavailable:
                continue
            try:
                size = await self.copy(h, target)
            except (ShuffledError, TimeoutError, ConnectionError) as exc:
                if isinstance(exc, GONE):
                    self.unavailable.add(target)
                event(
                    log,
                    "hand-over copy failed",
                    logging.WARNING,
                    peer=target,
                    app=held.app,
                    shuffle=held.shuffle,
                    attempt=held.attempt,
                    reason=str(exc) or "timed out",
                )
                continue
            h.holders.add(target)
            copied(size)

    async def copy(self, h: Copies, target: str) -> int:
        """One replica push of the attempt to `target`, fed from storage; the bytes copied once `target`
        acknowledged exactly the bytes per partition the pieces sent hold."""
        held = h.held
        conn = await self.connect(target)
        if REPLICA not in conn.proto.features:
            raise PeerUnavailable(f"{target} does not take replica pushes")
        key = self.storage.owner(held.app)
        if key is None:
            raise PartitionNotFound(f"shuffle {held.app}/{held.shuffle} was removed")
        view = self.storage.pieces(held.app, held.shuffle, held.attempt, key)
        link = ReplicaLink(self.config)
        req = OpenMapOutput(
            0,
            held.app,
            held.shuffle,
            held.map_index,
            held.attempt,
            held.partitions,
            replicas=held.replicas,
            replica_of=h.primary,
            app_key=key.hex(),
        )
        sent = LengthTally()
        try:
            await link.open(conn, req)
            await self._send(link, view, sent)
            lengths = await link.commit()
        finally:
            view.close()
            link.abort()  # a no-op once committed
        stored = sent.lengths(held.partitions).tolist()
        if lengths != stored:
            raise CorruptData(
                f"{target} committed {sum(lengths)} bytes of attempt {held.attempt}, {sum(stored)} were sent"
            )
        return held.bytes

    async def _send(self, link: ReplicaLink, view: ReadView, sent: LengthTally) -> None:
        """Every piece the view gives, one PushData each, at most the link's lag of them unsent."""
        loaded = asyncio.Event()
        view.listener = loaded.set
        while True:
            await link.caught_up()
            got, _ = view.take(LOAD_BATCH, 1)
            if not got:
                if view.finished:
                    return
                loaded.clear()
                await loaded.wait()  # the view loads the next pieces (it raises a failure at the next call)
                continue
            (chunk,) = got
            buf = chunk.buffer
            sent.add(group_entries(buf.data()))
            size = buf.length
            link.send(Payload(buf, chunk.crc))
            if self.pace is not None:
                await self.pace.take(size)
