"""The receiving end of one read stream, shared by the daemon's remote channels and the client.

It decides where a BufferResponse's payload lands (a buffer of the owner's local
pool, guaranteed by the credit it announced), checks sequence numbers, credit and
the payload's CRC32C, and turns a recycled buffer back into credit. Owners say what
happens to payloads (packed groups: the client unpacks them, a relay forwards them),
the end of the stream, errors, and how credit is announced.
"""

from __future__ import annotations

from ..buffers import Buffer, LocalPool
from ..protocol.credit import ChannelCredit, SequenceChecker
from ..protocol.errors import CorruptData, CreditViolation, ShuffledError
from ..protocol.frames import BufferKind, BufferResponse
from ..protocol.integrity import checksum


class InputChannel:
    __slots__ = ("credit", "receiver", "seq", "verify")

    def __init__(self, receiver: int, credit: ChannelCredit, verify: bool = True) -> None:
        self.receiver = receiver
        self.credit = credit
        credit.owner = self
        self.seq = SequenceChecker()
        #: check each buffer's CRC32C here (a relaying daemon may leave that to its reader, which checks the
        #: same CRC end to end: it is forwarded with the buffer)
        self.verify = verify

    # -- for owners to provide

    def local_pool(self) -> LocalPool | None:
        raise NotImplementedError

    def announce(self) -> None:
        """Unannounced credit is due (see `ChannelCredit`): arrange an AddCredit."""
        raise NotImplementedError

    def deliver(self, payload: Buffer, crc: int) -> None:
        """A DATA payload whose CRC32C checked out (or was not checked, see `verify`): one or more packed groups."""
        raise NotImplementedError

    def on_end(self) -> None:
        raise NotImplementedError

    def on_stream_error(self, exc: ShuffledError) -> None:
        raise NotImplementedError

    # -- shared mechanics

    def target(self, length: int) -> tuple[memoryview, Buffer]:
        pool = self.local_pool()
        buf = pool.request() if pool is not None else None
        if buf is None:
            raise CreditViolation(f"stream {self.receiver}: buffer arrived with no free buffer behind its credit")
        # Until on_buffer has counted it, releasing the buffer (owner gone, error,
        # connection lost) returns it to the pool without touching credit.
        return buf.room, buf

    def on_buffer(self, frame: BufferResponse) -> None:
        buf = frame.payload
        announce = False
        try:
            self.seq.check(frame.sequence)
            if frame.kind is not BufferKind.END_OF_PARTITION:
                announce = self.credit.on_buffer(frame.backlog)
        except ShuffledError as exc:
            if isinstance(buf, Buffer):
                buf.release()
            if not isinstance(exc, CreditViolation):
                self.on_stream_error(exc)
                return
            raise  # the sender broke the credit rules: fatal for the connection
        if frame.kind is BufferKind.END_OF_PARTITION:
            self.on_end()
            return
        assert isinstance(buf, Buffer)
        buf.length = frame.length
        buf.set_recycler(self._recycle)
        if announce:
            self.announce()
        crc = checksum(buf.data()) if self.verify or frame.crc is None else frame.crc
        if crc != frame.crc:
            buf.release()  # back to the pool: it becomes credit again, but the stream ends here
            self.on_stream_error(
                CorruptData(
                    f"buffer {frame.sequence} on read stream {self.receiver} failed its CRC32C check (got "
                    f"{crc:08x}, the sender sent {frame.crc or 0:08x})"
                )
            )
            return
        self.deliver(buf, crc)

    def _recycle(self, buf: Buffer) -> None:
        pool = self.local_pool()
        assert pool is not None
        pool.recycle(buf)
        mine, others = self.credit.on_recycle()
        if mine:
            self.announce()
        for other in others:
            assert isinstance(other.owner, InputChannel)
            other.owner.announce()

    def release_floating(self) -> None:
        """Close the credit; channels that got the freed floating buffers announce them."""
        for other in self.credit.close():
            assert isinstance(other.owner, InputChannel)
            other.owner.announce()
