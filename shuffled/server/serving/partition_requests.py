"""The reads this daemon makes over one connection to a peer: its gates' `RemoteInputChannel`s (Flink's
PartitionRequestClient). They are kept apart from the reads the connection serves (read_service.py): on a
peer link both daemons read, in id spaces of their own. AddCredit announcements are batched once per loop
turn.

This registers every channel a gate opens here, and only it removes them: a channel says when it is done
(`close_channel`).
"""

from __future__ import annotations

from typing import Any

from ...net.once_per_turn import OncePerTurn
from ...protocol.connection import release_payload
from ...protocol.errors import ShuffledError
from ...protocol.frames import BufferResponse, PartitionRequest
from .environment import ShuffleEnvironment
from .input_gate import RemoteInputChannel
from .link import DaemonLink


class PartitionRequestClient:
    def __init__(self, link: DaemonLink, env: ShuffleEnvironment[Any]) -> None:
        self.link = link
        self.env = env
        self.channels: dict[int, RemoteInputChannel] = {}
        self._announce: dict[int, RemoteInputChannel] = {}
        self._flush_announcements_soon = OncePerTurn(self._flush_announcements)

    # -- the ReadPeer view the gates use

    @property
    def is_open(self) -> bool:
        return self.link.is_open

    @property
    def features(self) -> frozenset[str]:
        return self.link.proto.features

    def new_stream_id(self) -> int:
        return self.link.proto.streams.new_id()

    @property
    def reading(self) -> int:
        """Reads this daemon has open over the connection."""
        return len(self.channels)

    def open_channel(self, ch: RemoteInputChannel, req: PartitionRequest) -> None:
        self.channels[ch.receiver] = ch
        self.env.counters.read_credit_granted += req.credit
        self.link.proto.request_read(req, ch.target)

    def close_channel(self, receiver: int, cancel: bool) -> None:
        """A channel is done: at its end or error (the read is over for the peer too), or given up (`cancel`:
        the peer is told)."""
        self.channels.pop(receiver, None)
        if cancel:
            self.link.proto.cancel_read(receiver)

    def on_buffer(self, frame: BufferResponse) -> None:
        ch = self.channels.get(frame.receiver)
        if ch is None:
            release_payload(frame)
            return
        ch.on_buffer(frame)

    def on_failed(self, stream: int, exc: ShuffledError) -> bool:
        """The peer failed one of our reads; False when `stream` is not a read."""
        ch = self.channels.get(stream)
        if ch is None:
            return False
        ch.fail(exc)
        return True

    def announce(self, ch: RemoteInputChannel) -> None:
        """Lazily send AddCredit: collect channels now, send what they owe once per loop turn."""
        self._announce[ch.receiver] = ch
        self._flush_announcements_soon()

    def _flush_announcements(self) -> None:
        pending, self._announce = self._announce, {}
        if not self.is_open:
            return
        for ch in pending.values():
            n = ch.credit.take_announcement()
            if n and not ch.closed:
                self.env.counters.read_credit_granted += n
                self.link.proto.add_credit(ch.receiver, n)

    def release(self, lost: ShuffledError) -> None:
        """The connection is gone: every channel over it fails (its gate fails over)."""
        for ch in list(self.channels.values()):
            ch.fail(lost)
