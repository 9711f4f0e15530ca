"""TLS between daemons (stdlib `ssl`): mutual authentication with certificates from one CA.

Peers get their own port so that clients (which talk to the daemon on their own
host, often over a Unix socket) keep the plain protocol, and a daemon can refuse
any peer that arrives without TLS.
"""

from __future__ import annotations

import ssl


def peer_contexts(cert: str, key: str, ca: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(acceptor, dialer) contexts: both present `cert` and require the other side's certificate from `ca`."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)  # checks the host name too
    for ctx in (server, client):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(cert, key)
    return server, client
