"""The daemon as its connections see it.

Generic in the connection type, so that this module (and everything the
connection imports) never imports the connection itself: `Daemon` is a
`Host[DaemonConnection]`.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Protocol, TypeVar

from .admin_service import Caller
from .peers import PeerConnection, PeerManager
from .services import Services

C = TypeVar("C", bound=PeerConnection)


class Host(Services, Protocol[C]):
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
    def draining(self) -> bool: ...

    @property
    def closing(self) -> bool: ...

    @property
    def connections(self) -> set[C]: ...

    @property
    def peers(self) -> PeerManager[C]: ...

    @property
    def background(self) -> set[asyncio.Task[Any]]: ...

    async def admin(self, op: str, args: dict[str, Any], caller: Caller) -> dict[str, Any]: ...
