"""The reads one connection serves (those this daemon makes over it to a peer are partition_requests.py's).

A served read is a view of this daemon's stored data (storage/view.py) pulled as credit allows
(view_reader.py), plus, for a client, an `InputGate` relaying what other daemons hold.

Each read served is one `ServedRead`: its stream to the reader, its local part (a `ViewReader` of this
daemon's data) and its gate. This service registers it, and only it removes it: the parts report to the
read, the gate tells the service when it is done (`fail_read`, `gate_closed`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ...buffers import Chunk
from ...logs import event
from ...net.sender import Sender
from ...net.streams import BufferResponseStream, PlacedBufferResponseStream
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


class ServedRead:
    """One read this connection serves (see the module)."""

    __slots__ = ("gate", "out", "service")

    def __init__(self, service: ReadService, out: BufferResponseStream) -> None:
        self.service = service
        self.out = out
        #: relaying the parts other daemons hold (None: all of it is local, or the gate is done)
        self.gate: InputGate | None = None

    def local_done(self) -> None:
        """The local part is fully queued: the stream ends, or its gate counts one part done."""
        if self.gate is not None:
            self.gate.channel_done()
        elif self.service.served.get(self.out.stream) is self:
            self.out.end()
            self.service.sender.wake(self.out)

    def local_failed(self, exc: ShuffledError) -> None:
        if self.gate is not None:
            self.gate.fail(exc)
        elif self.service.served.get(self.out.stream) is self:
            event(log, "read failed", logging.WARNING, stream=self.out.stream, code=exc.code.name, reason=exc.message)
            self.service.fail_read(self.out.stream, exc)

    def cancel(self) -> None:
        """The reader cancelled it, or the connection is gone."""
        if self.gate is not None:
            self.gate.close()
        self.out.shutdown()


class ReadService:
    def __init__(self, link: DaemonLink, node: str, env: ShuffleEnvironment[Any], peers: Peers) -> None:
        self.link = link
        self.node = node
        self.env = env
        self.peers = peers
        self.served: dict[int, ServedRead] = {}

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
        read = self.served.pop(rid, None)
        if read is not None:
            read.out.shutdown()
        self.send_error(rid, exc)

    def gate_closed(self, rid: int) -> None:
        read = self.served.get(rid)
        if read is not None:
            read.gate = None

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
        reads = self.link.shm.reads if self.link.shm is not None else None
        if reads is not None:  # a local client reads in place (§6.3)
            stream: BufferResponseStream = PlacedBufferResponseStream(rid, req.credit, reads, self._stream_ended)
        else:
            stream = BufferResponseStream(rid, req.credit, self._stream_ended)
        stream.opened_at = time.monotonic()
        stream.relayed = bool(remote)
        read = self.served[rid] = ServedRead(self, stream)
        self.link.proto.accept_read(rid, stream)
        feeding = view is not None and not view.empty
        if remote:
            gate = read.gate = InputGate(self, stream, req, remote, self.env, self.peers, self.node, feeding, missing)
            gate.task = asyncio.create_task(gate.open())
        elif not feeding:
            stream.end()
        if view is not None and feeding:
            self._feed(read, view)
        self.sender.wake(stream)

    def _feed(self, read: ServedRead, view: ReadView) -> None:
        """Serve the local part of a read: the view's payloads queued under the reader's credit, plus a few
        more (`LOOKAHEAD`) so that credit arriving finds data ready."""
        counters = self.env.counters
        sender = self.sender
        stream = read.out

        def sink(chunks: list[Chunk], data: int) -> None:
            counters.served_local_bytes += data
            counters.served_local_buffers += len(chunks)
            stream.deferred = view.backlog
            stream.push_many(chunks)
            sender.wake(stream)

        def room() -> int:
            return stream.credit + LOOKAHEAD - stream.queued

        def done() -> None:
            stream.deferred = 0
            read.local_done()

        reader = ViewReader(view, sink, room, done, read.local_failed)
        stream.deferred = view.backlog
        stream.feeds.append(reader)
        reader.start()

    def _copies_elsewhere(self, resume: Resume | None) -> bool:
        """A client's read of data this daemon lacks may fail over to the placement candidates and the object
        store (only a client's: a peer asking here is itself failing over and tries the next copy)."""
        elsewhere = bool(self.env.membership.others()) or self.env.storage.has_object_store
        return self.link.from_client and resume is None and bool(self.node) and elsewhere

    def on_credit(self, rid: int) -> None:
        read = self.served.get(rid)
        if read is not None:
            self.sender.wake(read.out)

    def on_cancel(self, rid: int) -> None:
        read = self.served.pop(rid, None)
        if read is not None:
            read.cancel()

    def _stream_ended(self, stream: BufferResponseStream) -> None:
        read = self.served.get(stream.stream)
        if read is not None and read.out is stream:
            del self.served[stream.stream]
            self.link.proto.read_finished(stream.stream)
        self.env.metrics.observe_read(time.monotonic() - stream.opened_at, stream.relayed)

    # -- the connection's end

    def release(self) -> None:
        served, self.served = list(self.served.values()), {}
        for read in served:
            read.cancel()
