"""Exactly one TCP connection per pair of daemons, shared by every stream both ways.

A daemon is named by its advertised address ("host:port", the same string readers
put in a request's locations). Either side may dial when it first needs the
other. When both dial at once, the connection dialled by the daemon with the
smaller name wins: the larger one's dial is refused with DUPLICATE_CONNECTION and
it adopts the connection that arrives from the smaller one.

A daemon that could not be dialled is not dialled again for a peer timeout (or until
it connects to us): every read that names a dead host would otherwise wait a whole
connect timeout before failing over to a copy.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from ...config import DaemonConfig
from ...logs import event
from ...protocol.errors import DuplicateConnection, InvalidRequest, PeerUnavailable, ShuffledError
from .membership import Membership

log = logging.getLogger(__name__)


class PeerConnection(Protocol):
    """A connection to another daemon, as the manager sees it (the daemon's connections are these)."""

    @property
    def is_open(self) -> bool: ...

    @property
    def dialed(self) -> str | None:
        """The peer's address when this daemon dialled it; None when the peer dialled us."""

    def close(self, reason: str = "closed") -> None: ...


C = TypeVar("C", bound=PeerConnection)


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


class PeerManager(Generic[C]):
    """The daemon's connections to other daemons (see the module): `dial` makes one to daemon `addr` at
    `host`:`port` once its handshake is done; `secret` is set when authentication is on."""

    def __init__(
        self,
        config: DaemonConfig,
        membership: Membership,
        secret: bytes | None,
        dial: Callable[[str, str, int], Awaitable[C]],
    ) -> None:
        self.config = config
        self.membership = membership
        self.secret = secret
        self.dial = dial
        self.conns: dict[str, C] = {}
        self._dialing: dict[str, asyncio.Task[C]] = {}
        self._arrival: dict[str, asyncio.Future[C]] = {}
        #: daemons that proved themselves by connecting to us
        self.known: set[str] = set()
        #: daemon -> (loop time until which it is not dialled again, why its last dial failed)
        self._unreachable: dict[str, tuple[float, PeerUnavailable]] = {}

    async def get(self, addr: str) -> C:
        if addr == self.membership.node:
            raise InvalidRequest("a daemon does not connect to itself")
        conn = self.conns.get(addr)
        if conn is not None and conn.is_open:
            return conn
        self._check_dialable(addr)
        failed = self._unreachable.get(addr)
        if failed is not None:
            if asyncio.get_running_loop().time() < failed[0]:
                raise PeerUnavailable(f"{failed[1].message} (not dialled again yet)")
            del self._unreachable[addr]
        task = self._dialing.get(addr)
        if task is None:
            task = self._dialing[addr] = asyncio.create_task(self._dial(addr))
        return await asyncio.shield(task)

    async def _dial(self, addr: str) -> C:
        try:
            return await self._connect(addr)
        except PeerUnavailable as exc:
            cfg = self.config
            pause = cfg.peer_timeout or cfg.connect_timeout
            self._unreachable[addr] = (asyncio.get_running_loop().time() + pause, exc)
            raise

    async def _connect(self, addr: str) -> C:
        cfg = self.config
        loop = asyncio.get_running_loop()
        try:
            host, port = split_address(addr)
            try:
                conn = await self.dial(addr, host, port)
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

    def accept(self, node: str, conn: C) -> None:
        """An inbound Hello from daemon `node`; raises DuplicateConnection if ours wins."""
        existing = self.conns.get(node)
        if node > self.membership.node and (
            node in self._dialing or (existing is not None and existing.is_open and existing.dialed is not None)
        ):
            raise DuplicateConnection(f"{self.membership.node} already dials {node}; use that connection")
        self._register(node, conn)

    def _check_dialable(self, addr: str) -> None:
        """With authentication on, a client may not make this daemon connect anywhere it likes (a port scan,
        bytes sent to an internal service): only to the daemons it knows of (`--peers`, `--peers-dns`), to
        daemons that connected to it, and to its own port on other hosts (every daemon of a cluster normally
        listens on the same one)."""
        node = self.membership.node
        if self.secret is None or self.membership.knows(addr) or addr in self.known:
            return
        _, port = split_address(addr)
        own = split_address(node)[1] if node else self.config.port
        if port != own:
            raise PeerUnavailable(
                f"{addr} is not a known daemon: with authentication on, this daemon relays only to its peers "
                f"(--peers, --peers-dns), to daemons that connected to it, and to port {own} on other hosts"
            )

    def _register(self, node: str, conn: C) -> None:
        old = self.conns.get(node)
        if old is not None and old is not conn and old.is_open:
            old.close("superseded by a newer connection from the same daemon")
        self.conns[node] = conn
        self._unreachable.pop(node, None)
        if conn.dialed is None:
            self.known.add(node)
        fut = self._arrival.pop(node, None)
        if fut is not None and not fut.done():
            fut.set_result(conn)
        event(log, "peer connected", node=node, direction="out" if conn.dialed else "in")

    def lost(self, node: str, conn: C) -> None:
        if self.conns.get(node) is conn:
            del self.conns[node]

    def count(self) -> int:
        return sum(1 for c in self.conns.values() if c.is_open)
