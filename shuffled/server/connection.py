"""One connection of the daemon: a local client or a peer daemon, told apart by Hello.

Stream ids are chosen by whoever opens the stream (receiver ids for reads, writer
ids for pushes, request ids for admin calls) and name it in every frame about it.
On a peer connection both daemons open streams, so each side keeps the streams it
serves (`served`) apart from the channels it consumes (`channels`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..logs import event
from ..net.connection import FrameConnection, release_payload
from ..net.soon import Soon
from ..net.streams import BufferResponseStream
from ..protocol.auth import AcceptorAuth, DialerAuth
from ..protocol.codec import (
    encode,
    encode_add_credit,
    encode_admin_request,
    encode_admin_response,
    encode_auth_challenge,
    encode_auth_response,
    encode_error_from,
)
from ..protocol.errors import (
    AuthFailed,
    ConnectionLost,
    CreditViolation,
    InvalidRequest,
    LimitExceeded,
    MapOutputStateError,
    ProtocolError,
    ShuffledError,
    ShuttingDown,
    TimedOut,
    UnknownStream,
    error_from_code,
)
from ..protocol.frames import (
    MAX_CONTROL_BODY,
    MAX_HANDSHAKE_BODY,
    AbortMapOutput,
    AddCredit,
    AdminRequest,
    AdminResponse,
    AuthChallenge,
    AuthResponse,
    BufferKind,
    BufferResponse,
    CancelPartitionRequest,
    Close,
    CommitMapOutput,
    ErrorResponse,
    Frame,
    FrameType,
    Hello,
    HelloAck,
    OpenMapOutput,
    PartitionRequest,
    PushData,
    Role,
)
from .chunks import Chunk
from .feed import DiskFedStream
from .peers import PeerManager, split_address
from .pushing import PushSession
from .reading import InputGate, RemoteInputChannel
from .services import Services
from .shares import Share
from .watchdog import tune_socket

log = logging.getLogger("shuffled.conn")


def _unix_peer(sock: Any) -> str:
    """A Unix-socket client is known by its process (SO_PEERCRED): one process that opens the most
    connections an address may have locks out only itself, not every other local client."""
    try:
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (AttributeError, OSError):
        return "unix"
    return f"unix pid {pid}"


class Host(Services, Protocol):
    """The daemon as its connections see it (`Daemon` is one): its services, who it is, whom it
    trusts, its other connections and peers, and its admin operations."""

    @property
    def node(self) -> str: ...

    @property
    def secret(self) -> bytes | None: ...

    @property
    def peer_secret(self) -> bytes | None: ...

    @property
    def peer_tls(self) -> tuple[ssl.SSLContext, ssl.SSLContext] | None: ...

    @property
    def draining(self) -> bool: ...

    @property
    def connections(self) -> set[DaemonConnection]: ...

    @property
    def peers(self) -> PeerManager[DaemonConnection]: ...

    @property
    def background(self) -> set[asyncio.Task[Any]]: ...

    async def admin(self, op: str, args: dict[str, Any]) -> dict[str, Any]: ...


class DaemonConnection(FrameConnection):
    def __init__(self, daemon: Host, dialed: str | None = None, tls: bool = False) -> None:
        cfg = daemon.config
        super().__init__(max_payload=cfg.segment_size, high=cfg.high_watermark, low=cfg.low_watermark)
        self.daemon = daemon
        #: the peer's address when this daemon dialled it
        self.dialed = dialed
        #: over the peer TLS port (either direction)
        self.tls = tls
        self.role: Role | None = None
        self.node = dialed or ""
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.served: dict[int, BufferResponseStream] = {}
        self.gates: dict[int, InputGate] = {}
        self.channels: dict[int, RemoteInputChannel] = {}
        self.pushes: dict[int, PushSession] = {}
        #: push window segments this connection's map outputs hold (see shares.py)
        self.push_share = Share()
        self.admin_waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._announce: dict[int, RemoteInputChannel] = {}
        #: the handshake's authentication state: ours as a dialer, or the challenge we sent as an acceptor
        self._dialer_auth = DialerAuth(daemon.peer_secret) if dialed is not None else None
        self.reader.set_max_control(MAX_HANDSHAKE_BODY)  # until the handshake is done (PROTOCOL.md §9)
        self._acceptor_auth: AcceptorAuth | None = None
        self._hello: Hello | None = None
        self._flush_announcements_soon = Soon(self._flush_announcements)
        self.admin_running = 0
        #: the peer's IP address ("unix pid N" for a Unix socket): connection limits count per address
        self.host = "?"
        #: the first fatal error (a TimedOut one is what dependent streams fail with)
        self.failure: ShuffledError | None = None
        # deadline state, kept by the watchdog
        self.made_at = asyncio.get_running_loop().time()
        self.silent_since = self.made_at
        self.rx_seen = 0
        self.pinged = False
        self.depended = False

    # -- lifecycle

    def on_made(self) -> None:
        self.daemon.connections.add(self)
        assert self.transport is not None
        peer = self.transport.get_extra_info("peername")
        self.host = str(peer[0]) if isinstance(peer, tuple) else _unix_peer(self.transport.get_extra_info("socket"))
        cfg = self.daemon.config
        self._tune(cfg.peer_timeout if self.dialed is not None else 0.0)
        if self.dialed is None:
            try:
                self._check_handshakes()
            except LimitExceeded as exc:
                self.fail(exc)
            return
        self.role = Role.DAEMON
        assert self._dialer_auth is not None
        info = self._dialer_auth.hello_info({"node": self.daemon.node, "segment_size": self.daemon.config.segment_size})
        self.sender.send_control(encode(Hello(Role.DAEMON, info=info)))

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

    def on_failed(self) -> None:
        self._release_all()

    @property
    def role_label(self) -> str | None:
        """'client' or 'peer' once the handshake said which (the metrics label)."""
        if self.role is None:
            return None
        return "peer" if self.role is Role.DAEMON else "client"

    def _tune(self, user_timeout: float) -> None:
        assert self.transport is not None
        tune_socket(self.transport.get_extra_info("socket"), self.daemon.config.tcp_keepalive, user_timeout)

    def fail(self, exc: ShuffledError) -> None:
        if self.is_open:
            self.daemon.counters.errors[exc.code.name] += 1
            self.failure = exc
        super().fail(exc)

    def depends_on_peer(self) -> bool:
        """Streams or requests wait on the other side: it must keep answering."""
        return bool(self.channels or self.served or self.admin_waiters)

    def has_streams(self) -> bool:
        return bool(self.channels or self.served or self.pushes or self.gates or self.admin_waiters) or (
            self.admin_running > 0
        )

    def ping(self) -> None:
        """Ask a silent peer for a sign of life; the answer (any bytes) is all that matters."""
        self.sender.send_control(encode_admin_request(self.new_stream_id(), "ping", {}))

    def new_stream_id(self) -> int:
        """Never an id still in use after the counter wrapped."""
        sid = super().new_stream_id()
        while sid in self.channels or sid in self.admin_waiters:
            sid = super().new_stream_id()
        return sid

    def send_error(self, stream: int, exc: ShuffledError) -> None:
        """Report an error on one stream (counted by code for the metrics)."""
        self.daemon.counters.errors[exc.code.name] += 1
        if self.is_open:
            self.sender.send_control(encode_error_from(stream, exc))

    def _release_all(self) -> None:
        """Fail consumers, close served streams, abort pushes: nothing may outlive the connection."""
        lost: ShuffledError = ConnectionLost(f"connection to {self.node or self.peer} lost: {self.close_reason}")
        if isinstance(self.failure, TimedOut):
            lost = TimedOut(self.failure.message)
        for ch in list(self.channels.values()):
            ch.fail(lost)
        for gate in list(self.gates.values()):
            gate.close()
        for stream in list(self.served.values()):
            stream.shutdown()
        self.served.clear()
        for session in list(self.pushes.values()):
            session.drop()
        for fut in self.admin_waiters.values():
            if not fut.done():
                fut.set_exception(lost)
        self.admin_waiters.clear()

    def _open_streams(self) -> int:
        return len(self.served) + len(self.pushes)

    # -- frames in

    def payload_target(
        self, ftype: FrameType, stream: int, partition: int, length: int
    ) -> tuple[memoryview, Any] | None:
        if ftype == FrameType.PUSH_DATA:
            session = self.pushes.get(stream)
            return session.target(length) if session is not None else None
        channel = self.channels.get(stream)
        return channel.target(length) if channel is not None else None

    def handle_frame(self, frame: Frame) -> None:
        if self.role is None or (self.dialed is not None and not self.ready.done()):
            self._handshake(frame)
            return
        match frame:
            case PartitionRequest():
                self._on_partition_request(frame)
            case AddCredit(receiver, credit):
                stream = self.served.get(receiver)
                if stream is not None:
                    stream.add_credit(credit)
                    self.sender.wake(stream)
            case BufferResponse():
                ch = self.channels.get(frame.receiver)
                if ch is not None:
                    self._check_landed(frame, frame.kind is BufferKind.DATA)
                    ch.on_buffer(frame)
                else:
                    release_payload(frame)  # the read was cancelled while this arrived
            case CancelPartitionRequest(receiver):
                gate = self.gates.pop(receiver, None)
                if gate is not None:
                    gate.close()
                stream = self.served.pop(receiver, None)
                if stream is not None:
                    stream.shutdown()
            case ErrorResponse(stream, code, message):
                self._on_error(stream, error_from_code(code, message))
            case OpenMapOutput():
                self._on_open(frame)
            case PushData():
                session = self.pushes.get(frame.writer)
                if session is not None:
                    self._check_landed(frame, True)
                    session.on_data(frame)
                else:
                    release_payload(frame)
                    self._unknown_writer(frame.writer)
            case CommitMapOutput(writer, pushes):
                if (session := self._session(writer)) is not None:
                    session.commit(pushes)
            case AbortMapOutput(writer):
                if (session := self._session(writer)) is not None:
                    session.abort()
            case AdminRequest():
                limit = self.daemon.config.max_admin_per_connection
                if self.admin_running >= limit:
                    self.send_error(
                        frame.request,
                        LimitExceeded(f"max-admin-per-connection ({limit}) admin requests are already in progress"),
                    )
                    return
                self.admin_running += 1
                task = asyncio.create_task(self._on_admin(frame))
                self.daemon.background.add(task)
                task.add_done_callback(self.daemon.background.discard)
            case AdminResponse(request, result):
                fut = self.admin_waiters.pop(request, None)
                if fut is not None and not fut.done():
                    fut.set_result(result)
            case Close():
                self.close("peer sent Close")
            case _:
                raise ProtocolError(f"{type(frame).__name__} is not expected by a daemon")

    def _handshake(self, frame: Frame) -> None:
        try:
            if self.dialed is not None:
                self._dialer_handshake(frame)
            elif self._acceptor_auth is not None:
                self._acceptor_auth.check(frame.proof if isinstance(frame, AuthResponse) else None)
                assert self._hello is not None
                self._accept(self._hello)
            else:
                self._on_hello(frame)
        except AuthFailed as exc:
            event(log, "authentication failed", logging.WARNING, peer=self.peer, node=self.node, reason=exc.message)
            if not self.ready.done():
                self.ready.set_exception(exc)
                self.ready.exception()  # retrieved: the dialer's caller sees it through the peer manager
            self.fail(exc)

    def _dialer_handshake(self, frame: Frame) -> None:
        assert self.dialed is not None and self._dialer_auth is not None
        if isinstance(frame, AuthChallenge):
            proof = self._dialer_auth.answer(frame.nonce, frame.proof, f"daemon {self.dialed}")
            self.sender.send_control(encode_auth_response(proof))
            return
        if isinstance(frame, HelloAck):
            self._dialer_auth.accepted(f"daemon {self.dialed}")
            if frame.info.get("node") not in (None, self.dialed):
                event(log, "peer name differs", logging.WARNING, dialed=self.dialed, says=frame.info.get("node"))
            self._handshake_done()
            return
        if isinstance(frame, ErrorResponse):
            exc = error_from_code(frame.code, frame.message)
            self.ready.set_exception(exc)
            self.close(f"handshake refused: {exc.message}")
            return
        raise ProtocolError(f"expected HelloAck, got {type(frame).__name__}")

    def _handshake_done(self) -> None:
        self.reader.set_max_control(MAX_CONTROL_BODY)
        self.ready.set_result(None)

    def _on_hello(self, frame: Frame) -> None:
        """Check the Hello; with a secret, challenge the dialer before anything is created for it."""
        if not isinstance(frame, Hello):
            raise ProtocolError(f"the first frame must be Hello, got {type(frame).__name__}")
        self._check_connection_limit(frame.role)
        if frame.role is Role.DAEMON:
            node = frame.info.get("node")
            if not isinstance(node, str) or not node:
                raise ProtocolError("a daemon's Hello must name its node address")
            self.node = node
        if self.daemon.peer_tls is not None and self.tls != (frame.role is Role.DAEMON):
            where = "the plain port" if self.tls else f"port {self.daemon.config.peer_tls_port} with TLS"
            raise AuthFailed(f"{'peer daemons' if not self.tls else 'clients'} must connect on {where}")
        # A daemon proves the peer secret, which no application has: its role is never taken on its word.
        secret = self.daemon.peer_secret if frame.role is Role.DAEMON else self.daemon.secret
        if secret is None:
            self._accept(frame)
            return
        who = f"daemon {self.node}" if frame.role is Role.DAEMON else f"client {self.peer}"
        self._acceptor_auth = AcceptorAuth(secret, frame.info.get("nonce"), who)
        self._hello = frame
        self.sender.send_control(encode_auth_challenge(*self._acceptor_auth.challenge()))

    def _accept(self, frame: Hello) -> None:
        self._acceptor_auth = self._hello = None
        if frame.role is Role.DAEMON:
            node = self.node
            theirs = frame.info.get("segment_size")
            if theirs != self.daemon.config.segment_size:
                self.fail(
                    InvalidRequest(
                        f"segment size {theirs} of daemon {node} differs from ours "
                        f"({self.daemon.config.segment_size}); every daemon of a cluster needs the same"
                    )
                )
                return
            try:
                self.daemon.peers.accept(node, self)
            except ShuffledError as exc:
                self.fail(exc)
                return
            self._tune(self.daemon.config.peer_timeout)
        self.role = frame.role
        self._handshake_done()
        ack = HelloAck(Role.DAEMON, info={"node": self.daemon.node, "segment_size": self.daemon.config.segment_size})
        self.sender.send_control(encode(ack))
        self.daemon.counters.opened[self.role_label or "client"] += 1
        event(log, "connection open", peer=self.peer, role=self.role_label, node=self.node)

    def _check_handshakes(self) -> None:
        """Refuse a connection while too many others, from its address or from all, are still in their
        handshake: before authentication nobody is known, so only counting bounds what strangers hold."""
        cfg = self.daemon.config
        pending = [c for c in self.daemon.connections if c is not self and c.dialed is None and c.handshaking]
        same = sum(1 for c in pending if c.host == self.host)
        if same >= cfg.max_handshakes_per_address:
            raise LimitExceeded(
                f"max-handshakes-per-address ({cfg.max_handshakes_per_address}) reached: {same} connections from "
                f"{self.host} have not finished their handshake"
            )
        if len(pending) >= cfg.max_handshakes:
            raise LimitExceeded(
                f"max-handshakes ({cfg.max_handshakes}) reached: {len(pending)} connections have not finished "
                "their handshake"
            )

    @property
    def handshaking(self) -> bool:
        return self.is_open and not self.ready.done()

    def _check_connection_limit(self, role: Role) -> None:
        """Refuse one more client (or peer) connection from an address that already has its maximum."""
        cfg = self.daemon.config
        peer = role is Role.DAEMON
        limit = cfg.max_connections_per_peer if peer else cfg.max_connections_per_client
        same = sum(1 for c in self.daemon.connections if c.role is role and c.host == self.host and c.is_open)
        if same >= limit:
            kind = "peer" if peer else "client"
            raise LimitExceeded(
                f"max-connections-per-{kind} ({limit}) reached: {same} {kind} connections from {self.host} are open"
            )

    @staticmethod
    def _check_landed(frame: BufferResponse | PushData, has_payload: bool) -> None:
        """A data frame whose stream was opened by a frame of the same read had nowhere to land.

        Frames of one read are decoded before any is handled, so a PushData right
        behind its OpenMapOutput found no session, hence no credit, when its bytes
        arrived: that is data sent before credit was granted.
        """
        if has_payload and frame.payload is None:
            stream = frame.receiver if isinstance(frame, BufferResponse) else frame.writer
            raise CreditViolation(f"stream {stream}: data frame sent before credit was granted")

    def _unknown_writer(self, writer: int) -> None:
        if writer == 0:
            raise ProtocolError("stream id 0 is reserved for the connection")
        self.send_error(writer, UnknownStream(f"no open map output for writer {writer}"))

    def _session(self, writer: int) -> PushSession | None:
        """The writer's session, or None after a per-stream error saying why (the connection lives on)."""
        session = self.pushes.get(writer)
        if session is None:
            self._unknown_writer(writer)
        elif session.pool is None:
            session.fail(MapOutputStateError("commit or abort before the daemon granted push credit"))
            return None
        return session

    def _check_new_stream(self, sid: int) -> bool:
        """A stream id the peer opens: never 0, never one of its open streams of any kind."""
        if sid == 0:
            raise ProtocolError("stream id 0 is reserved for the connection")
        if sid in self.served or sid in self.gates or sid in self.pushes:
            raise ProtocolError(f"stream id {sid} is already in use")
        limit = self.daemon.config.max_streams_per_connection
        if self._open_streams() >= limit:
            self.send_error(
                sid, LimitExceeded(f"max-streams-per-connection ({limit}) streams are open on this connection")
            )
            return False
        return True

    def _on_error(self, stream: int, exc: ShuffledError) -> None:
        if stream == 0:
            self.close_reason = f"peer reported {exc.code.name}: {exc.message}"
            self.close(self.close_reason)
            return
        ch = self.channels.get(stream)
        if ch is not None:
            ch.fail(exc)
        fut = self.admin_waiters.pop(stream, None)
        if fut is not None and not fut.done():
            fut.set_exception(exc)

    # -- reads

    def _on_partition_request(self, req: PartitionRequest) -> None:
        rid = req.receiver
        if not self._check_new_stream(rid):
            return
        daemon = self.daemon
        local: list[int] | None = None
        remote: dict[str, list[int]] = {}
        for addr, attempts in req.locations.items():
            if addr in ("", daemon.node):
                local = (local or []) + attempts
            else:
                remote[addr] = attempts
        try:
            if remote and self.role is not Role.CLIENT:
                raise InvalidRequest("a peer daemon may only ask for data held by the daemon it asks")
            self._authorize(req.app, req.token)
            for addr in remote:
                split_address(addr)
            if req.start > req.end:
                raise InvalidRequest(f"partition range [{req.start}, {req.end}) is empty or reversed")
            items, on_disk = (
                daemon.store.snapshot(req.app, req.shuffle, req.start, req.end, local) if local is not None else ([], 0)
            )
        except ShuffledError as exc:
            self.send_error(rid, exc)
            return
        gate: InputGate | None = None
        if on_disk:
            fed = DiskFedStream(
                rid, req.credit, self._stream_ended, daemon, items, lambda: self._local_done(rid), self._failer(rid)
            )
            fed.sender = self.sender
            stream: BufferResponseStream = fed
        else:
            stream = BufferResponseStream(rid, req.credit, self._stream_ended)
            counters = daemon.counters
            for chunk in items:
                assert isinstance(chunk, Chunk)
                stream.push_data(chunk)
                counters.served_local_bytes += chunk.buffer.length
            counters.served_local_buffers += len(items)
        stream.opened_at = time.monotonic()
        stream.relayed = bool(remote)
        self.served[rid] = stream
        if remote:
            gate = InputGate(self, stream, req, remote, daemon, daemon.peers, local_pending=bool(on_disk))
            self.gates[rid] = gate
            gate.task = asyncio.create_task(gate.open())
        elif not on_disk:
            stream.end()
        self.sender.wake(stream)
        if on_disk:
            fed.pump()

    def _local_done(self, rid: int) -> None:
        """A disk-fed local part is fully queued: the stream ends, or its gate counts one part done."""
        gate = self.gates.get(rid)
        if gate is not None:
            gate.channel_done()
            return
        stream = self.served.get(rid)
        if stream is not None:
            stream.end()
            self.sender.wake(stream)

    def _failer(self, rid: int) -> Callable[[ShuffledError], None]:
        def fail(exc: ShuffledError) -> None:
            gate = self.gates.get(rid)
            if gate is not None:
                gate.fail(exc)
                return
            stream = self.served.pop(rid, None)
            if stream is not None:
                event(log, "read failed", logging.WARNING, stream=rid, code=exc.code.name, reason=exc.message)
                stream.shutdown()
                if self.is_open:
                    self.send_error(rid, exc)

        return fail

    def _stream_ended(self, stream: BufferResponseStream) -> None:
        if self.served.get(stream.stream) is stream:
            del self.served[stream.stream]
        self.daemon.metrics.observe_read(time.monotonic() - stream.opened_at, stream.relayed)

    def open_channel(self, ch: RemoteInputChannel, req: PartitionRequest) -> None:
        self.channels[ch.receiver] = ch
        self.daemon.counters.read_credit_granted += req.credit
        self.sender.send_control(encode(req))

    def announce(self, ch: RemoteInputChannel) -> None:
        """Lazily send AddCredit: collect channels now, send what they owe once per loop turn."""
        self._announce[ch.receiver] = ch
        self._flush_announcements_soon()

    def _flush_announcements(self) -> None:
        pending, self._announce = self._announce, {}
        if not self.is_open:
            return
        for ch in pending.values():
            n = ch.credit.take_announcement()
            if n and not ch.closed:
                self.daemon.counters.read_credit_granted += n
                self.sender.send_control(encode_add_credit(ch.receiver, n))

    # -- pushes

    def _on_open(self, req: OpenMapOutput) -> None:
        if self.role is not Role.CLIENT:
            raise ProtocolError("only clients push map output")
        if not self._check_new_stream(req.writer):
            return
        limit = self.daemon.config.max_pushes_per_connection
        if len(self.pushes) >= limit:
            self.send_error(
                req.writer,
                LimitExceeded(f"max-pushes-per-connection ({limit}) map outputs are open on this connection"),
            )
            return
        if self.daemon.draining:
            self.send_error(req.writer, ShuttingDown("the daemon is shutting down; retry with another daemon"))
            return
        store = self.daemon.store
        try:
            self._authorize(req.app, req.token)
            self.daemon.shares.check(self.push_share, req.app)
            out = store.open_map_output(req.app, req.shuffle, req.map_index, req.attempt, req.partitions)
        except ShuffledError as exc:
            self.send_error(req.writer, exc)
            return
        store.bind(req.app, req.token)
        session = PushSession(self, req, out, self.daemon)
        self.pushes[req.writer] = session
        session.task = asyncio.create_task(session.start())

    # -- admin

    async def request_admin(self, op: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        sid = self.new_stream_id()
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.admin_waiters[sid] = fut
        self.sender.send_control(encode_admin_request(sid, op, args))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.admin_waiters.pop(sid, None)

    def _authorize(self, app: str, token: object) -> None:
        """Per-application isolation: AUTH_FAILED unless the request's token is the application's."""
        if token is not None and not isinstance(token, str):
            raise InvalidRequest("'token' must be a string")
        try:
            self.daemon.store.authorize(app, token)
        except AuthFailed as exc:
            event(log, "request refused", logging.WARNING, peer=self.peer, node=self.node, app=app, reason=exc.message)
            raise

    async def _on_admin(self, req: AdminRequest) -> None:
        try:
            app = req.args.get("app")
            if isinstance(app, str) and req.op != "stats":
                self._authorize(app, req.args.get("token"))
            result = await self.daemon.admin(req.op, req.args)
        except ShuffledError as exc:
            self.send_error(req.request, exc)
            return
        finally:
            self.admin_running -= 1
        if self.is_open:
            self.sender.send_control(encode_admin_response(req.request, result))
