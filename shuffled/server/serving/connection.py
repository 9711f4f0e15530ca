"""One connection of the daemon, a local client or a peer daemon: the asyncio shell around its
`ProtocolConnection`.

The protocol connection turns bytes into events and keeps the stream table; this
shell hands each event to the service that owns it (reads, pushes, admin calls),
answers the handshake with the daemon's admission rules, and releases
everything when the connection ends. Stream ids are chosen by whoever opens a
stream; on a peer link both daemons open reads, so the reads this daemon serves
and the ones it makes are kept apart (see `ReadService`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from ...logs import event
from ...net.connection import FrameConnection
from ...net.sender import Outbound
from ...ops.stats import ConnectionCounts
from ...protocol import connection as pc
from ...protocol import events
from ...protocol.auth import token_digest
from ...protocol.errors import (
    AuthFailed,
    ConnectionLost,
    InvalidRequest,
    LimitExceeded,
    ShuffledError,
    ShuttingDown,
    TimedOut,
)
from ...protocol.frames import REPLICA, Role
from ..accounting.watchdog import Liveness, tune_socket
from ..cluster.replication import ReplicaService
from . import admission
from .admin_service import AdminService
from .backlog import REQUESTS, Backlog
from .context import DaemonContext
from .push_service import PushService
from .read_service import ReadService

log = logging.getLogger(__name__)


class DaemonConnection(FrameConnection):
    def __init__(self, daemon: DaemonContext[DaemonConnection], dialed: str | None = None, tls: bool = False) -> None:
        cfg = daemon.config
        limits = pc.Limits(cfg.max_streams_per_connection, cfg.max_pushes_per_connection, cfg.max_admin_per_connection)
        side = pc.Side.DIALER if dialed is not None else pc.Side.ACCEPTOR
        secret = daemon.peer_secret if dialed is not None else None
        proto = pc.ProtocolConnection(
            side, Role.DAEMON, secret=secret, limits=limits, max_payload=cfg.segment_size, who=f"daemon {dialed}"
        )
        super().__init__(proto, high=cfg.high_watermark, low=cfg.low_watermark, tally=daemon.unsent.tally)
        self.daemon = daemon
        #: the peer's address when this daemon dialled it
        self.dialed = dialed
        #: over the peer TLS port (either direction)
        self.tls = tls
        #: what the other side is, once the handshake said so
        self.role: Role | None = None
        self.node = dialed or ""
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.reads = ReadService(self, daemon.node, daemon, daemon.peers)
        self.pushes = PushService(self, daemon)
        #: replica pushes this daemon makes to the other side
        self.replicas = ReplicaService()
        self.admin = AdminService(self, daemon.admin, daemon.background)
        #: the peer's IP address ("unix pid N" for a Unix socket): connection limits count per address
        self.host = "?"
        #: the first fatal error (a TimedOut one is what dependent streams fail with)
        self.failure: ShuffledError | None = None
        #: the nonces of the last `drain_challenge` answered on this connection (see admin_service.Caller)
        self.drain_challenge: tuple[str, str] | None = None
        self.liveness = Liveness.starting(asyncio.get_running_loop().time())
        #: requests waiting for answers to be read (serving/backlog.py)
        self.backlog = Backlog(self, daemon.unsent, self._handle)

    # -- what the services see

    @property
    def draining(self) -> bool:
        return self.daemon.drain.draining

    @property
    def closing(self) -> bool:
        return self.daemon.drain.closing

    @property
    def from_client(self) -> bool:
        return self.role is Role.CLIENT

    def count_error(self, exc: ShuffledError) -> None:
        self.daemon.counters.errors[exc.code.name] += 1

    def send_error(self, stream: int, exc: ShuffledError) -> None:
        """End one of the other side's streams with an error (counted by code for the metrics)."""
        self.count_error(exc)
        self.proto.send_error(stream, exc)

    def authorize(self, app: str, token: object) -> None:
        """Per-application isolation: AUTH_FAILED unless the request's token is the application's."""
        if token is not None and not isinstance(token, str):
            raise InvalidRequest("'token' must be a string")
        self.authorize_digest(app, token_digest(token))

    def authorize_digest(self, app: str, digest: bytes) -> None:
        """The same for a token's digest (what a replica push carries)."""
        try:
            self.daemon.store.app_keys.authorize(app, digest)
        except AuthFailed as exc:
            self.refused(app, exc)
            raise

    def refused(self, app: str, exc: AuthFailed) -> None:
        """Log a request about `app` refused for its token (reads are checked where they are served: the
        store's `snapshot`)."""
        event(log, "request refused", logging.WARNING, peer=self.peer, node=self.node, app=app, reason=exc.message)

    # -- lifecycle

    def on_made(self) -> None:
        self.daemon.connections.add(self)
        assert self.transport is not None
        peer = self.transport.get_extra_info("peername")
        sock = self.transport.get_extra_info("socket")
        self.host = str(peer[0]) if isinstance(peer, tuple) else admission.unix_peer(sock)
        self.tune(self.daemon.config.peer_timeout if self.dialed is not None else 0.0)
        if self.dialed is None:
            try:
                admission.check_handshakes(self.daemon.config, self, self.daemon.connections)
            except LimitExceeded as exc:
                self.fail(exc)
            return
        self.role = Role.DAEMON
        self.proto.start(
            {"node": self.daemon.node, "segment_size": self.daemon.config.segment_size, "features": [REPLICA]}
        )

    def on_lost(self) -> None:
        self.daemon.connections.discard(self)
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(self.close_reason))
            self.ready.exception()  # retrieved: a failed dial is reported by its caller
        if self.role is Role.DAEMON and self.node:
            self.daemon.peers.lost(self.node, self)
        if self.role is not None:
            event(
                log, "connection closed", peer=self.peer, role=self.role_label, node=self.node, reason=self.close_reason
            )
        self._release_all()
        self.daemon.counters.fold(self)
        self.daemon.unsent.drained()  # what it held unsent is gone

    def on_failed(self) -> None:
        self._release_all()

    def fail(self, exc: ShuffledError) -> None:
        if isinstance(exc, AuthFailed) and not self.ready.done():
            self.log_auth_failed(exc.message)
            self.ready.set_exception(exc)
            self.ready.exception()  # retrieved: the dialer's caller sees it through the peer manager
        if self.is_open:
            self.count_error(exc)
            self.failure = exc
        super().fail(exc)

    def stopping(self) -> None:
        """The daemon stops: the answers already made go out, then SHUTTING_DOWN on stream 0, so a client
        retries elsewhere instead of taking the closed connection for a lost daemon (a fetch failure)."""
        if self.is_open:
            self.sender.flush_control()
        self.fail(ShuttingDown("the daemon is stopping; use another daemon"))

    def log_auth_failed(self, reason: str) -> None:
        event(log, "authentication failed", logging.WARNING, peer=self.peer, node=self.node, reason=reason)

    def _release_all(self) -> None:
        """Fail consumers, close served streams, abort pushes: nothing may outlive the connection."""
        lost: ShuffledError = ConnectionLost(f"connection to {self.node or self.peer} lost: {self.close_reason}")
        if isinstance(self.failure, TimedOut):
            lost = TimedOut(self.failure.message)
        self.backlog.release()
        self.reads.release(lost)
        self.pushes.release()
        self.replicas.release(lost)
        self.admin.release(lost)

    @property
    def role_label(self) -> str | None:
        """'client' or 'peer' once the handshake said which (the metrics label)."""
        if self.role is None:
            return None
        return "peer" if self.role is Role.DAEMON else "client"

    @property
    def handshaking(self) -> bool:
        return self.is_open and not self.ready.done()

    def tune(self, user_timeout: float) -> None:
        assert self.transport is not None
        tune_socket(self.transport.get_extra_info("socket"), self.daemon.config.tcp_keepalive, user_timeout)

    def counts(self, now: float) -> ConnectionCounts:
        """What this connection's reads and pushes are doing at monotonic time `now` (for the stats)."""
        pushes = self.pushes.sessions.values()
        reads = self.reads
        return ConnectionCounts(
            role=self.role_label,
            served=len(reads.served),
            pushing=len(pushes),
            remote_channels=len(reads.channels),
            inflight_buffers=self.sender.inflight,
            backlog_buffers=sum(s.backlog for s in reads.served.values()),
            push_outstanding=sum(p.pool.promised for p in pushes if p.pool is not None),
            read_outstanding=sum(ch.credit.sender_credit for ch in reads.channels.values()),
            push_wait_seconds=sum(p.waiting_for(now) for p in pushes),
            held_back=sum(1 for p in pushes if p.held_back),
        )

    # -- for the watchdog

    def depends_on_peer(self) -> bool:
        """Streams or requests wait on the other side: it must keep answering."""
        return bool(self.reads.channels or self.reads.served or self.admin.waiters or self.replicas.outgoing)

    def has_streams(self) -> bool:
        reads = self.reads
        return bool(
            reads.channels
            or reads.served
            or reads.gates
            or self.pushes.sessions
            or self.replicas.outgoing
            or self.admin.waiters
        ) or (self.admin.running > 0)

    def ping(self) -> None:
        self.admin.ping()

    def served_streams(self) -> Iterable[Outbound]:
        return self.reads.served.values()

    # -- events

    def handle_event(self, ev: events.Event) -> None:
        if isinstance(ev, REQUESTS) and self.backlog.holds(ev):
            return
        self._handle(ev)

    def on_drained(self) -> None:
        self.daemon.unsent.drained()

    def _handle(self, ev: events.Event) -> None:
        match ev:
            case events.BufferArrived(frame):
                self.reads.on_buffer(frame)
            case events.CreditAdded(stream):
                self.reads.on_credit(stream)
            case events.PushDataArrived(frame):
                self.pushes.on_data(frame)
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
                if not self.reads.on_failed(stream, exc) and not self.replicas.on_failed(stream, exc):
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
                admission.answer_hello(self, self.daemon, role, info)
            case events.Authenticated(role, info):
                admission.accept(self, self.daemon, role, info)
            case events.HandshakeDone(info):
                admission.dialled(self, info)

    def opened(self, role: Role) -> None:
        self.role = role
        self.ready.set_result(None)
        self.daemon.counters.opened[self.role_label or "client"] += 1
        event(log, "connection open", peer=self.peer, role=self.role_label, node=self.node)
