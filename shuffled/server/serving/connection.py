"""One connection of the daemon, a local client or a peer daemon: its link (link.py) and the services
that run over it.

The protocol connection turns bytes into events and keeps the stream table; this
shell hands each event to the service that owns it (reads, pushes, admin calls),
answers the handshake with the daemon's admission rules, and releases
everything when the connection ends. Stream ids are chosen by whoever opens a
stream; on a peer link both daemons open reads, so the reads this daemon serves
and the ones it makes are kept apart (`ReadService`, `PartitionRequestClient`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ...logs import event
from ...net.ports import Port
from ...net.sender import Outbound
from ...ops.stats import ConnectionCounts
from ...protocol import events
from ...protocol.errors import ConnectionLost, LimitExceeded, ProtocolError, ShuffledError, TimedOut
from ...protocol.frames import REPLICA, Role
from ..cluster.replication import ReplicaService
from . import admission
from .admin_service import AdminService
from .backlog import REQUESTS, Backlog
from .environment import ShuffleEnvironment
from .link import DaemonLink
from .partition_requests import PartitionRequestClient
from .push_service import PushService
from .read_service import ReadService

log = logging.getLogger(__name__)


class DaemonConnection(DaemonLink):
    """A connection with the services that run over it (see the module); `env` is the daemon's parts."""

    def __init__(
        self, env: ShuffleEnvironment[DaemonConnection], dialed: str | None = None, port: Port = Port.TCP
    ) -> None:
        super().__init__(
            env.config, env.counters, env.storage, env.drain, env.unsent.tally, env.trust.peer_secret, dialed, port
        )
        self.env = env
        self.reads = ReadService(self, env.node, env, env.peers)
        self.requests = PartitionRequestClient(self, env)
        self.pushes = PushService(self, env)
        #: replica pushes this daemon makes to the other side
        self.replicas = ReplicaService(self.proto)
        self.admin = AdminService(self, env)
        #: requests waiting for answers to be read (serving/backlog.py)
        self.backlog = Backlog(self, env.unsent, self._handle)

    async def admin_call(self, op: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Ask the other daemon admin `op`; its answer, or its error raised (TimeoutError past `timeout`)."""
        return await self.admin.request(op, args, timeout)

    # -- lifecycle

    def on_made(self) -> None:
        self.env.connections.add(self)
        assert self.transport is not None
        peer = self.transport.get_extra_info("peername")
        sock = self.transport.get_extra_info("socket")
        self.host = str(peer[0]) if isinstance(peer, tuple) else admission.unix_peer(sock)
        self.tune(self.env.config.peer_timeout if self.dialed is not None else 0.0)
        if self.dialed is None:
            try:
                admission.check_handshakes(self.env.config, self, self.env.connections)
            except LimitExceeded as exc:
                self.fail(exc)
            return
        self.role = Role.DAEMON
        self.proto.start({"node": self.env.node, "segment_size": self.env.config.segment_size, "features": [REPLICA]})

    def on_lost(self) -> None:
        self.env.connections.discard(self)
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(self.close_reason))
            self.ready.exception()  # retrieved: a failed dial is reported by its caller
        if self.role is Role.DAEMON and self.node:
            self.env.peers.lost(self.node, self)
        if self.role is not None:
            event(
                log, "connection closed", peer=self.peer, role=self.role_label, node=self.node, reason=self.close_reason
            )
        self._release_all()
        self.env.counters.fold(self)
        self.env.unsent.drained()  # what it held unsent is gone

    def on_failed(self) -> None:
        self._release_all()

    def _release_all(self) -> None:
        """Fail consumers, close served streams, abort pushes: nothing may outlive the connection."""
        lost: ShuffledError = ConnectionLost(f"connection to {self.node or self.peer} lost: {self.close_reason}")
        if isinstance(self.failure, TimedOut):
            lost = TimedOut(self.failure.message)
        self.backlog.release()
        self.reads.release()
        self.requests.release(lost)
        self.pushes.release()
        if self.shm is not None:  # stored data in it stays until freed; the name goes now
            self.shm.close()
        self.replicas.release(lost)
        self.admin.release(lost)

    def counts(self, now: float) -> ConnectionCounts:
        """What this connection's reads and pushes are doing at monotonic time `now` (for the stats)."""
        pushes = self.pushes.sessions.values()
        reads = self.reads
        return ConnectionCounts(
            role=self.role_label,
            served=len(reads.served),
            pushing=len(pushes),
            remote_channels=self.requests.reading,
            inflight_buffers=self.sender.inflight,
            backlog_buffers=sum(r.out.backlog for r in reads.served.values()),
            push_outstanding=sum(p.outstanding for p in pushes),
            push_slots=self.shm.held if self.shm is not None else 0,
            read_outstanding=sum(ch.credit.sender_credit for ch in self.requests.channels.values()),
            push_wait_seconds=sum(p.window.waiting_for(now) for p in pushes),
            held_back=sum(1 for p in pushes if p.held_back),
        )

    # -- for the watchdog

    def depends_on_peer(self) -> bool:
        """Streams or requests wait on the other side: it must keep answering."""
        return bool(self.requests.channels or self.reads.served or self.admin.waiters or self.replicas.outgoing)

    def has_streams(self) -> bool:
        reads = self.reads
        return bool(
            self.requests.channels
            or reads.served
            or self.pushes.sessions
            or self.replicas.outgoing
            or self.admin.waiters
        ) or (self.admin.running > 0)

    def ping(self) -> None:
        self.admin.ping()

    def served_streams(self) -> Iterable[Outbound]:
        return [r.out for r in self.reads.served.values()]

    # -- events

    def handle_event(self, ev: events.Event) -> None:
        if self.shm is not None and self.shm.path is not None:  # the client mapped its region before it said
            self.shm.unlink()  # anything more (§6.3): its name goes from the host
        if isinstance(ev, REQUESTS) and self.backlog.holds(ev):
            return
        self._handle(ev)

    def _slots_returned(self, slots: list[int]) -> None:
        """The client is done with read slots (§6.3): free for the next buffers; one it does not hold is its
        error, fatal as any broken rule (it could read a buffer the daemon then puts another in)."""
        assert self.shm is not None and self.shm.reads is not None  # the feature is agreed only with read slots
        try:
            self.shm.reads.returned(slots)
            self.env.counters.read_placed_buffers += len(slots)
        except ValueError as exc:
            self.fail(ProtocolError(f"ReturnSlots: {exc}"))

    def on_drained(self) -> None:
        self.env.unsent.drained()

    def _handle(self, ev: events.Event) -> None:
        match ev:
            case events.BufferArrived(frame):
                self.requests.on_buffer(frame)
            case events.CreditAdded(stream):
                self.reads.on_credit(stream)
            case events.SlotsReturned(slots):
                self._slots_returned(slots)
            case events.PushDataArrived(frame):
                self.pushes.on_data(frame)
            case events.PushPlacedArrived(frame):
                self.pushes.on_placed(frame)
            case events.ReadRequested(request):
                self.reads.on_request(request)
            case events.ReadCancelled(stream):
                self.reads.on_cancel(stream)
            case events.PushOpened(request):
                self.pushes.on_open(request)
            case events.CommitRequested(writer, pushes):
                self.pushes.on_commit(writer, pushes)
            case events.AbortRequested(writer):
                self.pushes.on_abort(writer)
            case events.PushOutOfTurn(writer, exc):
                self.pushes.on_out_of_turn(writer, exc)
            case events.AdminRequested(request):
                self.admin.on_request(request)
            case events.AdminAnswered(request, result):
                self.admin.on_answer(request, result)
            case events.PushCredited(writer):
                self.replicas.on_credit(writer)
            case events.Committed(writer, lengths):
                self.replicas.on_committed(writer, lengths)
            case events.Aborted(writer):
                self.replicas.on_aborted(writer)
            case events.StreamFailed(stream, exc):
                if not self.requests.on_failed(stream, exc) and not self.replicas.on_failed(stream, exc):
                    self.admin.on_failed(stream, exc)
            case events.StreamRefused(_, exc):
                self.count_error(exc)
            case events.ConnectionFailed(exc) if not self.ready.done():
                admission.refused(self, exc)
            case events.ConnectionFailed(exc):
                self.close(f"peer reported {exc.code.name}: {exc.message}")
            case events.CloseRequested():
                self.close("peer sent Close")
            case events.HelloReceived(role, info):
                admission.answer_hello(self, self.env, role, info)
            case events.Authenticated(role, info):
                admission.accept(self, self.env, role, info)
            case events.HandshakeDone(info):
                admission.dialled(self, info)
