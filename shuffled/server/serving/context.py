"""The daemon as its connections see it.

Generic in the connection type, so that this module (and everything the
connection imports) never imports the connection itself: `Daemon` is a
`DaemonContext[DaemonConnection]`.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Protocol, TypeVar

from ..cluster.drain import Drain
from ..cluster.peers import PeerConnection, PeerManager
from .admin_ops import Caller, Operation
from .backlog import UnsentBudget
from .environment import ShuffleEnvironment

C = TypeVar("C", bound=PeerConnection)


class DaemonContext(ShuffleEnvironment, Protocol[C]):
    """Its services, who it is, whom it trusts, its other connections and peers, its admin operations."""

    @property
    def node(self) -> str: ...

    @property
    def secret(self) -> bytes | None: ...

    @property
    def peer_secret(self) -> bytes | None: ...

    @property
    def peer_tls(self) -> tuple[ssl.SSLContext, ssl.SSLContext] | None: ...

    @property
    def drain(self) -> Drain: ...

    @property
    def connections(self) -> set[C]: ...

    @property
    def peers(self) -> PeerManager[C]: ...

    @property
    def background(self) -> set[asyncio.Task[Any]]: ...

    @property
    def unsent(self) -> UnsentBudget: ...

    async def admin(self, op: Operation[Any], args: dict[str, Any], caller: Caller) -> dict[str, Any]: ...
