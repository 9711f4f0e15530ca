"""Exactly one TCP connection per pair of daemons, shared by every stream both ways.

A daemon is named by its advertised address ("host:port", the same string readers
put in a request's locations). Either side may dial when it first needs the
other. When both dial at once, the connection dialled by the daemon with the
smaller name wins: the larger one's dial is refused with DUPLICATE_CONNECTION and
it adopts the connection that arrives from the smaller one.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import TYPE_CHECKING

from ..logs import event
from ..protocol.errors import DuplicateConnection, InvalidRequest, PeerUnavailable, ShuffledError

if TYPE_CHECKING:
    from .connection import DaemonConnection
    from .daemon import Daemon

log = logging.getLogger("shuffled.peers")


def split_address(addr: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' → (host, port); a daemon that cannot be named cannot be reached
    (PROTOCOL.md §10.3: `PEER_UNAVAILABLE`), checked before any resolver sees the name."""
    host, sep, port = addr.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not _valid_host(host):
        raise PeerUnavailable(f"daemon address {addr[:300]!r} is not host:port")
    return host, int(port)


def _valid_host(host: str) -> bool:
    """An IP address, or a DNS name whose labels fit (at most 63 bytes each, 253 in all)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        encoded = host.encode("idna")
    except UnicodeError:  # a label longer than 63 characters, an empty label, ...
        return False
    return 0 < len(encoded) <= 253 and all(0 < len(label) <= 63 for label in encoded.rstrip(b".").split(b"."))


class PeerManager:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.conns: dict[str, DaemonConnection] = {}
        self._dialing: dict[str, asyncio.Task[DaemonConnection]] = {}
        self._arrival: dict[str, asyncio.Future[DaemonConnection]] = {}
        #: daemons that proved themselves by connecting to us
        self.known: set[str] = set()

    async def get(self, addr: str) -> DaemonConnection:
        if addr == self.daemon.node:
            raise InvalidRequest("a daemon does not connect to itself")
        conn = self.conns.get(addr)
        if conn is not None and conn.is_open:
            return conn
        self._check_dialable(addr)
        task = self._dialing.get(addr)
        if task is None:
            task = self._dialing[addr] = asyncio.create_task(self._dial(addr))
        return await asyncio.shield(task)

    async def _dial(self, addr: str) -> DaemonConnection:
        from .connection import DaemonConnection

        cfg = self.daemon.config
        loop = asyncio.get_running_loop()
        try:
            host, port = split_address(addr)
            tls = self.daemon.peer_tls[1] if self.daemon.peer_tls is not None else None
            try:
                _, conn = await asyncio.wait_for(
                    loop.create_connection(
                        lambda: DaemonConnection(self.daemon, dialed=addr, tls=tls is not None),
                        host,
                        cfg.peer_tls_port if tls is not None else port,
                        ssl=tls,
                        server_hostname=host if tls is not None else None,
                    ),
                    cfg.connect_timeout,
                )
                try:
                    await asyncio.wait_for(asyncio.shield(conn.ready), cfg.connect_timeout)
                except BaseException:
                    conn.close("handshake did not complete")
                    raise
            except DuplicateConnection:
                # The peer dialled us too and its connection wins: use it once it is here.
                won = self.conns.get(addr)
                if won is not None and won.is_open:
                    return won
                fut = self._arrival.setdefault(addr, loop.create_future())
                try:
                    return await asyncio.wait_for(asyncio.shield(fut), cfg.connect_timeout)
                except TimeoutError:
                    raise PeerUnavailable(f"daemon {addr} dialled us but its connection never arrived") from None
            except (TimeoutError, OSError) as exc:
                raise PeerUnavailable(f"cannot reach daemon {addr}: {exc or 'timed out'}") from None
            except ShuffledError as exc:
                raise PeerUnavailable(f"daemon {addr} refused the connection: {exc.message}") from None
            self._register(addr, conn)
            return conn
        finally:
            self._dialing.pop(addr, None)

    def accept(self, node: str, conn: DaemonConnection) -> None:
        """An inbound Hello from daemon `node`; raises DuplicateConnection if ours wins."""
        existing = self.conns.get(node)
        if node > self.daemon.node and (
            node in self._dialing or (existing is not None and existing.is_open and existing.dialed is not None)
        ):
            raise DuplicateConnection(f"{self.daemon.node} already dials {node}; use that connection")
        self._register(node, conn)

    def _check_dialable(self, addr: str) -> None:
        """With authentication on, a client may not make this daemon connect anywhere it likes (a port scan,
        bytes sent to an internal service): only to its `--peers`, to daemons that connected to it, and to
        its own port on other hosts (every daemon of a cluster normally listens on the same one)."""
        daemon = self.daemon
        if daemon.secret is None or addr in daemon.config.peers or addr in self.known:
            return
        _, port = split_address(addr)
        own = split_address(daemon.node)[1] if daemon.node else daemon.config.port
        if port != own:
            raise PeerUnavailable(
                f"{addr} is not a known daemon: with authentication on, this daemon relays only to its peers "
                f"(--peers), to daemons that connected to it, and to port {own} on other hosts"
            )

    def _register(self, node: str, conn: DaemonConnection) -> None:
        old = self.conns.get(node)
        if old is not None and old is not conn and old.is_open:
            old.close("superseded by a newer connection from the same daemon")
        self.conns[node] = conn
        if conn.dialed is None:
            self.known.add(node)
        fut = self._arrival.pop(node, None)
        if fut is not None and not fut.done():
            fut.set_result(conn)
        event(log, "peer connected", node=node, direction="out" if conn.dialed else "in")

    def lost(self, node: str, conn: DaemonConnection) -> None:
        if self.conns.get(node) is conn:
            del self.conns[node]

    def count(self) -> int:
        return sum(1 for c in self.conns.values() if c.is_open)
