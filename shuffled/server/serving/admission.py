"""Who may connect: the daemon's side of the handshake.

The protocol connection runs the handshake itself (Hello, the challenge, the
proofs, HelloAck); what it asks the daemon is this module's: is there room for
one more connection from that address, is it on the right port, which secret
must it prove, and may this peer daemon join (same segment size, not a
duplicate of a connection already dialled)? `answer_hello` and `accept` are
the daemon's answers to the protocol connection's `HelloReceived` and
`Authenticated`. `Trust` is what it checks against: the secrets and the peer TLS contexts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import struct
from collections.abc import Iterable
from typing import Any

from ...config import DaemonConfig
from ...logs import event
from ...net.ports import Port
from ...protocol.errors import AuthFailed, InvalidRequest, LimitExceeded, ProtocolError, ShuffledError
from ...protocol.frames import REPLICA, SHM, SHM_READ, Role
from .environment import ShuffleEnvironment
from .link import DaemonLink

log = logging.getLogger(__name__)


def unix_peer(sock: Any) -> str:
    """A Unix-socket client is known by its process (SO_PEERCRED): one process that opens the most
    connections an address may have locks out only itself, not every other local client."""
    cred = _peer_credentials(sock)
    return "unix" if cred is None else f"unix pid {cred[0]}"


def _peer_credentials(sock: Any) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of a Unix socket's other end (SO_PEERCRED); None for another kind of socket."""
    try:
        pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except (AttributeError, OSError):
        return None
    return pid, uid, gid


def check_handshakes(cfg: DaemonConfig, new: DaemonLink, conns: Iterable[DaemonLink]) -> None:
    """Refuse a connection while too many others, from its address or from all, are still in their
    handshake: before authentication nobody is known, so only counting bounds what strangers hold."""
    pending = [c for c in conns if c is not new and c.dialed is None and c.handshaking]
    same = sum(1 for c in pending if c.host == new.host)
    if same >= cfg.max_handshakes_per_address:
        raise LimitExceeded(
            f"max-handshakes-per-address ({cfg.max_handshakes_per_address}) reached: {same} connections from "
            f"{new.host} have not finished their handshake"
        )
    if len(pending) >= cfg.max_handshakes:
        raise LimitExceeded(
            f"max-handshakes ({cfg.max_handshakes}) reached: {len(pending)} connections have not finished "
            "their handshake"
        )


def check_connection_limit(cfg: DaemonConfig, host: str, role: Role, conns: Iterable[DaemonLink]) -> None:
    """Refuse one more client (or peer) connection from an address that already has its maximum."""
    peer = role is Role.DAEMON
    limit = cfg.max_connections_per_peer if peer else cfg.max_connections_per_client
    same = sum(1 for c in conns if c.role is role and c.host == host and c.is_open)
    if same >= limit:
        kind = "peer" if peer else "client"
        raise LimitExceeded(
            f"max-connections-per-{kind} ({limit}) reached: {same} {kind} connections from {host} are open"
        )


def peer_node(info: dict[str, Any]) -> str:
    node = info.get("node")
    if not isinstance(node, str) or not node:
        raise ProtocolError("a daemon's Hello must name its node address")
    return node


def check_port(cfg: DaemonConfig, arrived: Port, role: Role) -> None:
    """With peer TLS on, daemons connect on the peer TLS port only; with client TLS on, TCP clients connect on
    the client TLS port only. Nobody else is let in on a TLS port."""
    if role is Role.DAEMON:
        wanted = {Port.PEER_TLS} if cfg.peer_tls_port else {Port.TCP}
        where = f"port {cfg.peer_tls_port} with TLS" if cfg.peer_tls_port else "the plain port"
    else:
        wanted = {Port.UNIX, Port.CLIENT_TLS if cfg.client_tls_port else Port.TCP}
        where = f"port {cfg.client_tls_port} with TLS" if cfg.client_tls_port else "the plain port"
        if cfg.unix_socket:
            where += " or the Unix socket"
    if arrived not in wanted:
        raise AuthFailed(f"{'peer daemons' if role is Role.DAEMON else 'clients'} must connect on {where}, not on "
                         f"{arrived.value}")  # fmt: skip


def check_segment_size(cfg: DaemonConfig, node: str, info: dict[str, Any]) -> None:
    theirs = info.get("segment_size")
    if theirs != cfg.segment_size:
        raise InvalidRequest(
            f"segment size {theirs} of daemon {node} differs from ours ({cfg.segment_size}); every daemon of a "
            "cluster needs the same"
        )


def answer_hello(conn: DaemonLink, host: ShuffleEnvironment[Any], role: Role, info: dict[str, Any]) -> None:
    """Check the Hello; with a secret, challenge the dialer before anything is created for it."""
    cfg = host.config
    check_connection_limit(cfg, conn.host, role, host.connections)
    if role is Role.DAEMON:
        conn.node = peer_node(info)
    check_port(cfg, conn.port, role)
    # A daemon proves the peer secret, which no application has: its role is never taken on its word.
    secret = host.trust.peer_secret if role is Role.DAEMON else host.trust.secret
    if secret is None:
        accept(conn, host, role, info)
        return
    conn.proto.who = f"daemon {conn.node}" if role is Role.DAEMON else f"client {conn.peer}"
    conn.proto.challenge(secret)


def accept(conn: DaemonLink, host: ShuffleEnvironment[Any], role: Role, info: dict[str, Any]) -> None:
    """A peer daemon joins only with our segment size and unless our own dial to it wins."""
    cfg = host.config
    if role is Role.DAEMON:
        check_segment_size(cfg, conn.node, info)
        host.peers.accept(conn.node, conn)
        conn.tune(cfg.peer_timeout)
    conn.opened(role)
    features = {"features": [REPLICA]} if role is Role.DAEMON else _shared_memory(conn, host, info)
    conn.proto.accept({"node": host.node, "segment_size": cfg.segment_size, **features})


def _shared_memory(conn: DaemonLink, host: ShuffleEnvironment[Any], info: dict[str, Any]) -> dict[str, Any]:
    """The HelloAck keys that give a local client asking for it a region of shared memory (§6.3): only on
    the Unix socket, where the client is on this host; nothing when the daemon cannot make one (the client
    then pushes through the socket)."""
    offered = info.get("features")
    if conn.port is not Port.UNIX or not isinstance(offered, list) or SHM not in offered:
        return {}
    cfg = host.config
    read_slots = cfg.shm_read_slots if SHM_READ in offered else 0
    try:
        region = host.shm.region(host.pool.total, cfg.segment_size, _peer_uid(conn), read_slots)
    except OSError as exc:
        event(log, "no shared memory for a client", logging.WARNING, peer=conn.host, reason=str(exc))
        return {}
    if region is None:
        return {}
    conn.shm = region
    if region.reads is not None:
        loop = asyncio.get_running_loop()
        region.reads.on_lost = lambda exc: loop.call_soon(conn.fail, exc)  # after the send loop's turn
        region.reads.on_full = functools.partial(_reads_through_the_socket, conn.host)
        region.reads.later = loop.call_later
    features = [SHM, SHM_READ] if read_slots else [SHM]
    return {"features": features, "shm": region.offer()}


def _reads_through_the_socket(peer: str, reason: str) -> None:
    event(log, "reads through the socket", logging.WARNING, peer=peer, reason=reason)


def _peer_uid(conn: DaemonLink) -> int | None:
    cred = _peer_credentials(conn.transport.get_extra_info("socket") if conn.transport is not None else None)
    return None if cred is None else cred[1]


def dialled(conn: DaemonLink, info: dict[str, Any]) -> None:
    """This daemon's dial is through the handshake (HelloAck): the connection is ready."""
    if info.get("node") not in (None, conn.dialed):
        event(log, "peer name differs", logging.WARNING, dialed=conn.dialed, says=info.get("node"))
    conn.ready.set_result(None)


def refused(conn: DaemonLink, exc: ShuffledError) -> None:
    """The other side ended the handshake with an error: a dial of this daemon's refused (counted), or a
    stranger going away (what it sends is not this daemon's error)."""
    if conn.dialed is not None:
        conn.count_error(exc)
    if isinstance(exc, AuthFailed):  # the other side found our proof (or its lack) wrong
        conn.log_auth_failed(f"the other side says: {exc.message[:200]}")
    conn.ready.set_exception(exc)
    conn.ready.exception()  # retrieved: a dialer's caller sees it through the peer manager
    conn.close(f"handshake refused: {exc.message[:200]}")
