"""A daemon that could not be dialled fails the next `get` at once for about a peer timeout, so reads that
name a dead host fail over without each waiting a connect timeout; a connection it makes to us ends that."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from shuffled.config import DaemonConfig
from shuffled.protocol.errors import PeerUnavailable
from shuffled.server.cluster.membership import Membership
from shuffled.server.cluster.peers import PeerManager
from tests.aio import within

DEAD = "127.0.0.9:7000"


@dataclass
class Conn:
    dialed: str | None = None
    is_open: bool = True

    def close(self, reason: str = "closed") -> None:
        self.is_open = False


@dataclass
class Host:
    config: DaemonConfig
    node: str = "127.0.0.1:7000"
    secret: bytes | None = None
    dials: list[str] = field(default_factory=list)

    @property
    def membership(self) -> Membership:
        return self._membership

    def __post_init__(self) -> None:
        self._membership = Membership(self.config, self.node)

    async def dial_peer(self, addr: str, host: str, port: int) -> Conn:
        self.dials.append(addr)
        raise ConnectionRefusedError("refused")


@within(10)
async def test_a_failed_dial_is_not_repeated_within_the_peer_timeout() -> None:
    host = Host(DaemonConfig(peer_timeout=0.2))
    peers: PeerManager[Conn] = PeerManager(host.config, host.membership, host.secret, host.dial_peer)
    with pytest.raises(PeerUnavailable, match="refused"):
        await peers.get(DEAD)
    with pytest.raises(PeerUnavailable, match="not dialled again yet"):
        await peers.get(DEAD)
    assert host.dials == [DEAD]
    # The pause lasts about the peer timeout; once it is over the daemon is dialled again.
    until, why = peers._unreachable[DEAD]
    # (uvloop's clock moves per loop iteration, in milliseconds: it may read the time the pause was set)
    assert 0.1 < until - asyncio.get_running_loop().time() <= 0.2 + 1e-9
    peers._unreachable[DEAD] = (0.0, why)
    with pytest.raises(PeerUnavailable, match="refused"):
        await peers.get(DEAD)
    assert host.dials == [DEAD, DEAD]
    # A connection from the daemon itself ends the pause at once.
    inbound = Conn()
    peers.accept(DEAD, inbound)
    assert await peers.get(DEAD) is inbound


@within(10)
async def test_with_authentication_a_daemon_dials_on_other_ports_only_the_daemons_it_knows_of() -> None:
    """`peers` and what `peers-dns` resolved to are known; another port on some host is not."""

    host = Host(DaemonConfig(peers=["127.0.0.8:7001"], peers_dns="shuffled-peers:7002"), secret=b"s")
    host.membership.resolved = ["127.0.0.9:7002"]
    peers: PeerManager[Conn] = PeerManager(host.config, host.membership, host.secret, host.dial_peer)
    for known in ("127.0.0.8:7001", "127.0.0.9:7002", "127.0.0.10:7000"):  # the last: the daemon's own port
        with pytest.raises(PeerUnavailable, match="refused"):
            await peers.get(known)
    with pytest.raises(PeerUnavailable, match="not a known daemon"):
        await peers.get("127.0.0.10:7002")
    assert host.dials == ["127.0.0.8:7001", "127.0.0.9:7002", "127.0.0.10:7000"]
