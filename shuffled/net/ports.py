"""Where a connection arrived (or, dialled by this daemon, where it went): admission lets each role in
only where the TLS settings say it must come."""

from __future__ import annotations

from enum import Enum


class Port(Enum):
    """The value is how errors name it."""

    TCP = "the plain port"
    UNIX = "the Unix socket"
    PEER_TLS = "the peer TLS port"
    CLIENT_TLS = "the client TLS port"
