"""Which credentials an application's data belongs to: each application is bound to the digest of the token
its first map output was written with, and every request about it must carry the same."""

from __future__ import annotations

import hmac

from ...protocol.errors import AuthFailed


def is_owner(owner: bytes | None, digest: bytes) -> bool:
    """Whether a request whose token has `digest` (`token_digest`) speaks for the application that data was
    written for, `owner` being the digest that data is bound to (None: nobody knows whose it is).

    The one answer every path that reads or deletes on request gives: a read or drop here (`AppKeys`), a
    propagated drop deleting other nodes' objects (their footers carry their owner). Unknown ownership is
    no one's: such data goes only with its own lifecycle (expiry, the sweep), never on request.
    """
    return owner is not None and hmac.compare_digest(owner, digest)


class AppKeys:
    """Application -> digest of the token it is bound to (b"": bound to requests without one)."""

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}

    def __contains__(self, app: str) -> bool:
        return app in self._keys

    def get(self, app: str) -> bytes | None:
        return self._keys.get(app)

    def authorize(self, app: str, digest: bytes) -> None:
        """Refuse a request about `app` whose token digest (`token_digest`) is not the one the application
        is bound to.

        Whoever asks, a client or a peer daemon: peers forward the client's token with every relayed
        read and propagated removal, and its digest with every replica push, so the daemon that holds
        the data checks it. Trusting a peer instead would let anyone who knows the cluster secret reach
        another application's data through a daemon that relays for it, or by claiming to be a daemon
        itself. A digest is what a replica push can carry: the store keeps no token.
        """
        bound = self._keys.get(app)
        if bound is None:  # nothing of it here to read or drop
            return
        if not is_owner(bound, digest):
            why = "carries no token" if not digest else "carries a different token"
            raise AuthFailed(
                f"application {app} belongs to other credentials: this request {why} (a different app secret?)"
            )

    def bind(self, app: str, digest: bytes) -> None:
        """The first map output of an application binds it to its writer's token digest."""
        self._keys.setdefault(app, digest)

    def forget(self, app: str) -> None:
        """The application was removed: a later one of the same id binds afresh."""
        self._keys.pop(app, None)
