"""The admin operations a client may ask of its daemon (PROTOCOL.md §13): what Spark's driver does when a
shuffle or an application ends, a flush at the end of a map stage, the stats, and a drain."""

from __future__ import annotations

import asyncio
from typing import Any

from .session import Session


class AdminCalls:
    """The admin calls of an `AsyncClient`, sent over its session in the order they are made."""

    session: Session

    async def unregister_shuffle(self, app: str, shuffle: int, propagate: bool = True) -> dict[str, Any]:
        return await self.session.admin_request(
            "unregister_shuffle", {"app": app, "shuffle": shuffle, "propagate": propagate}
        )

    async def remove_application(self, app: str, propagate: bool = True) -> dict[str, Any]:
        return await self.session.admin_request("remove_application", {"app": app, "propagate": propagate})

    async def flush(self, app: str, shuffle: int | None = None) -> dict[str, Any]:
        """Write the daemon's in-memory data of a shuffle (or of every shuffle of `app`) to its disk.

        Call it when a map stage is complete: the memory is then free for the next
        stage, and the data survives a daemon restart. Needs a daemon with --data-dir.
        """
        args: dict[str, Any] = {"app": app} if shuffle is None else {"app": app, "shuffle": shuffle}
        return await self.session.admin_request("flush", args)

    async def stats(self) -> dict[str, Any]:
        return await self.session.admin_request("stats", {})

    async def pool(self) -> dict[str, Any]:
        """The pool's segments in use and in all, the daemon's peers, whether it has an object store: the cheap
        part of `stats`, for a writer deciding whether its data is worth compressing."""
        return await self.session.admin_request("pool", {})

    async def drain_challenge(self, nonce: str) -> dict[str, Any]:
        """The daemon's proof that it has the peer secret, over `nonce` (fresh, `protocol.auth.new_nonce()`),
        naming itself and the address it sees this client at (PROTOCOL.md §13): check it before `drain`,
        whose proof is made over the daemon's nonce in the answer."""
        return await self.session.admin_request("drain_challenge", {"nonce": nonce})

    def drain(
        self, handoff: bool = True, timeout: int | None = None, proof: str | None = None, wait: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        """Ask the daemon to stop after its drain (PROTOCOL.md §13); sent at once, so requests made after it
        are handled after it. Its answer: the drain's state, or with `wait` how the drain ended, once it has
        (`stats()["drain"]` follows it meanwhile). `handoff` copies committed data to other daemons first;
        `timeout` (whole seconds) replaces the daemon's drain-timeout. With authentication on, the daemon
        wants `proof`: `protocol.auth.drain_proof` over the nonces of the `drain_challenge` just answered on
        this connection and these arguments.
        """
        args: dict[str, Any] = {"handoff": handoff}
        if timeout is not None:
            args["timeout"] = timeout
        if proof is not None:
            args["proof"] = proof
        if wait:
            args["wait"] = True
        return self.session.admin_request("drain", args)
