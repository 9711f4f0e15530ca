"""TLS (stdlib `ssl`) between daemons, and between clients and their daemon over TCP.

Peers get their own port, with mutual authentication from one CA, so that a daemon can refuse any peer
that arrives without TLS. Clients over TCP get a port of their own too: the daemon always shows its
certificate there and asks for the client's only when the operator names a CA for them, because the
application secrets already prove who a client is. The Unix socket stays plain: it never leaves the host.
"""

from __future__ import annotations

import ssl


def _strict(ctx: ssl.SSLContext) -> ssl.SSLContext:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def peer_contexts(cert: str, key: str, ca: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(acceptor, dialer) contexts: both present `cert` and require the other side's certificate from `ca`."""
    server = _strict(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca))
    server.verify_mode = ssl.CERT_REQUIRED
    client = dialer_context(ca, cert, key)
    server.load_cert_chain(cert, key)
    return server, client


def client_acceptor(cert: str, key: str, ca: str | None) -> ssl.SSLContext:
    """The daemon's side of the client TLS port: shows `cert`; with `ca`, requires a client certificate from it."""
    server = _strict(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca))
    server.verify_mode = ssl.CERT_REQUIRED if ca else ssl.CERT_NONE
    server.load_cert_chain(cert, key)
    return server


def dialer_context(ca: str | None = None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A context that checks the daemon's certificate against `ca` (None: the system's CAs) and its host
    name, and shows `cert` when the daemon asks for one."""
    ctx = _strict(ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca))
    if cert:
        ctx.load_cert_chain(cert, key)
    elif key:
        raise ValueError("a TLS key needs its certificate")
    return ctx
