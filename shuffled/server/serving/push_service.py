"""The map outputs one client connection pushes: opening them, their data, commit and abort.

Each open map output is a `PushSession`; this service decides whether one may
open (the daemon draining, the application's token, the fair push shares) and
hands it the frames of its stream. On a peer connection the pushes are replica
pushes (§12.4): they carry the digest of the application's token instead of the
token, and are stored as ordinary map outputs marked with their primary.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...buffers.shm import SharedRegion
from ...protocol.auth import token_digest
from ...protocol.connection import ProtocolConnection, release_payload
from ...protocol.errors import InvalidRequest, ShuffledError, ShuttingDown
from ...protocol.frames import OpenMapOutput, PushData, PushPlaced
from ..accounting.shares import Share
from ..cluster.replication import ReplicaLinks
from .environment import ShuffleEnvironment
from .link import DaemonLink
from .push_session import PushSession


class PushService:
    def __init__(self, link: DaemonLink, env: ShuffleEnvironment[Any]) -> None:
        self.link = link
        self.env = env
        self.sessions: dict[int, PushSession] = {}
        self._push_share = Share()

    # -- the PushConnection view its sessions use

    @property
    def push_share(self) -> Share | None:
        """Push window segments this client connection's map outputs hold (see accounting/shares.py); None on a peer
        link, whose replica pushes count against their applications' shares only: a tenant filling the
        link would otherwise take the copies of every other tenant's pushes."""
        return self._push_share if self.link.from_client else None

    @property
    def is_open(self) -> bool:
        return self.link.is_open

    @property
    def proto(self) -> ProtocolConnection:
        return self.link.proto

    @property
    def shm(self) -> SharedRegion | None:
        """The client's region of shared memory, where its pushes place their data (§6.3), if it has one."""
        return self.link.shm

    def send_error(self, stream: int, exc: ShuffledError) -> None:
        self.link.send_error(stream, exc)

    def flush(self) -> None:
        self.link.sender.flush_control()

    def closed(self, writer: int) -> None:
        self.sessions.pop(writer, None)
        self.link.proto.push_closed(writer)

    # -- frames

    def on_open(self, req: OpenMapOutput) -> None:
        if self.link.draining:
            self.send_error(req.writer, ShuttingDown("the daemon is shutting down; retry with another daemon"))
            return
        env = self.env
        try:
            digest = self._app_key(req)
            self.link.authorize_digest(req.app, digest)
            env.shares.check(self.push_share, req.app)
            replicas = self._replicas(req)
            writer = env.storage.open(
                req.app,
                req.shuffle,
                req.map_index,
                req.attempt,
                req.partitions,
                digest=digest,
                replica_of=req.replica_of,
                replicas=replicas,
                durable=self._durable(req),
                synced=req.fsync == "commit",
            )
        except ShuffledError as exc:
            self.send_error(req.writer, exc)
            return
        links = (
            ReplicaLinks(env.config, env.counters, env.membership, env.peers.get, req, digest, replicas)
            if req.replica_of is None and replicas > 1
            else None
        )
        session = PushSession(self, req, writer, env, links)
        self.sessions[req.writer] = session
        self.link.proto.accept_push(req.writer, session.target)
        session.task = asyncio.create_task(session.start())

    def _app_key(self, req: OpenMapOutput) -> bytes:
        """The digest of the application's token: a client sends the token, a primary its digest (`app_key`)."""
        if not self.link.from_client:  # a replica push: the protocol lets no other push from a daemon through
            if req.app_key is None:  # taken as "no token", it would bind an unbound application to that
                raise InvalidRequest("a replica push must carry the application's app_key (§12.4)")
            return bytes.fromhex(req.app_key)
        if req.replica_of is not None or req.app_key is not None:
            raise InvalidRequest("replica_of and app_key are sent by daemons only (replica pushes, §12.4)")
        return token_digest(req.token)

    def _replicas(self, req: OpenMapOutput) -> int:
        """Copies wanted, this one included: at most one per daemon the placement knows."""
        return min(req.replicas or self.env.config.replicas, len(self.env.membership.ring()))

    def _durable(self, req: OpenMapOutput) -> bool:
        """Whether the committed output is to be uploaded to the object store (§12.5): as the writer asks,
        else as the daemon's `durability` says (a daemon without an object store refuses it). A replica push
        never is: its primary uploads."""
        if req.replica_of is not None:
            return False
        return (req.durability or self.env.config.durability) == "object-store"

    def on_data(self, frame: PushData) -> None:
        session = self.sessions.get(frame.writer)
        if session is None:
            release_payload(frame)
            return
        session.on_data(frame)

    def on_placed(self, frame: PushPlaced) -> None:
        if (session := self.sessions.get(frame.writer)) is not None:
            session.on_placed(frame)

    def on_commit(self, writer: int, pushes: int) -> None:
        if (session := self.sessions.get(writer)) is not None:
            session.commit(pushes)

    def on_abort(self, writer: int) -> None:
        if (session := self.sessions.get(writer)) is not None:
            session.abort()

    def on_out_of_turn(self, writer: int, exc: ShuffledError) -> None:
        """A commit or abort the push's stream did not allow (the protocol's table said so): the attempt
        is discarded, and the writer told why on its stream (the connection lives on)."""
        if (session := self.sessions.get(writer)) is not None:  # else its open was refused, and it was told
            session.fail(exc)

    def release(self) -> None:
        """The connection is gone: every open map output is aborted."""
        for session in list(self.sessions.values()):
            session.drop()
