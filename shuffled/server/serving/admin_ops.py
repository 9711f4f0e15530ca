"""The admin operations a daemon answers (PROTOCOL.md §13): each one's typed arguments, who may ask
it, and what it does.

`OPERATIONS` is the registry the admin service dispatches through. Who may ask comes first: a
`peer_only` operation is refused to clients (a peer daemon proved the peer secret, which
applications do not have); the others check the token of an `app` they name (not `stats` and `pool`,
which read no application's data). `drain_challenge` is answered only by a daemon with a peer secret
of its own, and `drain` must then carry a proof made with it over the last challenge answered on
its connection and over its arguments, good for one try. Then the arguments are read into the
operation's typed value (INVALID_REQUEST saying what is wrong), and the operation runs with the
daemon's parts (the `ShuffleEnvironment`) and the connection it came over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ...logs import event
from ...protocol.auth import (
    check_nonce,
    drain_challenge_proof,
    drain_proof,
    new_nonce,
    proof_matches,
    token_digest,
)
from ...protocol.errors import AuthFailed, InvalidRequest, ShuffledError
from ..cluster.replication import PeerLink
from .environment import ShuffleEnvironment
from .link import DaemonLink

log = logging.getLogger(__name__)

A = TypeVar("A")


#: the daemon's parts, as the admin operations use them; any connection type will do
Host = ShuffleEnvironment[Any]


@dataclass(frozen=True, slots=True)
class Operation(Generic[A]):
    """One admin operation: how its arguments are read, what it does, and who may ask it."""

    name: str
    #: (operation name, wire arguments) -> the typed arguments, or InvalidRequest
    read: Callable[[str, dict[str, Any]], A]
    run: Callable[[Host, A, DaemonLink], Awaitable[dict[str, Any]]]
    #: asked by peer daemons only, never by clients
    peer_only: bool = False
    #: an `app` it names must come with that application's token
    app_token: bool = True
    #: answered only by a daemon with a peer secret of its own (`drain_challenge`)
    challenge: bool = False
    #: with authentication on, carries a proof made with the peer secret over the last challenge answered
    #: on its connection and over its arguments (`drain`)
    proof: bool = False

    async def call(self, host: Host, args: dict[str, Any], caller: DaemonLink) -> dict[str, Any]:
        """Run with `args` as they came over `caller` (the asker passed the admin service's checks)."""
        secret = drain_secret(host) if self.challenge or self.proof else None
        if self.challenge and secret is None:
            raise InvalidRequest("this daemon has no peer secret: drain needs no proof here")
        challenge = None
        if self.proof and secret is not None:
            challenge, caller.drain_challenge = caller.drain_challenge, None  # good for one try, whatever follows
        value = self.read(self.name, args)
        if self.proof and secret is not None:
            assert isinstance(value, DrainArgs)
            check_drain_proof(secret, challenge, value, args.get("proof"))
        return await self.run(host, value, caller)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- typed arguments


@dataclass(frozen=True, slots=True)
class NoArgs:
    @classmethod
    def read(cls, op: str, args: dict[str, Any]) -> NoArgs:
        return cls()


@dataclass(frozen=True, slots=True)
class Scope:
    """What `unregister_shuffle`, `remove_application` and `flush` act on: an application, or one shuffle of it."""

    app: str
    shuffle: int | None = None
    #: tell every other daemon too (they are asked with `propagate` off)
    propagate: bool = False
    #: the application token it came with, passed on when propagated
    token: str | None = None

    @classmethod
    def read(cls, op: str, args: dict[str, Any]) -> Scope:
        """An application, or one shuffle of it when `shuffle` is given."""
        app = args.get("app")
        if not isinstance(app, str) or not app:
            raise InvalidRequest(f"{op} needs 'app'")
        shuffle = args.get("shuffle")
        if shuffle is not None and not _integer(shuffle):
            raise InvalidRequest(f"{op} needs an integer 'shuffle'")
        token = args.get("token")
        return cls(app, shuffle, bool(args.get("propagate")), token if isinstance(token, str) else None)

    @classmethod
    def read_shuffle(cls, op: str, args: dict[str, Any]) -> Scope:
        """One shuffle of an application."""
        scope = cls.read(op, args)
        if scope.shuffle is None:
            raise InvalidRequest(f"{op} needs an integer 'shuffle'")
        return scope

    def to_wire(self) -> dict[str, Any]:
        """The arguments as another daemon is asked them: not propagated again."""
        args: dict[str, Any] = {"app": self.app}
        if self.shuffle is not None:
            args["shuffle"] = self.shuffle
        args["propagate"] = False
        if self.token is not None:
            args["token"] = self.token
        return args


@dataclass(frozen=True, slots=True)
class Holds:
    """Which of these attempts of a shuffle are committed here."""

    app: str
    shuffle: int
    attempts: list[int]

    @classmethod
    def read(cls, op: str, args: dict[str, Any]) -> Holds:
        app, shuffle, attempts = args.get("app"), args.get("shuffle"), args.get("attempts")
        if not isinstance(app, str) or not _integer(shuffle):
            raise InvalidRequest("holds needs 'app' and an integer 'shuffle'")
        if not isinstance(attempts, list) or not all(_integer(a) for a in attempts):
            raise InvalidRequest("holds needs 'attempts', a list of attempt ids")
        assert isinstance(shuffle, int)
        return cls(app, shuffle, attempts)


@dataclass(frozen=True, slots=True)
class DrainArgs:
    handoff: bool = True
    #: whole seconds; None: the daemon's `drain-timeout`
    timeout: int | None = None
    #: answer once the drain has ended, with its `drain` stats, rather than at once
    wait: bool = False

    @classmethod
    def read(cls, op: str, args: dict[str, Any]) -> DrainArgs:
        handoff, timeout, wait = args.get("handoff", True), args.get("timeout"), args.get("wait", False)
        if not isinstance(handoff, bool) or not isinstance(wait, bool):
            raise InvalidRequest("drain 'handoff' and 'wait' must be booleans")
        if timeout is not None and (not _integer(timeout) or timeout < 0):
            raise InvalidRequest("drain 'timeout' must be whole seconds >= 0")
        return cls(handoff, timeout, wait)


@dataclass(frozen=True, slots=True)
class Challenge:
    """A `drain_challenge`: the caller's fresh nonce."""

    nonce: str

    @classmethod
    def read(cls, op: str, args: dict[str, Any]) -> Challenge:
        return cls(check_nonce(args.get("nonce"), op))


# -- what they do


async def _stats(host: Host, _: NoArgs, caller: DaemonLink) -> dict[str, Any]:
    return host.stats().to_wire()


async def _pool(host: Host, _: NoArgs, caller: DaemonLink) -> dict[str, Any]:
    """What a writer weighs before it compresses (the Spark plugin asks before each map output, at most every
    100 ms): in constant time, where `stats` walks every map output held."""
    return {
        "used": host.pool.used,
        "total": host.pool.total,
        "peers": len(host.membership.others()),
        "object_store": bool(host.config.object_store),
    }


async def _ping(host: Host, _: NoArgs, caller: DaemonLink) -> dict[str, Any]:
    """A peer checking that this daemon still answers (see serving/watchdog.py)."""
    return {}


async def _applications(host: Host, _: NoArgs, caller: DaemonLink) -> dict[str, Any]:
    """The applications this daemon holds data of: a daemon sweeping the object store keeps their objects
    (cluster/sweep.py). While it is still restoring what its own objects prove it says so, and that answer
    counts as none."""
    return {"apps": host.storage.held.applications(), "restoring": host.storage.restoring}


async def _holds(host: Host, args: Holds, caller: DaemonLink) -> dict[str, Any]:
    """How a draining daemon counts the copies of its data on other daemons (cluster/handover.py)."""
    held, sizes = host.storage.held.holds(args.app, args.shuffle, args.attempts)
    return {"attempts": held, "bytes": sizes}


def drain_secret(host: Host) -> bytes | None:
    """What `drain` is proved with: the peer secret; None with authentication off. With authentication on,
    only peer-secret holders may stop a daemon: applications have the cluster secret, not that one."""
    trust = host.trust
    if trust.drain_secret is None and trust.secret is not None:
        raise AuthFailed(
            "drain needs a proof made with the peer secret, and this daemon has none of its own (peer TLS "
            "stands in for it): set peer-secret-file, or stop it with SIGTERM"
        )
    return trust.drain_secret


def check_drain_proof(secret: bytes, challenge: tuple[str, str] | None, args: DrainArgs, proof: object) -> None:
    """A proof over the last `drain_challenge` answered on the connection and these arguments: one
    captured anywhere else is worth nothing."""
    expected = drain_proof(secret, *challenge, args.handoff, args.timeout) if challenge is not None else ""
    if not expected or not isinstance(proof, str) or not proof_matches(expected, proof):
        raise AuthFailed(
            "drain needs a proof made with the peer secret, for these arguments, over the drain_challenge "
            "answered last on this connection (shuffled drain --peer-secret-file)"
        )


async def _drain_challenge(host: Host, args: Challenge, caller: DaemonLink) -> dict[str, Any]:
    """Prove the peer secret over the caller's fresh nonce (and name the address the caller is seen at)
    before it sends a proof of its own, with a nonce of this daemon's that the next `drain` on this
    connection must be proved over (PROTOCOL.md §13)."""
    secret = host.trust.drain_secret
    assert secret is not None  # Operation.call checked
    ours = new_nonce()
    caller.drain_challenge = (args.nonce, ours)
    proof = drain_challenge_proof(secret, args.nonce, ours, host.node, caller.peer)
    return {"nonce": ours, "node": host.node, "client": caller.peer, "proof": proof}


async def _drain(host: Host, args: DrainArgs, caller: DaemonLink) -> dict[str, Any]:
    """Answered at once, the drain goes on after (stats `drain` shows it); with `wait`, answered once it
    has ended, with how it ended (how `shuffled drain --wait` learns whether the hand-over left anything)."""
    seconds = host.config.drain_timeout if args.timeout is None else args.timeout
    if host.drain.task is None:
        event(log, "drain requested", timeout_s=seconds, handoff=args.handoff)
    host.drain.start(seconds, args.handoff)
    if args.wait:
        return await host.drain.result()
    return {"state": host.drain.stats.state}


async def _flush(host: Host, args: Scope, caller: DaemonLink) -> dict[str, Any]:
    """Write a finished map stage's data to disk so the next stage gets the memory (and a restart keeps it);
    without a data dir, make it durable in the object store (storage/lifecycle.py)."""
    return await host.storage.flush(args.app, args.shuffle)


async def _unregister_shuffle(host: Host, args: Scope, caller: DaemonLink) -> dict[str, Any]:
    assert args.shuffle is not None  # read_shuffle() checked
    return await _dropped(host, "unregister_shuffle", args, await host.storage.drop(args.app, args.shuffle))


async def _remove_application(host: Host, args: Scope, caller: DaemonLink) -> dict[str, Any]:
    return await _dropped(host, "remove_application", args, await host.storage.drop(args.app))


async def _dropped(host: Host, op: str, args: Scope, freed: int) -> dict[str, Any]:
    """The drop here is done (its token was checked: `authorize`); with `propagate`, every other daemon is
    told, then every node's objects that this request's token owns are deleted (storage/lifecycle.py)."""
    result: dict[str, Any] = {"freed_segments": freed}
    if args.propagate:
        result["peers"] = await _propagate(host, op, args.to_wire())
        # Every daemon told deleted its own: this takes lost nodes' objects too, those whose footers say they
        # were written for this request's token (whatever the peers said).
        await host.storage.delete_owned(args.app, args.shuffle, token_digest(args.token))
    return result


async def _propagate(host: Host, op: str, args: dict[str, Any]) -> dict[str, str]:
    """Tell every known daemon; a daemon that cannot be reached is reported, not fatal."""
    targets = (set(host.membership.others()) | set(host.peers.conns)) - {host.node}

    async def one(addr: str) -> str:
        try:
            conn: PeerLink = await host.peers.get(addr)
            await conn.admin_call(op, args, host.config.admin_timeout)
            return "ok"
        except ShuffledError as exc:
            return f"{exc.code.name}: {exc.message}"
        except (TimeoutError, ConnectionError) as exc:
            return f"unreachable: {exc or 'timed out'}"

    addrs = sorted(targets)
    results = await asyncio.gather(*(one(a) for a in addrs))
    return dict(zip(addrs, results, strict=True))


OPERATIONS: dict[str, Operation[Any]] = {
    op.name: op
    for op in (
        Operation("stats", NoArgs.read, _stats, app_token=False),
        Operation("pool", NoArgs.read, _pool, app_token=False),
        Operation("ping", NoArgs.read, _ping),
        Operation("holds", Holds.read, _holds, peer_only=True),
        Operation("applications", NoArgs.read, _applications, peer_only=True, app_token=False),
        Operation("drain_challenge", Challenge.read, _drain_challenge, challenge=True),
        Operation("drain", DrainArgs.read, _drain, proof=True),
        Operation("flush", Scope.read, _flush),
        Operation("unregister_shuffle", Scope.read_shuffle, _unregister_shuffle),
        Operation("remove_application", Scope.read, _remove_application),
    )
}
