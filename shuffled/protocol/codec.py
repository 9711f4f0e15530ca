"""Frames to bytes and bytes to frames, with no IO.

Decoding is shaped for `asyncio.BufferedProtocol`: the reader tells the shell where
the next bytes should land (`get_buffer`). Headers and control bodies land in a
small staging area; the payload of a data frame lands directly in the memory a
`PayloadSink` chose for it (a pool segment), so payloads are never copied except
for the few bytes of read-ahead that arrive together with a header.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgpack

from .errors import ProtocolError, ShuffledError, UnsupportedVersion
from .frames import (
    BUFFER_RESPONSE_FIXED,
    BUFFER_RESPONSE_PREFIX,
    DEFAULT_MAX_PAYLOAD,
    ERROR_FIXED,
    HEADER,
    HEADER_SIZE,
    HELLO_FIXED,
    MAGIC,
    MAX_CONTROL_BODY,
    PUSH_DATA_FIXED,
    PUSH_DATA_PREFIX,
    U32,
    VERSION,
    AbortAck,
    AbortMapOutput,
    AddCredit,
    AdminRequest,
    AdminResponse,
    AuthChallenge,
    AuthResponse,
    BufferKind,
    BufferResponse,
    CancelPartitionRequest,
    Close,
    CommitAck,
    CommitMapOutput,
    ErrorResponse,
    Frame,
    FrameType,
    Hello,
    HelloAck,
    OpenMapOutput,
    PartitionRequest,
    PushCredit,
    PushData,
    Role,
)

_U64 = ">Q"


# --------------------------------------------------------------------------- encoding


def _frame(ftype: FrameType, stream: int, body: bytes = b"") -> bytes:
    return HEADER.pack(len(body), ftype, 0, 0, stream) + body


def _packb(obj: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def encode_hello(frame: Hello | HelloAck) -> bytes:
    ftype = FrameType.HELLO if isinstance(frame, Hello) else FrameType.HELLO_ACK
    body = HELLO_FIXED.pack(MAGIC, frame.version, frame.role, 0) + _packb(frame.info)
    return _frame(ftype, 0, body)


def encode_error(stream: int, code: int, message: str) -> bytes:
    return _frame(FrameType.ERROR, stream, ERROR_FIXED.pack(code) + message.encode("utf-8", "replace"))


def encode_error_from(stream: int, exc: ShuffledError) -> bytes:
    return encode_error(stream, exc.code, exc.message)


def encode_close() -> bytes:
    return _frame(FrameType.CLOSE, 0)


def encode_auth_challenge(nonce: str, proof: str) -> bytes:
    return _frame(FrameType.AUTH_CHALLENGE, 0, _packb({"nonce": nonce, "proof": proof}))


def encode_auth_response(proof: str) -> bytes:
    return _frame(FrameType.AUTH_RESPONSE, 0, _packb({"proof": proof}))


def _with_token(fields: dict[str, Any], token: str | None) -> dict[str, Any]:
    if token is not None:
        fields["token"] = token
    return fields


def encode_partition_request(req: PartitionRequest) -> bytes:
    body = _packb(
        _with_token(
            {"app": req.app, "shuffle": req.shuffle, "start": req.start, "end": req.end, "locations": req.locations},
            req.token,
        )
    )
    return _frame(FrameType.PARTITION_REQUEST, req.receiver, U32.pack(req.credit) + body)


def encode_add_credit(receiver: int, credit: int) -> bytes:
    return _frame(FrameType.ADD_CREDIT, receiver, U32.pack(credit))


def encode_cancel(receiver: int) -> bytes:
    return _frame(FrameType.CANCEL_PARTITION_REQUEST, receiver)


def pack_buffer_response_prefix(
    into: bytearray | memoryview,
    offset: int,
    receiver: int,
    sequence: int,
    backlog: int,
    partition: int,
    kind: int,
    attempt: int,
    payload_len: int,
    crc: int,
) -> None:
    """Write header + fixed part of a BufferResponse; the payload follows as its own slice."""
    BUFFER_RESPONSE_PREFIX.pack_into(
        into,
        offset,
        BUFFER_RESPONSE_FIXED.size + payload_len,
        FrameType.BUFFER_RESPONSE,
        0,
        0,
        receiver,
        sequence,
        backlog,
        partition,
        kind,
        0,
        attempt,
        crc,
    )


def pack_push_data_prefix(
    into: bytearray | memoryview, offset: int, writer: int, sequence: int, partition: int, payload_len: int, crc: int
) -> None:
    PUSH_DATA_PREFIX.pack_into(
        into, offset, PUSH_DATA_FIXED.size + payload_len, FrameType.PUSH_DATA, 0, 0, writer, sequence, partition, crc
    )


def encode_buffer_response(
    receiver: int,
    sequence: int,
    backlog: int,
    partition: int,
    kind: int,
    attempt: int,
    payload: bytes,
    crc: int | None = None,
) -> bytes:
    """Whole frame as bytes: for tests, vectors and events (no payload). `crc` None: the payload's CRC32C."""
    if crc is None:
        crc = _checksum(payload) if kind == BufferKind.DATA else 0
    prefix = bytearray(BUFFER_RESPONSE_PREFIX.size)
    pack_buffer_response_prefix(prefix, 0, receiver, sequence, backlog, partition, kind, attempt, len(payload), crc)
    return bytes(prefix) + payload


def _checksum(payload: bytes) -> int:
    # Imported here: the crc32c package pulls in importlib.metadata (and socket) when imported, and the codec
    # stays importable without any IO module; the hot paths pack the CRC their caller computed.
    from .integrity import checksum

    return checksum(payload)


def encode_push_data(writer: int, sequence: int, partition: int, payload: bytes, crc: int | None = None) -> bytes:
    """Whole frame as bytes: for tests and vectors. `crc` None: the payload's CRC32C."""
    prefix = bytearray(PUSH_DATA_PREFIX.size)
    pack_push_data_prefix(
        prefix, 0, writer, sequence, partition, len(payload), _checksum(payload) if crc is None else crc
    )
    return bytes(prefix) + payload


def encode_open_map_output(m: OpenMapOutput) -> bytes:
    body = _packb(
        _with_token(
            {
                "app": m.app,
                "shuffle": m.shuffle,
                "map_index": m.map_index,
                "attempt": m.attempt,
                "partitions": m.partitions,
            },
            m.token,
        )
    )
    return _frame(FrameType.OPEN_MAP_OUTPUT, m.writer, body)


def encode_push_credit(writer: int, credit: int) -> bytes:
    return _frame(FrameType.PUSH_CREDIT, writer, U32.pack(credit))


def encode_commit(writer: int, pushes: int) -> bytes:
    return _frame(FrameType.COMMIT_MAP_OUTPUT, writer, U32.pack(pushes))


def encode_commit_ack(writer: int, lengths: list[int]) -> bytes:
    body = U32.pack(len(lengths)) + b"".join(int(n).to_bytes(8, "big") for n in lengths)
    return _frame(FrameType.COMMIT_ACK, writer, body)


def encode_abort(writer: int) -> bytes:
    return _frame(FrameType.ABORT_MAP_OUTPUT, writer)


def encode_abort_ack(writer: int) -> bytes:
    return _frame(FrameType.ABORT_ACK, writer)


def encode_admin_request(request: int, op: str, args: dict[str, Any]) -> bytes:
    return _frame(FrameType.ADMIN_REQUEST, request, _packb({"op": op, "args": args}))


def encode_admin_response(request: int, result: dict[str, Any]) -> bytes:
    return _frame(FrameType.ADMIN_RESPONSE, request, _packb(result))


def encode(frame: Frame) -> bytes:
    """Any frame as bytes (data frames need their payload set to a bytes-like object)."""
    match frame:
        case Hello() | HelloAck():
            return encode_hello(frame)
        case ErrorResponse(stream, code, message):
            return encode_error(stream, code, message)
        case Close():
            return encode_close()
        case AuthChallenge(nonce, proof):
            return encode_auth_challenge(nonce, proof)
        case AuthResponse(proof):
            return encode_auth_response(proof)
        case PartitionRequest():
            return encode_partition_request(frame)
        case AddCredit(receiver, credit):
            return encode_add_credit(receiver, credit)
        case BufferResponse():
            return encode_buffer_response(
                frame.receiver,
                frame.sequence,
                frame.backlog,
                frame.partition,
                frame.kind,
                frame.attempt,
                bytes(frame.payload or b""),
                frame.crc,
            )
        case CancelPartitionRequest(receiver):
            return encode_cancel(receiver)
        case OpenMapOutput():
            return encode_open_map_output(frame)
        case PushCredit(writer, credit):
            return encode_push_credit(writer, credit)
        case PushData():
            return encode_push_data(
                frame.writer, frame.sequence, frame.partition, bytes(frame.payload or b""), frame.crc
            )
        case CommitMapOutput(writer, pushes):
            return encode_commit(writer, pushes)
        case CommitAck(writer, lengths):
            return encode_commit_ack(writer, lengths)
        case AbortMapOutput(writer):
            return encode_abort(writer)
        case AbortAck(writer):
            return encode_abort_ack(writer)
        case AdminRequest(request, op, args):
            return encode_admin_request(request, op, args)
        case AdminResponse(request, result):
            return encode_admin_response(request, result)
    raise TypeError(f"not a frame: {frame!r}")


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

    def __call__(self, ftype: FrameType, stream: int, partition: int, length: int) -> tuple[memoryview, Any] | None: ...


def _unpack_map(body: memoryview, what: str) -> dict[str, Any]:
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"{what}: body is not valid msgpack ({exc})") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what}: body must be a msgpack map")
    return obj


def _field(m: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = m.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ProtocolError(f"{what}: field '{name}' missing or of the wrong type")
    return value


def _token(m: dict[str, Any], what: str) -> str | None:
    value = m.get("token")
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"{what}: field 'token' must be a string")
    return value


def _u32(body: memoryview, what: str) -> int:
    if len(body) != 4:
        raise ProtocolError(f"{what}: body must be 4 bytes, got {len(body)}")
    return int(U32.unpack(body)[0])


def _decode_hello(ftype: FrameType, body: memoryview) -> Hello | HelloAck:
    if len(body) < HELLO_FIXED.size:
        raise ProtocolError("Hello: body shorter than its fixed part")
    magic, version, role, _ = HELLO_FIXED.unpack_from(body)
    if magic != MAGIC:
        raise ProtocolError(f"Hello: bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise UnsupportedVersion(f"protocol version {version} not supported (this side speaks {VERSION})")
    try:
        role = Role(role)
    except ValueError:
        raise ProtocolError(f"Hello: unknown role {role}") from None
    info = _unpack_map(body[HELLO_FIXED.size :], "Hello")
    cls = Hello if ftype == FrameType.HELLO else HelloAck
    return cls(role=role, version=version, info=info)


def _decode_locations(value: Any) -> dict[str, list[int]]:
    if not isinstance(value, dict):
        raise ProtocolError("PartitionRequest: 'locations' must be a map")
    out: dict[str, list[int]] = {}
    for addr, attempts in value.items():
        if not isinstance(addr, str) or not isinstance(attempts, list):
            raise ProtocolError("PartitionRequest: 'locations' maps address strings to attempt lists")
        for a in attempts:
            if not isinstance(a, int) or isinstance(a, bool) or not 0 <= a < 1 << 64:
                raise ProtocolError("PartitionRequest: attempt ids are unsigned 64-bit integers")
        out[addr] = attempts
    return out


def decode_control(ftype: FrameType, stream: int, body: memoryview) -> Frame:
    """Decode a frame that has no payload sink (everything but BufferResponse/PushData)."""
    name = ftype.name
    if ftype in (FrameType.HELLO, FrameType.HELLO_ACK):
        return _decode_hello(ftype, body)
    if ftype == FrameType.AUTH_CHALLENGE:
        m = _unpack_map(body, name)
        return AuthChallenge(_field(m, "nonce", str, name), _field(m, "proof", str, name))
    if ftype == FrameType.AUTH_RESPONSE:
        return AuthResponse(_field(_unpack_map(body, name), "proof", str, name))
    if ftype == FrameType.ERROR:
        if len(body) < ERROR_FIXED.size:
            raise ProtocolError("Error: body shorter than its code")
        (code,) = ERROR_FIXED.unpack_from(body)
        return ErrorResponse(stream, code, bytes(body[ERROR_FIXED.size :]).decode("utf-8", "replace"))
    if ftype in (FrameType.CLOSE, FrameType.CANCEL_PARTITION_REQUEST, FrameType.ABORT_MAP_OUTPUT, FrameType.ABORT_ACK):
        if len(body):
            raise ProtocolError(f"{name}: must have an empty body")
        if ftype == FrameType.CLOSE:
            return Close()
        if ftype == FrameType.CANCEL_PARTITION_REQUEST:
            return CancelPartitionRequest(stream)
        if ftype == FrameType.ABORT_MAP_OUTPUT:
            return AbortMapOutput(stream)
        return AbortAck(stream)
    if ftype == FrameType.ADD_CREDIT:
        credit = _u32(body, name)
        if credit == 0:
            raise ProtocolError("AddCredit: credit must be positive")
        return AddCredit(stream, credit)
    if ftype == FrameType.PUSH_CREDIT:
        credit = _u32(body, name)
        if credit == 0:
            raise ProtocolError("PushCredit: credit must be positive")
        return PushCredit(stream, credit)
    if ftype == FrameType.COMMIT_MAP_OUTPUT:
        return CommitMapOutput(stream, _u32(body, name))
    if ftype == FrameType.COMMIT_ACK:
        if len(body) < 4:
            raise ProtocolError("CommitAck: body shorter than its count")
        (n,) = U32.unpack_from(body)
        if len(body) != 4 + 8 * n:
            raise ProtocolError(f"CommitAck: {n} lengths need {4 + 8 * n} bytes, got {len(body)}")
        lengths = [int.from_bytes(body[4 + 8 * i : 12 + 8 * i], "big") for i in range(n)]
        return CommitAck(stream, lengths)
    if ftype == FrameType.PARTITION_REQUEST:
        if len(body) < 4:
            raise ProtocolError("PartitionRequest: body shorter than its credit")
        (credit,) = U32.unpack_from(body)
        m = _unpack_map(body[4:], name)
        start = _field(m, "start", int, name)
        end = _field(m, "end", int, name)
        return PartitionRequest(
            receiver=stream,
            credit=credit,
            app=_field(m, "app", str, name),
            shuffle=_field(m, "shuffle", int, name),
            start=start,
            end=end,
            locations=_decode_locations(m.get("locations")),
            token=_token(m, name),
        )
    if ftype == FrameType.OPEN_MAP_OUTPUT:
        m = _unpack_map(body, name)
        return OpenMapOutput(
            writer=stream,
            app=_field(m, "app", str, name),
            shuffle=_field(m, "shuffle", int, name),
            map_index=_field(m, "map_index", int, name),
            attempt=_field(m, "attempt", int, name),
            partitions=_field(m, "partitions", int, name),
            token=_token(m, name),
        )
    if ftype == FrameType.ADMIN_REQUEST:
        m = _unpack_map(body, name)
        args = m.get("args", {})
        if not isinstance(args, dict):
            raise ProtocolError("AdminRequest: 'args' must be a map")
        return AdminRequest(stream, _field(m, "op", str, name), args)
    if ftype == FrameType.ADMIN_RESPONSE:
        return AdminResponse(stream, _unpack_map(body, name))
    raise ProtocolError(f"{name} is not a control frame")


_HEADER_ONLY = -1
#: bytes read beyond what the current unit needs: enough for the next data frame's header and fixed part
READ_AHEAD = 64
_STAGING = 64 << 10
#: wire values to enum members by dict lookup: calling the enum per frame cost about 1 µs
_FRAME_TYPES = {t.value: t for t in FrameType}
_BUFFER_KINDS = {k.value: k for k in BufferKind}


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
                length, ftype, flags, reserved, stream = HEADER.unpack_from(view, self._start)
                self._begin_frame(length, ftype, flags, reserved, stream)
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

    def _begin_frame(self, length: int, ftype_raw: int, flags: int, reserved: int, stream: int) -> None:
        ftype = _FRAME_TYPES.get(ftype_raw)
        if ftype is None:
            raise ProtocolError(f"unknown frame type 0x{ftype_raw:02x}")
        if flags or reserved:
            raise ProtocolError(f"{ftype.name}: flags and reserved bits must be zero")
        if ftype == FrameType.BUFFER_RESPONSE:
            fixed = BUFFER_RESPONSE_FIXED.size
        elif ftype == FrameType.PUSH_DATA:
            fixed = PUSH_DATA_FIXED.size
        else:
            fixed = _HEADER_ONLY
        if fixed == _HEADER_ONLY:
            if length > self._max_control:
                raise ProtocolError(f"{ftype.name}: body of {length} bytes exceeds the limit {self._max_control}")
            self._need = HEADER_SIZE + length
        else:
            if length < fixed:
                raise ProtocolError(f"{ftype.name}: frame of {length} bytes is shorter than its fixed part")
            if length - fixed > self._max_payload:
                raise ProtocolError(
                    f"{ftype.name}: payload of {length - fixed} bytes exceeds the limit {self._max_payload}"
                )
            self._need = HEADER_SIZE + fixed
        self._ftype = ftype
        self._stream = stream
        self._length = length

    def _begin_payload(self, ftype: FrameType, fixed: memoryview) -> int:
        """Parse a data frame's fixed part, ask the sink for a target; returns bytes consumed after the header."""
        stream = self._stream
        frame: BufferResponse | PushData
        if ftype == FrameType.BUFFER_RESPONSE:
            seq, backlog, partition, kind, _, attempt, crc = BUFFER_RESPONSE_FIXED.unpack(fixed)
            length = self._length - BUFFER_RESPONSE_FIXED.size
            bkind = _BUFFER_KINDS.get(kind)
            if bkind is None:
                raise ProtocolError(f"BufferResponse: unknown kind {kind}")
            if bkind != BufferKind.DATA and (length or crc):
                raise ProtocolError("BufferResponse: an event carries no payload and a zero crc")
            frame = BufferResponse(stream, seq, backlog, partition, bkind, attempt, length, None, crc)
            if bkind != BufferKind.DATA:
                self._pending = frame
                return len(fixed)
        else:
            seq, partition, crc = PUSH_DATA_FIXED.unpack(fixed)
            length = self._length - PUSH_DATA_FIXED.size
            frame = PushData(stream, seq, partition, length, None, crc)
        self._pending = frame
        got = self._sink(ftype, stream, partition, length)
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

    def to_bytes(ftype: FrameType, stream: int, partition: int, length: int) -> tuple[memoryview, Any]:
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
