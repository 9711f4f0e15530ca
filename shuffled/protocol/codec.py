"""Frames to bytes and bytes to frames, with no IO.

Decoding is shaped for `asyncio.BufferedProtocol`: the reader tells the shell where
the next bytes should land (`get_buffer`). Headers and control bodies land in a
small staging area; the payload of a data frame lands directly in the memory a
`PayloadSink` chose for it (a pool segment), so payloads are never copied except
for the few bytes of read-ahead that arrive together with a header.

What each frame's bytes are is not written here: every frame class carries its type
and body codec, and `encode`/`decode_control` dispatch through the registry
(`frames.FRAME_CLASSES`). Only the data frames' decoding is spelled out below, in
`FrameReader`, so their payloads go straight to pool memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .errors import LimitExceeded, ProtocolError, ShuffledError
from .frames import (
    BUFFER_RESPONSE_FIXED,
    DEFAULT_MAX_PAYLOAD,
    FRAME_CLASSES,
    HEADER,
    HEADER_SIZE,
    MAX_CONTROL_BODY,
    PUSH_DATA_FIXED,
    AbortAck,
    AbortMapOutput,
    AddCredit,
    AdminRequest,
    AdminResponse,
    AuthChallenge,
    AuthResponse,
    BodyCodec,
    BufferKind,
    BufferResponse,
    CancelPartitionRequest,
    CommitAck,
    CommitMapOutput,
    ErrorResponse,
    Frame,
    FrameType,
    PushCredit,
    PushData,
)

# --------------------------------------------------------------------------- encoding

#: frame class -> (its type, its body codec): one dict lookup per encode
_ENCODERS: dict[type, tuple[FrameType, BodyCodec]] = {cls: (cls.TYPE, cls.BODY) for cls in FRAME_CLASSES.values()}


def encode(frame: Frame) -> bytes:
    """Any frame as bytes (data frames need their payload set to a bytes-like object)."""
    entry = _ENCODERS.get(type(frame))
    if entry is None:
        raise TypeError(f"not a frame: {frame!r}")
    ftype, body = entry
    return body.pack(ftype, frame)


# Shorthands for the frames the daemon and the clients build from values they hold; a new frame type needs
# none (`encode(NewFrame(...))`). The u32 frames skip the frame object: credit goes out every few buffers.
encode_add_credit = AddCredit.BODY.packer(FrameType.ADD_CREDIT)
encode_push_credit = PushCredit.BODY.packer(FrameType.PUSH_CREDIT)
#: (writer, lengths): a daemon's commit packs its u64 array of lengths without a list
encode_commit_ack = CommitAck.BODY.packer(FrameType.COMMIT_ACK)
encode_commit = CommitMapOutput.BODY.packer(FrameType.COMMIT_MAP_OUTPUT)


def encode_error(stream: int, code: int, message: str) -> bytes:
    return encode(ErrorResponse(stream, code, message))


def encode_error_from(stream: int, exc: ShuffledError) -> bytes:
    return encode_error(stream, exc.code, exc.message)


def encode_auth_challenge(nonce: str, proof: str) -> bytes:
    return encode(AuthChallenge(nonce, proof))


def encode_auth_response(proof: str) -> bytes:
    return encode(AuthResponse(proof))


def encode_cancel(receiver: int) -> bytes:
    return encode(CancelPartitionRequest(receiver))


def encode_buffer_response(
    receiver: int, sequence: int, backlog: int, kind: BufferKind, payload: bytes, crc: int | None = None
) -> bytes:
    """Whole frame as bytes: for tests, vectors and events (no payload). `crc` None: the payload's CRC32C."""
    return encode(BufferResponse(receiver, sequence, backlog, kind, len(payload), payload, crc))


def encode_push_data(writer: int, sequence: int, payload: bytes, crc: int | None = None) -> bytes:
    """Whole frame as bytes: for tests and vectors. `crc` None: the payload's CRC32C."""
    return encode(PushData(writer, sequence, len(payload), payload, crc))


def encode_abort(writer: int) -> bytes:
    return encode(AbortMapOutput(writer))


def encode_abort_ack(writer: int) -> bytes:
    return encode(AbortAck(writer))


def encode_admin_request(request: int, op: str, args: dict[str, Any]) -> bytes:
    return encode(AdminRequest(request, op, args))


def encode_admin_response(request: int, result: dict[str, Any]) -> bytes:
    """The answer to an admin request; one over the control body limit would be a fatal error for the
    other side (§9), so it is LIMIT_EXCEEDED on the request instead."""
    frame = encode(AdminResponse(request, result))
    if len(frame) - HEADER.size > MAX_CONTROL_BODY:
        return encode_error_from(
            request, LimitExceeded(f"the answer is {len(frame) - HEADER.size} bytes, over the frame limit")
        )
    return frame


# --------------------------------------------------------------------------- decoding


class PayloadSink(Protocol):
    """Chooses where a data frame's payload lands.

    Returns (destination, token reported in the frame) or None to discard the
    payload (e.g. late buffers of a cancelled stream). The payload goes in the
    destination's first `length` bytes; up to `READ_AHEAD` bytes after them, if the
    destination has them, are scratch the reader may fill with the next frame's
    header, so one socket read finishes a payload and starts the next frame. Raises
    a ShuffledError (e.g. CreditViolation) to refuse the frame.
    """

    def __call__(self, ftype: FrameType, stream: int, length: int) -> tuple[memoryview, Any] | None: ...


def decode_control(ftype: FrameType, stream: int, body: memoryview) -> Frame:
    """Decode a frame that has no payload sink (everything but BufferResponse/PushData)."""
    cls = FRAME_CLASSES[ftype]
    frame: Frame = cls.BODY.unpack(cls, stream, body)
    return frame


#: bytes read beyond what the current unit needs: enough for the next data frame's header and fixed part
READ_AHEAD = 64
_STAGING = 64 << 10
#: wire values to enum members by dict lookup: calling the enum per frame cost about 1 µs
_FRAME_TYPES = {t.value: t for t in FrameType}
_BUFFER_KINDS = {k.value: k for k in BufferKind}


def _opened(length: int, ftype_raw: int, flag_bits: int, max_control: int, max_payload: int) -> tuple[FrameType, int]:
    """A frame header checked (`flag_bits`: its flags and reserved bits): its type, and the bytes the reader
    needs before it can go on (a control frame whole; a data frame's header and fixed part, its payload then
    lands where the sink says)."""
    ftype = _FRAME_TYPES.get(ftype_raw)
    if ftype is None:
        raise ProtocolError(f"unknown frame type 0x{ftype_raw:02x}")
    if flag_bits:
        raise ProtocolError(f"{ftype.name}: flags and reserved bits must be zero")
    if ftype == FrameType.BUFFER_RESPONSE:
        fixed = BUFFER_RESPONSE_FIXED.size
    elif ftype == FrameType.PUSH_DATA:
        fixed = PUSH_DATA_FIXED.size
    else:
        if length > max_control:
            raise ProtocolError(f"{ftype.name}: body of {length} bytes exceeds the limit {max_control}")
        return ftype, HEADER_SIZE + length
    if length < fixed:
        raise ProtocolError(f"{ftype.name}: frame of {length} bytes is shorter than its fixed part")
    if length - fixed > max_payload:
        raise ProtocolError(f"{ftype.name}: payload of {length - fixed} bytes exceeds the limit {max_payload}")
    return ftype, HEADER_SIZE + fixed


def _data_frame(ftype: FrameType, stream: int, length: int, fixed: memoryview) -> BufferResponse | PushData:
    """A data frame from its fixed part (`length`: the frame's body), its payload not read yet."""
    if ftype == FrameType.BUFFER_RESPONSE:
        seq, backlog, kind, _, crc = BUFFER_RESPONSE_FIXED.unpack(fixed)
        length -= BUFFER_RESPONSE_FIXED.size
        bkind = _BUFFER_KINDS.get(kind)
        if bkind is None:
            raise ProtocolError(f"BufferResponse: unknown kind {kind}")
        if bkind != BufferKind.DATA and (length or crc):
            raise ProtocolError("BufferResponse: an event carries no payload and a zero crc")
        return BufferResponse(stream, seq, backlog, bkind, length, None, crc)
    seq, crc = PUSH_DATA_FIXED.unpack(fixed)
    return PushData(stream, seq, length - PUSH_DATA_FIXED.size, None, crc)


class FrameReader:
    """Incremental decoder: `get_buffer()` → fill → `buffer_updated(n)` → frames.

    State lives here, not in the shell, so the same reader drives the daemon, the
    Python client and the fuzz tests.
    """

    __slots__ = (
        "_end",
        "_filled",
        "_ftype",
        "_length",
        "_max_control",
        "_max_payload",
        "_need",
        "_pending",
        "_room",
        "_scratch",
        "_sink",
        "_staging",
        "_start",
        "_stream",
        "_sview",
        "_target",
    )

    def __init__(
        self,
        sink: PayloadSink,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        max_control: int = MAX_CONTROL_BODY,
    ) -> None:
        self._sink = sink
        self._max_payload = max_payload
        self._max_control = max_control
        self._staging = bytearray(_STAGING)
        self._sview = memoryview(self._staging)
        self._start = 0
        self._end = 0
        self._need = HEADER_SIZE  # bytes the unit at _start needs in staging
        self._ftype: FrameType | None = None
        self._stream = 0
        self._length = 0
        self._pending: BufferResponse | PushData | None = None
        self._target: memoryview | None = None
        #: the target plus the read-ahead scratch after it (what a payload read may fill)
        self._room: memoryview | None = None
        self._filled = 0
        self._scratch: memoryview | None = None

    def set_max_payload(self, n: int) -> None:
        self._max_payload = n

    def set_max_control(self, n: int) -> None:
        self._max_control = n

    def pending_bytes(self) -> bool:
        """True while a frame has started but not ended (EOF now would cut it)."""
        return self._target is not None or self._ftype is not None or self._end > self._start

    def get_buffer(self) -> memoryview:
        if self._room is not None:
            return self._room[self._filled :]
        have = self._end - self._start
        want = max(self._need - have, READ_AHEAD)
        if self._end + want > len(self._staging):
            self._compact(self._need + READ_AHEAD)
        return self._sview[self._end : min(len(self._staging), self._end + want)]

    def _compact(self, room: int) -> None:
        have = self._end - self._start
        if room > len(self._staging):
            staging = bytearray(room)
            staging[:have] = self._sview[self._start : self._end]
            self._sview.release()
            self._staging = staging
            self._sview = memoryview(staging)
        else:
            self._sview[:have] = self._sview[self._start : self._end]
        self._start, self._end = 0, have

    def buffer_updated(self, nbytes: int) -> list[Frame]:
        """Account for `nbytes` written into the last `get_buffer()`; return complete frames."""
        out: list[Frame] = []
        if self._target is not None:
            self._filled += nbytes
            length = len(self._target)
            if self._filled < length:
                return out
            ahead = self._filled - length
            if ahead:  # the next frame's first bytes, read into the scratch after the payload
                assert self._room is not None and self._start == self._end == 0
                self._sview[:ahead] = self._room[length : self._filled]
                self._end = ahead
            out.append(self._finish_payload())
            if not ahead:
                return out
        else:
            self._end += nbytes
        try:
            self._parse(out)
        except ShuffledError as exc:
            exc.decoded = out  # their payloads belong to the caller, who must release them
            raise
        return out

    def close(self) -> None:
        """The connection is gone: let go of the staging and scratch memory now. A connection object is
        part of reference cycles (its reader calls back into it), so it is freed only by the cyclic
        collector, which the daemon runs rarely (cli.py); its buffers must not wait for that, or every
        connection a stranger opens and drops would hold 64 KiB or more until then."""
        self._staging = bytearray()
        self._sview = memoryview(self._staging)
        self._scratch = None
        self._start = self._end = 0

    def abort(self) -> Any:
        """Drop the frame in progress; returns the payload token it held (to release), if any."""
        token = self._pending.payload if self._pending is not None and self._target is not None else None
        self._pending = None
        self._target = self._room = None
        self._filled = 0
        return token

    def _finish_payload(self) -> BufferResponse | PushData:
        frame = self._pending
        assert frame is not None
        self._pending = None
        self._target = self._room = None
        self._filled = 0
        return frame

    def _parse(self, out: list[Frame]) -> None:
        view = self._sview
        while True:
            have = self._end - self._start
            if have < self._need:
                break
            if self._ftype is None:
                length, ftype, flags, reserved, self._stream = HEADER.unpack_from(view, self._start)
                self._ftype, self._need = _opened(length, ftype, flags | reserved, self._max_control, self._max_payload)
                self._length = length
                continue
            ftype = self._ftype
            self._ftype = None
            body_start = self._start + HEADER_SIZE
            if ftype in (FrameType.BUFFER_RESPONSE, FrameType.PUSH_DATA):
                self._start = body_start + self._begin_payload(ftype, view[body_start : self._start + self._need])
                self._need = HEADER_SIZE
                if self._target is None:
                    out.append(self._finish_payload())
                    continue
                # Bytes of the payload that arrived with the header: copy the few we have.
                extra = min(self._end - self._start, len(self._target))
                if extra:
                    self._target[:extra] = view[self._start : self._start + extra]
                    self._start += extra
                    self._filled = extra
                if self._filled == len(self._target):
                    out.append(self._finish_payload())
                    continue
                if self._start == self._end:
                    self._start = self._end = 0
                return
            body = view[body_start : self._start + self._need]
            self._start += self._need
            self._need = HEADER_SIZE
            out.append(decode_control(ftype, self._stream, body))
        if self._start == self._end:
            self._start = self._end = 0
            if len(self._staging) > _STAGING:
                self._sview.release()
                self._staging = bytearray(_STAGING)
                self._sview = memoryview(self._staging)

    def _begin_payload(self, ftype: FrameType, fixed: memoryview) -> int:
        """Parse a data frame's fixed part, ask the sink for a target; returns bytes consumed after the header."""
        stream = self._stream
        frame = self._pending = _data_frame(ftype, stream, self._length, fixed)
        if type(frame) is BufferResponse and frame.kind is not BufferKind.DATA:
            return len(fixed)
        length = frame.length
        got = self._sink(ftype, stream, length)
        if got is None:
            room = self._discard_target(length)
        else:
            room, frame.payload = got
            if len(room) < length:
                raise ValueError("payload sink returned a target smaller than the payload")
        if length:
            self._target = room[:length]
            self._room = room[: length + READ_AHEAD]
        return len(fixed)

    def _discard_target(self, length: int) -> memoryview:
        if self._scratch is None or len(self._scratch) < length + READ_AHEAD:
            self._scratch = memoryview(bytearray(max(length, self._max_payload) + READ_AHEAD))
        return self._scratch


def decode_all(
    data: bytes, sink: Callable[..., Any] | None = None, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> list[Frame]:
    """Decode a whole byte string (tests, vectors); data payloads are returned as bytes."""

    def to_bytes(ftype: FrameType, stream: int, length: int) -> tuple[memoryview, Any]:
        buf = bytearray(length)
        return memoryview(buf), buf

    reader = FrameReader(sink or to_bytes, max_payload=max_payload)
    frames: list[Frame] = []
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        target = reader.get_buffer()
        n = min(len(target), len(view) - pos)
        target[:n] = view[pos : pos + n]
        pos += n
        frames.extend(reader.buffer_updated(n))
    if reader.pending_bytes():
        raise ProtocolError("input ends inside a frame")
    return frames
