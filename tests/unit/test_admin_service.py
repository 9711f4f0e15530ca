"""The admin service answers every request, whatever its operation does.

An unanswered request would hold one of its connection's admin slots for good
(and keep the connection from ever idling out): after `--max-admin-per-connection`
of them, every admin call on it would be refused.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shuffled.protocol.codec import decode_all, encode
from shuffled.protocol.connection import Limits, ProtocolConnection, Side
from shuffled.protocol.errors import ErrorCode, ShuffledError
from shuffled.protocol.events import AdminRequested
from shuffled.protocol.frames import AdminRequest, ErrorResponse, Hello, Role
from shuffled.server.admin_service import AdminService

TIMEOUT = 10.0


class Link:
    """The connection side of the service: a real protocol connection, past its handshake."""

    def __init__(self) -> None:
        self.proto = ProtocolConnection(Side.ACCEPTOR, Role.DAEMON, limits=Limits(admin=1))
        self.proto.receive_data(encode(Hello(Role.CLIENT, info={})))
        self.proto.accept({})
        self.proto.data_to_send()
        self.errors: list[ShuffledError] = []
        self.peer = "127.0.0.1:40000"
        self.drain_challenge: tuple[str, str] | None = None

    def count_error(self, exc: ShuffledError) -> None:
        self.errors.append(exc)

    def authorize(self, app: str, token: object) -> None:
        pass


async def _answer(operation: Any) -> tuple[Link, ErrorResponse]:
    link = Link()
    background: set[asyncio.Task[Any]] = set()
    service = AdminService(link, operation, background)
    (requested,) = link.proto.receive_data(encode(AdminRequest(7, "flush", {})))
    assert isinstance(requested, AdminRequested) and link.proto.admin_running == 1
    service.on_request(requested.request)
    await asyncio.wait(background, timeout=TIMEOUT)
    (answer,) = decode_all(link.proto.data_to_send())
    assert isinstance(answer, ErrorResponse) and answer.stream == 7
    return link, answer


@pytest.mark.asyncio
async def test_an_operation_that_crashes_is_an_internal_error_and_frees_its_slot() -> None:
    async def crash(op: str, args: dict[str, Any], caller: Any) -> dict[str, Any]:
        raise RuntimeError("a bug")

    link, answer = await _answer(crash)
    assert answer.code == ErrorCode.INTERNAL and "RuntimeError: a bug" in answer.message
    assert link.proto.admin_running == 0 and [e.code for e in link.errors] == [ErrorCode.INTERNAL]


@pytest.mark.asyncio
async def test_an_operation_cancelled_at_shutdown_says_so_and_frees_its_slot() -> None:
    async def stopped(op: str, args: dict[str, Any], caller: Any) -> dict[str, Any]:
        raise asyncio.CancelledError

    link, answer = await _answer(stopped)
    assert answer.code == ErrorCode.SHUTTING_DOWN and link.proto.admin_running == 0
