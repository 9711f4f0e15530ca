"""The thin asyncio shell around the sans-IO `ProtocolConnection`, shared by daemon and clients.

Bytes from the socket land where the protocol connection's reader says (headers
in a staging area, payloads straight in pool segments); the events it makes of
them go to `handle_event`, and the control frames it writes go out through the
`Sender`. A `ShuffledError` raised while decoding or handling is fatal for this
connection only: the peer gets an ErrorResponse on stream 0, the connection
closes, and `on_lost` releases everything it held.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import cast

from ..protocol.connection import ProtocolConnection
from ..protocol.errors import InternalError, ShuffledError
from ..protocol.events import Event
from .sender import DEFAULT_HIGH_WATERMARK, DEFAULT_LOW_WATERMARK, Sender, UnsentTally

log = logging.getLogger(__name__)

#: seconds a failed connection waits for the peer to close before closing itself
FAIL_LINGER = 5.0


def endpoint_name(address: object) -> str:
    """A socket address as the daemon names the other end of a connection: "ip:port", "unix" for a Unix
    socket (both ends of a connection name it alike, which the drain challenge relies on)."""
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return str(address) if address else "unix"


class FrameConnection(asyncio.BufferedProtocol):
    def __init__(
        self,
        proto: ProtocolConnection,
        high: int = DEFAULT_HIGH_WATERMARK,
        low: int = DEFAULT_LOW_WATERMARK,
        tally: UnsentTally | None = None,
    ) -> None:
        self.proto = proto
        self._high = high
        self._low = low
        self._tally = tally
        self.transport: asyncio.Transport | None = None
        self._sender: Sender | None = None
        self.peer = "?"
        self.lost = asyncio.get_running_loop().create_future()
        self.close_reason = ""
        #: after a fatal error: input is read into this and dropped until the peer closes
        self._discard: memoryview | None = None
        self.bytes_received = 0

    @property
    def sender(self) -> Sender:
        assert self._sender is not None, "connection not made yet"
        return self._sender

    # -- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer = endpoint_name(transport.get_extra_info("peername"))
        self._sender = Sender(self.transport, self._high, self._low, self._tally)
        self.proto.send = self._sender.send_control
        self.on_made()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._discard is not None:
            return self._discard
        return self.proto.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.bytes_received += nbytes
        if self._discard is not None:
            return
        try:
            for ev in self.proto.buffer_updated(nbytes):
                self.handle_event(ev)
        except Exception as exc:
            # The failing event's handler released its payload; frames not yet handed out are released here.
            self.proto.discard_pending()
            if isinstance(exc, ShuffledError):
                self.fail(exc)
            else:  # a bug must cost one connection, not the daemon
                log.exception("internal error on connection peer=%s", self.peer)
                self.fail(InternalError(f"internal error: {exc.__class__.__name__}: {exc}"))

    def eof_received(self) -> bool:
        if self._discard is None and self.proto.reader.pending_bytes():
            self.close_reason = "eof inside a frame"
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.close_reason:
            self.close_reason = f"lost: {exc}" if exc else "closed by peer"
        if self._sender is not None:
            self._sender.close()
        self.proto.close()
        self._discard = None
        try:
            self.on_lost()
        finally:
            if not self.lost.done():
                self.lost.set_result(self.close_reason)

    def pause_writing(self) -> None:
        self.sender.pause_writing()

    def resume_writing(self) -> None:
        self.sender.resume_writing()
        self.on_drained()

    # -- for subclasses

    @property
    def is_open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing() and self._discard is None

    def fail(self, exc: ShuffledError) -> None:
        """Fatal error: tell the peer why (stream 0), then close.

        Closing with unread input makes the kernel reset the connection, which can
        destroy the error frame before the peer reads it. So the write side is
        shut down after the error, further input is dropped, and the socket closes
        when the peer closes too or after `FAIL_LINGER` seconds (then with whatever is still unsent dropped).
        """
        if not self.is_open:  # closing already, or failed before (input is then being discarded)
            return
        self.close_reason = f"{exc.code.name}: {exc.message}"
        transport = self.transport
        assert transport is not None
        if self._sender is not None:
            self._sender.stop()
        self.proto.discard_pending()
        try:
            transport.write(self.proto.fail(exc))
            if not transport.can_write_eof():
                transport.close()
                return
            transport.write_eof()
        except OSError:  # the peer closed already (its FIN not yet seen here): there is no one to tell
            transport.close()
            return
        self._discard = memoryview(bytearray(64 << 10))
        self.on_failed()
        # Then gone for good: closing would wait for what is unsent, which a party that does not read keeps.
        asyncio.get_running_loop().call_later(FAIL_LINGER, transport.abort)

    def close(self, reason: str = "closed") -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.close_reason = self.close_reason or reason
            self.transport.close()

    def on_made(self) -> None:
        pass

    def on_drained(self) -> None:
        """The transport fell below its low watermark: what waited for the other side to read may go on."""

    def on_failed(self) -> None:
        """A fatal error was sent; release what the connection holds without waiting for the close."""

    def handle_event(self, ev: Event) -> None:
        raise NotImplementedError

    def on_lost(self) -> None:
        pass
