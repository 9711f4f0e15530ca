"""Whom the daemon trusts and how each side proves itself: the secrets (from their files or the
environment) and the TLS contexts its settings name. Admission (admission.py) checks connections
against them, and the admin `drain` its proofs."""

from __future__ import annotations

import os
import ssl
from typing import NamedTuple

from ...config import PEER_SECRET_ENV, SECRET_ENV, ConfigError, DaemonConfig
from ...net.tls import client_acceptor, peer_contexts
from ...protocol.auth import read_secret_file, secret_bytes


class Trust(NamedTuple):
    """Whom the daemon trusts and how each side proves itself; a secret of None: authentication is off."""

    #: the cluster secret every client proves on connect
    secret: bytes | None
    #: what a peer daemon proves: a secret applications do not have (with peer TLS, whose certificates
    #: prove a daemon, the cluster secret will do)
    peer_secret: bytes | None
    #: what the admin `drain` must be proved with: the peer secret as configured, never the cluster
    #: secret standing in for it (every application has that one)
    drain_secret: bytes | None
    #: TLS contexts for peer connections (accepting, dialling); None: peers use the plain port
    peer_tls: tuple[ssl.SSLContext, ssl.SSLContext] | None
    #: the accepting context of the client TLS port; None: TCP clients use the plain port
    client_tls: ssl.SSLContext | None

    @classmethod
    def load(cls, config: DaemonConfig) -> Trust:
        """The secrets (from their files or the environment) and certificates the settings name."""
        secret = _secret("secret-file", config.secret_file, SECRET_ENV)
        drain_secret = _secret("peer-secret-file", config.peer_secret_file, PEER_SECRET_ENV)
        peer_secret = secret if drain_secret is None and config.peer_tls_port else drain_secret
        if secret is not None and peer_secret is None:
            raise ConfigError(
                "secret-file is set but peer daemons would prove only that secret, which every application "
                "has, so a client could pass for a daemon: set peer-secret-file (a secret only daemons have) "
                "or peer TLS"
            )
        peer_tls = None
        if config.peer_tls_port:
            assert config.peer_tls_cert and config.peer_tls_key and config.peer_tls_ca  # validate() checked
            try:
                peer_tls = peer_contexts(config.peer_tls_cert, config.peer_tls_key, config.peer_tls_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"peer TLS certificates: {exc}") from None
        client_tls = None
        if config.client_tls_port:
            assert config.client_tls_cert and config.client_tls_key  # validate() checked
            try:
                client_tls = client_acceptor(config.client_tls_cert, config.client_tls_key, config.client_tls_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"client TLS certificates: {exc}") from None
        return cls(secret, peer_secret, drain_secret, peer_tls, client_tls)


def _secret(name: str, secret_file: str | None, env: str) -> bytes | None:
    """A secret from its file setting or its environment variable (one of them, not both)."""
    from_env = os.environ.get(env)
    if secret_file and from_env is not None:
        raise ConfigError(f"both {name} and {env} are set: use one")
    try:
        if secret_file:
            return read_secret_file(secret_file)
        return secret_bytes(from_env) if from_env is not None else None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{name} {secret_file}: {exc}" if secret_file else f"{env}: {exc}") from None
