"""Challenge-response authentication on Hello, and per-application tokens (proto/PROTOCOL.md §6.1, §6.2).

Both sides contribute a random nonce and each proves it knows the shared secret
with an HMAC-SHA256 over both nonces, under a label saying which side it is: a
proof cannot be replayed on another connection (fresh nonces) nor reflected
back to its sender (different labels), and the secret never travels. Proofs are
compared with `hmac.compare_digest` (constant time).

An application token is an HMAC of the application id under the application's
own secret: a daemon binds an application to the digest of the first token it
sees for it, and refuses requests about that application with another token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from .errors import AuthFailed

_DIALER = b"shuffled-v2 dialer\n"
_ACCEPTOR = b"shuffled-v2 acceptor\n"
_APP = b"shuffled-v2 app\n"
_DRAIN = b"shuffled-v2 drain\n"
_DRAIN_CHALLENGE = b"shuffled-v2 drain challenge\n"
#: hex characters of a nonce we make (16 random bytes); shorter ones from others are refused
NONCE_HEX = 32


def new_nonce() -> str:
    return secrets.token_hex(NONCE_HEX // 2)


def check_nonce(nonce: object, who: str) -> str:
    """A nonce must be a string of at least 32 characters (the spec: 16 random bytes in hex)."""
    if not isinstance(nonce, str) or len(nonce) < NONCE_HEX or len(nonce) > 256:
        raise AuthFailed(f"{who} sent no valid nonce (authentication is required)")
    return nonce


def _proof(secret: bytes, label: bytes, dialer_nonce: str, acceptor_nonce: str) -> str:
    message = label + dialer_nonce.encode() + b"\n" + acceptor_nonce.encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def dialer_proof(secret: bytes, dialer_nonce: str, acceptor_nonce: str) -> str:
    return _proof(secret, _DIALER, dialer_nonce, acceptor_nonce)


def acceptor_proof(secret: bytes, dialer_nonce: str, acceptor_nonce: str) -> str:
    return _proof(secret, _ACCEPTOR, dialer_nonce, acceptor_nonce)


def proof_matches(expected: str, got: str) -> bool:
    return hmac.compare_digest(expected.encode(), got.encode("utf-8", "replace"))


def app_token(app_secret: bytes, app: str) -> str:
    """What a client sends as `token` in requests about `app`: never the secret itself."""
    return hmac.new(app_secret, _APP + app.encode(), hashlib.sha256).hexdigest()


def drain_challenge_proof(peer_secret: bytes, caller_nonce: str, daemon_nonce: str, node: str, caller: str) -> str:
    """What a daemon answers the admin `drain_challenge` with (PROTOCOL.md §13): it has the peer secret, for
    this caller's fresh nonce, is `node`, and sees the caller connect from `caller`. The caller sends its
    own proof only after checking this, so whoever merely answers at the address it drains (with the
    cluster secret, which every application has) learns nothing it could replay, and a relay to another
    daemon shows as an address the caller does not have."""
    message = _DRAIN_CHALLENGE + f"{caller_nonce}\n{daemon_nonce}\n{node}\n{caller}".encode()
    return hmac.new(peer_secret, message, hashlib.sha256).hexdigest()


def drain_proof(peer_secret: bytes, caller_nonce: str, daemon_nonce: str, handoff: bool, timeout: int | None) -> str:
    """What the admin `drain` carries: only peer-secret holders can stop a daemon, the proof is good once,
    for the challenge the daemon answered on this connection, and for these arguments only."""
    args = f"{caller_nonce}\n{daemon_nonce}\n{'true' if handoff else 'false'}\n{'' if timeout is None else timeout}"
    return hmac.new(peer_secret, _DRAIN + args.encode(), hashlib.sha256).hexdigest()


def token_digest(token: str | None) -> bytes:
    """What a daemon keeps for an application: a digest of its token (b"" for requests without one)."""
    return hashlib.sha256(token.encode()).digest() if token else b""


def secret_bytes(secret: str | bytes) -> bytes:
    """A secret as configured (a file's content, a Spark setting): trailing whitespace and newlines do not count."""
    raw = secret.encode() if isinstance(secret, str) else secret
    raw = raw.rstrip()
    if not raw:
        raise ValueError("the secret is empty")
    return raw


def read_secret_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return secret_bytes(f.read())


class DialerAuth:
    """The dialer's half of the handshake: nonce in Hello, answer to AuthChallenge, HelloAck check.

    A dialer with a secret insists that the acceptor proves it too: a daemon that
    does not authenticate could be anyone, and would be handed map output.
    """

    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret
        self.nonce = new_nonce()
        self.challenged = False

    def hello_info(self, info: dict[str, object]) -> dict[str, object]:
        return {**info, "nonce": self.nonce}

    def answer(self, acceptor_nonce: str, acceptor_proof_: str, who: str) -> str:
        """The proof to send in AuthResponse ("" without a secret: the acceptor then refuses us, saying why)."""
        if self.challenged:
            raise AuthFailed(f"{who} sent AuthChallenge twice")
        self.challenged = True
        if self.secret is None:
            return ""
        check_nonce(acceptor_nonce, who)
        if not proof_matches(acceptor_proof(self.secret, self.nonce, acceptor_nonce), acceptor_proof_):
            raise AuthFailed(f"{who} could not prove it has our secret: the secrets differ (or it is not shuffled)")
        return dialer_proof(self.secret, self.nonce, acceptor_nonce)

    def accepted(self, who: str) -> None:
        """HelloAck arrived: fine unless we have a secret and the acceptor never proved its own."""
        if self.secret is not None and not self.challenged:
            raise AuthFailed(f"{who} does not authenticate (it has no secret configured), but this side has one")


class AcceptorAuth:
    """The acceptor's half: AuthChallenge after Hello, then the dialer's AuthResponse must match."""

    def __init__(self, secret: bytes, dialer_nonce: object, who: str) -> None:
        self.secret = secret
        self.dialer_nonce = check_nonce(dialer_nonce, who)
        self.nonce = new_nonce()
        self.who = who

    def challenge(self) -> tuple[str, str]:
        """(nonce, proof) for AuthChallenge."""
        return self.nonce, acceptor_proof(self.secret, self.dialer_nonce, self.nonce)

    def check(self, proof: str | None) -> None:
        """Raises AuthFailed unless `proof` (None: the dialer sent another frame instead) is right."""
        if proof is None:
            raise AuthFailed(f"{self.who} did not authenticate (this daemon requires a secret)")
        if not proof:
            raise AuthFailed(f"{self.who} has no secret configured (this daemon requires one)")
        if not proof_matches(dialer_proof(self.secret, self.dialer_nonce, self.nonce), proof):
            raise AuthFailed(f"{self.who} sent a wrong proof: its secret differs from this daemon's")
