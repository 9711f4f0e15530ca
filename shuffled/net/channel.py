"""The receiving end of one read stream, shared by the daemon's remote channels and the client.

It decides where a BufferResponse's payload lands (a buffer of the owner's local
pool, guaranteed by the credit it announced), checks sequence numbers, credit and
the payload's CRC32C, and turns a recycled buffer back into credit. Owners say what
happens to payloads (packed groups: the client unpacks them, a relay forwards them),
the end of the stream, errors, and how credit is announced.
"""

from __future__ import annotations

from collections.abc import Callable

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
        if frame.kind is BufferKind.END_OF_PARTITION:
            if self._in_turn(frame.sequence, None, buf):
                self.on_end()
            return
        assert isinstance(buf, Buffer)
        buf.length = frame.length
        if self._in_turn(frame.sequence, frame.backlog, buf):
            buf.set_recycler(self._recycle)
            self._check(buf, frame.sequence, frame.crc)

    def on_placed(self, sequence: int, backlog: int, crc: int, slot: memoryview, give_back: Callable[[], None]) -> None:
        """A DATA buffer the daemon put in a slot of shared memory (§6.3), read in place. A buffer of the local
        pool stands for the credit it used, as if the payload had landed there: it becomes credit again, and
        the slot goes back to the daemon (`give_back`), when the buffer is let go."""
        pool = self.local_pool()
        token = pool.request() if pool is not None else None
        if token is None:
            give_back()
            raise CreditViolation(f"stream {self.receiver}: buffer placed with no free buffer behind its credit")
        buf = Buffer(token.index, slot, len(slot))
        buf.length = len(slot)
        buf.refs = 1
        counted = False

        def recycle(_: Buffer) -> None:
            give_back()
            if counted:  # it becomes credit again (else, refused before it was counted: back to the pool only)
                token.set_recycler(self._recycle)
            token.release()

        buf.set_recycler(recycle)
        counted = self._in_turn(sequence, backlog, buf)
        if counted:
            self._check(buf, sequence, crc)

    def _in_turn(self, sequence: int, backlog: int | None, buf: object) -> bool:
        """Whether a frame (DATA with its `backlog`; END_OF_PARTITION with None) is the next of the stream and
        within its credit; a DATA frame's credit is counted (announced as it falls due). Else its buffer goes
        back and the stream fails, or the connection, when the sender broke the credit rules."""
        announce = False
        try:
            self.seq.check(sequence)
            if backlog is not None:
                announce = self.credit.on_buffer(backlog)
        except ShuffledError as exc:
            if isinstance(buf, Buffer):
                buf.release()
            if not isinstance(exc, CreditViolation):
                self.on_stream_error(exc)
                return False
            raise  # the sender broke the credit rules: fatal for the connection
        if announce:
            self.announce()
        return True

    def _check(self, buf: Buffer, sequence: int, sent: int | None) -> None:
        """Deliver a DATA buffer whose CRC32C checks out (or is not checked here, see `verify`)."""
        crc = checksum(buf.data()) if self.verify or sent is None else sent
        if crc != sent:
            buf.release()  # back to the pool: it becomes credit again, but the stream ends here
            self.on_stream_error(
                CorruptData(
                    f"buffer {sequence} on read stream {self.receiver} failed its CRC32C check (got "
                    f"{crc:08x}, the sender sent {sent or 0:08x})"
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
