"""One connection of the daemon as what runs over it sees it: its protocol connection and sender, who is on
the other side (a client or a peer daemon, its node, its address), the answers to the questions every
service asks of it (is the daemon draining, may this token touch that application, how does a stream end
with an error), and the deadlines the watchdog keeps for it.

`DaemonConnection` (connection.py) is this plus the services that run over it and the dispatch of its
events to them; the services, admission and the watchdog are given this, the part below them, so they
import no module above their own.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass

from ...buffers.shm import SharedRegion
from ...config import DaemonConfig
from ...logs import event
from ...net.connection import FrameConnection
from ...net.ports import Port
from ...net.sender import UnsentTally
from ...protocol import connection as pc
from ...protocol.auth import token_digest
from ...protocol.errors import AuthFailed, InvalidRequest, ShuffledError, ShuttingDown
from ...protocol.frames import Role
from ..accounting.counters import Counters
from ..cluster.drain import Drain
from ..storage.manager import StorageManager

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Liveness:
    """The deadline state the watchdog keeps for one connection (watchdog.py)."""

    made_at: float
    #: since when nothing arrived (or since when something waits on a silent peer)
    silent_since: float
    #: bytes received when last looked at
    rx_seen: int = 0
    pinged: bool = False
    #: streams or requests waited on the peer when last looked at
    depended: bool = False
    #: bytes the kernel had taken of what was sent, and since when it has taken none while answers wait
    flushed_seen: int = 0
    unread_since: float = 0.0

    @classmethod
    def starting(cls, now: float) -> Liveness:
        """A new connection's: every clock starts now (an answer queued before anything was flushed, as a
        TLS handshake holds the first ones, waited since the connection was made, not since the loop's
        clock began)."""
        return cls(now, now, unread_since=now)


class DaemonLink(FrameConnection):
    """A connection of the daemon, to a client or a peer daemon (see the module); `dialed`: the peer's address
    when this daemon dialled it, `port`: where it arrived (or went, dialled)."""

    def __init__(
        self,
        config: DaemonConfig,
        counters: Counters,
        storage: StorageManager,
        drain: Drain,
        tally: UnsentTally,
        peer_secret: bytes | None,
        dialed: str | None = None,
        port: Port = Port.TCP,
    ) -> None:
        limits = pc.Limits(
            config.max_streams_per_connection, config.max_pushes_per_connection, config.max_admin_per_connection
        )
        side = pc.Side.DIALER if dialed is not None else pc.Side.ACCEPTOR
        secret = peer_secret if dialed is not None else None
        proto = pc.ProtocolConnection(
            side, Role.DAEMON, secret=secret, limits=limits, max_payload=config.segment_size, who=f"daemon {dialed}"
        )
        super().__init__(proto, high=config.high_watermark, low=config.low_watermark, tally=tally)
        self.config = config
        self.counters = counters
        self.storage = storage
        self._drain = drain
        self.dialed = dialed
        self.port = port
        #: what the other side is, once the handshake said so
        self.role: Role | None = None
        self.node = dialed or ""
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: the peer's IP address ("unix pid N" for a Unix socket): connection limits count per address
        self.host = "?"
        #: the first fatal error (a TimedOut one is what dependent streams fail with)
        self.failure: ShuffledError | None = None
        #: (the caller's nonce, this daemon's) of the last `drain_challenge` answered on this connection; the
        #: next `drain` on it uses them up (PROTOCOL.md §13)
        self.drain_challenge: tuple[str, str] | None = None
        self.liveness = Liveness.starting(asyncio.get_running_loop().time())
        #: a local client's region of shared memory (§6.3), if it asked for one and got it
        self.shm: SharedRegion | None = None

    @property
    def draining(self) -> bool:
        """New pushes are refused."""
        return self._drain.draining

    @property
    def closing(self) -> bool:
        """New reads from clients are refused."""
        return self._drain.closing

    @property
    def from_client(self) -> bool:
        return self.role is Role.CLIENT

    @property
    def role_label(self) -> str | None:
        """'client' or 'peer' once the handshake said which (the metrics label)."""
        if self.role is None:
            return None
        return "peer" if self.role is Role.DAEMON else "client"

    @property
    def handshaking(self) -> bool:
        return self.is_open and not self.ready.done()

    def count_error(self, exc: ShuffledError) -> None:
        self.counters.errors[exc.code.name] += 1

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
            self.storage.authorize(app, digest)
        except AuthFailed as exc:
            self.refused(app, exc)
            raise

    def refused(self, app: str, exc: AuthFailed) -> None:
        """Log a request about `app` refused for its token (reads are checked where they are served too)."""
        event(log, "request refused", logging.WARNING, peer=self.peer, node=self.node, app=app, reason=exc.message)

    def log_auth_failed(self, reason: str) -> None:
        event(log, "authentication failed", logging.WARNING, peer=self.peer, node=self.node, reason=reason)

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

    def opened(self, role: Role) -> None:
        """Accepted (or, dialled, through its handshake): streams may open from now on."""
        self.role = role
        self.ready.set_result(None)
        self.counters.opened[self.role_label or "client"] += 1
        event(log, "connection open", peer=self.peer, role=self.role_label, node=self.node)

    def tune(self, user_timeout: float) -> None:
        assert self.transport is not None
        tune_socket(self.transport.get_extra_info("socket"), self.config.tcp_keepalive, user_timeout)

    # -- what the watchdog asks (the services answer: connection.py)

    def depends_on_peer(self) -> bool:
        """Streams or requests wait on the other side: it must keep answering."""
        raise NotImplementedError

    def has_streams(self) -> bool:
        raise NotImplementedError

    def ping(self) -> None:
        """Ask a silent peer for a sign of life."""
        raise NotImplementedError


def tune_socket(sock: socket.socket | None, keepalive: float, user_timeout: float) -> None:
    """TCP keepalive (idle, then 3 probes a third of it apart) and, for peers, TCP_USER_TIMEOUT.

    TCP_USER_TIMEOUT makes the kernel drop a connection whose sent data stays
    unacknowledged that long: a peer host that vanished mid-transfer is then a
    closed connection even before the watchdog's own bound.
    """
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    if keepalive:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        idle = max(1, int(keepalive))
        for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", max(1, idle // 3)), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if user_timeout and hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(user_timeout * 1000))
