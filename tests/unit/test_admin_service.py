"""The admin service answers every request, whatever its operation does, and runs only what the
registry knows and lets the asker ask.

An unanswered request would hold one of its connection's admin slots for good
(and keep the connection from ever idling out): after `--max-admin-per-connection`
of them, every admin call on it would be refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from shuffled.protocol.codec import decode_all, encode
from shuffled.protocol.connection import Limits, Side
from shuffled.protocol.errors import AuthFailed, ErrorCode, InvalidRequest, ShuffledError
from shuffled.protocol.events import AdminRequested
from shuffled.protocol.frames import AdminRequest, ErrorResponse, Hello, Role
from shuffled.server.serving.admin_ops import OPERATIONS, Operation, Scope
from shuffled.server.serving.admin_service import AdminService
from tests.aio import within
from tests.protocol_pair import MemoryConnection

TIMEOUT = 10.0


class Link:
    """The connection side of the service: a real protocol connection, past its handshake."""

    def __init__(self) -> None:
        self.proto = MemoryConnection(Side.ACCEPTOR, Role.DAEMON, limits=Limits(admin=1))
        self.proto.receive_data(encode(Hello(Role.CLIENT, info={})))
        self.proto.accept({})
        self.proto.data_to_send()
        self.errors: list[ShuffledError] = []
        self.from_client = True  # the Hello above is a client's
        self.peer = "127.0.0.1:40000"
        self.drain_challenge: tuple[str, str] | None = None
        #: a client's connection (a peer daemon's is the other case)
        self.from_client = True
        self.authorized: list[tuple[str, object]] = []

    def count_error(self, exc: ShuffledError) -> None:
        self.errors.append(exc)

    def authorize(self, app: str, token: object) -> None:
        self.authorized.append((app, token))


async def _answer(operation: Any, op: str = "flush", args: dict[str, Any] | None = None) -> tuple[Link, ErrorResponse]:
    """The answer to admin `op` with `args`, the registry's `op` doing what `operation` does once its
    arguments were read."""
    link = Link()
    args = args or {}
    background: set[asyncio.Task[Any]] = set()
    env: Any = SimpleNamespace(background=background, metrics=SimpleNamespace(observe_admin=lambda *_: None))
    caller: Any = link
    service = AdminService(caller, env)
    known = OPERATIONS.get(op)
    if known is not None:
        OPERATIONS[op] = dataclasses.replace(known, run=lambda _host, _value, by: operation(known, args, by))
    try:
        (requested,) = link.proto.receive_data(encode(AdminRequest(7, op, args)))
        assert isinstance(requested, AdminRequested) and link.proto.streams.admin_running == 1
        service.on_request(requested.request)
        await asyncio.wait(background, timeout=TIMEOUT)
    finally:
        if known is not None:
            OPERATIONS[op] = known
    (answer,) = decode_all(link.proto.data_to_send())
    assert isinstance(answer, ErrorResponse) and answer.stream == 7
    return link, answer


@within(30)
async def test_an_operation_that_crashes_is_an_internal_error_and_frees_its_slot() -> None:
    async def crash(op: Operation[Any], args: dict[str, Any], caller: Any) -> dict[str, Any]:
        raise RuntimeError("a bug")

    link, answer = await _answer(crash, "flush", {"app": "a"})
    assert answer.code == ErrorCode.INTERNAL and "RuntimeError: a bug" in answer.message
    assert link.proto.streams.admin_running == 0 and [e.code for e in link.errors] == [ErrorCode.INTERNAL]


@within(30)
async def test_an_operation_cancelled_at_shutdown_says_so_and_frees_its_slot() -> None:
    async def stopped(op: Operation[Any], args: dict[str, Any], caller: Any) -> dict[str, Any]:
        raise asyncio.CancelledError

    link, answer = await _answer(stopped, "flush", {"app": "a"})
    assert answer.code == ErrorCode.SHUTTING_DOWN and link.proto.streams.admin_running == 0


async def _never(op: Operation[Any], args: dict[str, Any], caller: Any) -> dict[str, Any]:
    raise AssertionError(f"{op.name} must not run")


@within(30)
async def test_an_unknown_operation_is_refused_without_running_anything() -> None:
    link, answer = await _answer(_never, "format_disk", {"app": "a", "token": "t"})
    assert answer.code == ErrorCode.INVALID_REQUEST and "unknown admin operation 'format_disk'" in answer.message
    assert link.proto.streams.admin_running == 0 and not link.authorized


@within(30)
async def test_a_peer_only_operation_is_refused_to_a_client() -> None:
    link, answer = await _answer(_never, "holds", {"app": "a", "shuffle": 1, "attempts": [1]})
    assert answer.code == ErrorCode.INVALID_REQUEST and "asked by peer daemons only" in answer.message
    assert not link.authorized, "a peer proved the peer secret: it carries no application token"


@within(30)
async def test_the_token_of_a_named_app_is_checked_except_for_stats() -> None:
    async def done(op: Operation[Any], args: dict[str, Any], caller: Any) -> dict[str, Any]:
        raise InvalidRequest(f"{op.name} ran")

    link, answer = await _answer(done, "unregister_shuffle", {"app": "a", "shuffle": 1, "token": "t"})
    assert link.authorized == [("a", "t")] and "unregister_shuffle ran" in answer.message
    link, answer = await _answer(done, "stats", {"app": "a"})
    assert not link.authorized and "stats ran" in answer.message


@pytest.mark.parametrize(
    ("op", "args", "why"),
    [
        ("unregister_shuffle", {"app": "a"}, "unregister_shuffle needs an integer 'shuffle'"),
        ("unregister_shuffle", {"app": "a", "shuffle": True}, "needs an integer 'shuffle'"),
        ("remove_application", {"app": ""}, "remove_application needs 'app'"),
        ("flush", {"app": "a", "shuffle": "1"}, "flush needs an integer 'shuffle'"),
        ("holds", {"app": "a", "shuffle": 1, "attempts": [1, False]}, "'attempts', a list of attempt ids"),
        ("drain", {"handoff": 1}, "drain 'handoff' and 'wait' must be booleans"),
        ("drain", {"wait": "yes"}, "drain 'handoff' and 'wait' must be booleans"),
        ("drain", {"timeout": -1}, "drain 'timeout' must be whole seconds >= 0"),
    ],
)
def test_arguments_are_read_into_typed_values_or_refused(op: str, args: dict[str, Any], why: str) -> None:
    with pytest.raises(InvalidRequest, match=why):
        OPERATIONS[op].read(op, args)


def test_a_drain_challenge_without_a_real_nonce_is_an_authentication_failure() -> None:
    with pytest.raises(AuthFailed, match="drain_challenge sent no valid nonce"):
        OPERATIONS["drain_challenge"].read("drain_challenge", {"nonce": "short"})


def test_a_propagated_request_is_what_a_client_sends_but_not_propagated_again() -> None:
    scope = Scope.read_shuffle("unregister_shuffle", {"app": "a", "shuffle": 3, "propagate": True, "token": "t"})
    assert scope == Scope("a", 3, True, "t")
    assert list(scope.to_wire().items()) == [("app", "a"), ("shuffle", 3), ("propagate", False), ("token", "t")]
    assert Scope.read("remove_application", {"app": "a"}).to_wire() == {"app": "a", "propagate": False}
