"""The map outputs one client connection pushes: opening them, their data, commit and abort.

Each open map output is a `PushSession`; this service decides whether one may
open (the daemon draining, the application's token, the fair push shares) and
hands it the frames of its stream.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from ..protocol.connection import ProtocolConnection, release_payload
from ..protocol.errors import MapOutputStateError, ShuffledError, ShuttingDown
from ..protocol.frames import OpenMapOutput, PushData
from .pushing import PushSession
from .services import Services
from .shares import Share


class Link(Protocol):
    """The connection the service works over (a `DaemonConnection`)."""

    @property
    def proto(self) -> ProtocolConnection: ...

    @property
    def is_open(self) -> bool: ...

    @property
    def draining(self) -> bool: ...

    def send_error(self, stream: int, exc: ShuffledError) -> None: ...

    def authorize(self, app: str, token: object) -> None: ...


class PushService:
    def __init__(self, link: Link, services: Services) -> None:
        self.link = link
        self.services = services
        self.sessions: dict[int, PushSession] = {}
        #: push window segments this connection's map outputs hold (see shares.py)
        self.push_share = Share()

    # -- the PushConnection view its sessions use

    @property
    def is_open(self) -> bool:
        return self.link.is_open

    @property
    def proto(self) -> ProtocolConnection:
        return self.link.proto

    def send_error(self, stream: int, exc: ShuffledError) -> None:
        self.link.send_error(stream, exc)

    def closed(self, writer: int) -> None:
        self.sessions.pop(writer, None)
        self.link.proto.push_closed(writer)

    # -- frames

    def on_open(self, req: OpenMapOutput) -> None:
        if self.link.draining:
            self.send_error(req.writer, ShuttingDown("the daemon is shutting down; retry with another daemon"))
            return
        store = self.services.store
        try:
            self.link.authorize(req.app, req.token)
            self.services.shares.check(self.push_share, req.app)
            out = store.open_map_output(req.app, req.shuffle, req.map_index, req.attempt, req.partitions)
        except ShuffledError as exc:
            self.send_error(req.writer, exc)
            return
        store.bind(req.app, req.token)
        session = PushSession(self, req, out, self.services)
        self.sessions[req.writer] = session
        self.link.proto.accept_push(req.writer, session.target)
        session.task = asyncio.create_task(session.start())

    def on_data(self, frame: PushData) -> None:
        session = self.sessions.get(frame.writer)
        if session is None:
            release_payload(frame)
            return
        session.on_data(frame)

    def on_commit(self, writer: int, pushes: int) -> None:
        if (session := self._session(writer)) is not None:
            session.commit(pushes)

    def on_abort(self, writer: int) -> None:
        if (session := self._session(writer)) is not None:
            session.abort()

    def _session(self, writer: int) -> PushSession | None:
        """The writer's session, or None after a per-stream error saying why (the connection lives on)."""
        session = self.sessions.get(writer)
        if session is not None and session.pool is None:
            session.fail(MapOutputStateError("commit or abort before the daemon granted push credit"))
            return None
        return session

    def release(self) -> None:
        """The connection is gone: every open map output is aborted."""
        for session in list(self.sessions.values()):
            session.drop()
