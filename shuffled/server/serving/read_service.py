"""The reads one connection serves (those this daemon makes over it to a peer are partition_requests.py's).

A served read is a view of this daemon's stored data (storage/view.py) pulled as credit allows
(view_reader.py), plus, for a client, an `InputGate` relaying what other daemons hold.

This service registers every read it serves and its gate, and only it removes them: the gates tell it
when they are done (`fail_read`, `gate_closed`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ...buffers import Chunk
from ...logs import event
from ...net.sender import Sender
from ...net.streams import BufferResponseStream
from ...protocol.auth import token_digest
from ...protocol.errors import AuthFailed, InvalidRequest, PartitionNotFound, ShuffledError, ShuttingDown
from ...protocol.frames import PartitionRequest, check_app_id
from ...protocol.resume import Resume
from ..cluster.peers import split_address
from ..storage.view import ReadView
from .environment import ShuffleEnvironment
from .input_gate import InputGate, Peers
from .link import DaemonLink
from .view_reader import LOOKAHEAD, ViewReader

log = logging.getLogger(__name__)


class ReadService:
    def __init__(self, link: DaemonLink, node: str, env: ShuffleEnvironment[Any], peers: Peers) -> None:
        self.link = link
        self.node = node
        self.env = env
        self.peers = peers
        self.served: dict[int, BufferResponseStream] = {}
        self.gates: dict[int, InputGate] = {}

    # -- the ReadClient view the gates use

    @property
    def sender(self) -> Sender:
        return self.link.sender

    @property
    def is_open(self) -> bool:
        return self.link.is_open

    def send_error(self, stream: int, exc: ShuffledError) -> None:
        self.link.send_error(stream, exc)

    def fail_read(self, rid: int, exc: ShuffledError) -> None:
        """End served read `rid` with an error: its stream stops and the client is told."""
        stream = self.served.pop(rid, None)
        if stream is not None:
            stream.shutdown()
        self.send_error(rid, exc)

    def gate_closed(self, rid: int) -> None:
        self.gates.pop(rid, None)

    # -- reads served

    def on_request(self, req: PartitionRequest) -> None:
        rid = req.receiver
        if self.link.closing and self.link.from_client:  # a peer's read still goes on: see cluster/drain.py
            self.send_error(rid, ShuttingDown("the daemon is shutting down; read through another daemon"))
            return
        local: list[int] | None = None
        remote: dict[str, list[int]] = {}
        for addr, attempts in req.locations.items():
            if addr in ("", self.node):
                local = (local or []) + attempts
            else:
                remote[addr] = attempts
        resume = req.resume
        missing: ShuffledError | None = None
        try:
            # The token first: a read of an application bound to other credentials does no work at all (no
            # plan, no dial of the daemons it names), whatever it asks for.
            check_app_id(req.app)
            digest = token_digest(req.token)
            self.env.storage.authorize(req.app, digest)
            if remote and not self.link.from_client:
                raise InvalidRequest("a peer daemon may only ask for data held by the daemon it asks")
            if resume is not None and (remote or local is None):
                raise InvalidRequest("a resumed read may name only the daemon it asks")
            for addr in remote:
                split_address(addr)
            if req.start > req.end:
                raise InvalidRequest(f"partition range [{req.start}, {req.end}) is empty or reversed")
            view: ReadView | None = None
            if local is not None:
                try:
                    view = self.env.storage.read(req.app, req.shuffle, req.start, req.end, local, resume, digest)
                except PartitionNotFound as exc:
                    if not self._copies_elsewhere(resume):
                        raise
                    # This daemon lost the data (restarted after a crash): its copies may still have it.
                    remote[self.node], missing = local, exc
        except ShuffledError as exc:
            if isinstance(exc, AuthFailed):
                self.link.refused(req.app, exc)
            self.send_error(rid, exc)
            return
        if resume is not None:
            self.env.counters.resumed_reads += 1
        stream = BufferResponseStream(rid, req.credit, self._stream_ended)
        stream.opened_at = time.monotonic()
        stream.relayed = bool(remote)
        self.served[rid] = stream
        self.link.proto.accept_read(rid, stream)
        feeding = view is not None and not view.empty
        if remote:
            gate = InputGate(self, stream, req, remote, self.env, self.peers, self.node, feeding, missing)
            self.gates[rid] = gate
            gate.task = asyncio.create_task(gate.open())
        elif not feeding:
            stream.end()
        if view is not None and feeding:
            self._feed(rid, stream, view)
        self.sender.wake(stream)

    def _feed(self, rid: int, stream: BufferResponseStream, view: ReadView) -> None:
        """Serve the local part of a read: the view's payloads queued under the reader's credit, plus a few
        more (`LOOKAHEAD`) so that credit arriving finds data ready."""
        counters = self.env.counters
        sender = self.sender

        def sink(chunk: Chunk, data: int) -> None:
            counters.served_local_bytes += data
            counters.served_local_buffers += 1
            stream.deferred = view.backlog
            stream.push_data(chunk)
            sender.wake(stream)

        def room() -> int:
            return stream.credit + LOOKAHEAD - stream.queued

        def done() -> None:
            stream.deferred = 0
            self._local_done(rid)

        reader = ViewReader(view, sink, room, done, self._failer(rid))
        stream.deferred = view.backlog
        stream.feeds.append(reader)
        reader.start()

    def _copies_elsewhere(self, resume: Resume | None) -> bool:
        """A client's read of data this daemon lacks may fail over to the placement candidates and the object
        store (only a client's: a peer asking here is itself failing over and tries the next copy)."""
        elsewhere = bool(self.env.membership.others()) or self.env.storage.has_object_store
        return self.link.from_client and resume is None and bool(self.node) and elsewhere

    def on_credit(self, rid: int) -> None:
        stream = self.served.get(rid)
        if stream is not None:
            self.sender.wake(stream)

    def on_cancel(self, rid: int) -> None:
        gate = self.gates.pop(rid, None)
        if gate is not None:
            gate.close()
        stream = self.served.pop(rid, None)
        if stream is not None:
            stream.shutdown()

    def _local_done(self, rid: int) -> None:
        """The local part is fully queued: the stream ends, or its gate counts one part done."""
        gate = self.gates.get(rid)
        if gate is not None:
            gate.channel_done()
            return
        stream = self.served.get(rid)
        if stream is not None:
            stream.end()
            self.sender.wake(stream)

    def _failer(self, rid: int) -> Callable[[ShuffledError], None]:
        def fail(exc: ShuffledError) -> None:
            gate = self.gates.get(rid)
            if gate is not None:
                gate.fail(exc)
            elif rid in self.served:
                event(log, "read failed", logging.WARNING, stream=rid, code=exc.code.name, reason=exc.message)
                self.fail_read(rid, exc)

        return fail

    def _stream_ended(self, stream: BufferResponseStream) -> None:
        if self.served.get(stream.stream) is stream:
            del self.served[stream.stream]
            self.link.proto.read_finished(stream.stream)
        self.env.metrics.observe_read(time.monotonic() - stream.opened_at, stream.relayed)

    # -- the connection's end

    def release(self) -> None:
        for gate in list(self.gates.values()):
            gate.close()
        for stream in list(self.served.values()):
            stream.shutdown()
        self.served.clear()
