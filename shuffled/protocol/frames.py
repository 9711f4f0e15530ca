"""Frame types, fixed layouts, the decoded frame objects and the frame registry (see proto/PROTOCOL.md).

All integers are big-endian (network order, and what java.nio.ByteBuffer reads by
default). Data frames (BufferResponse, PushData) have fixed binary headers so the
hot path never touches msgpack; control frames carry small msgpack maps.

Each frame class carries its wire type (`TYPE`) and its body codec (`BODY`: how its
fields become the frame's bytes and a received body becomes the frame again), and
`Frame`, the union of the classes, is the one list of them: `codec.encode`,
`codec.decode_control` and proto/vectors/generate.py find every frame type through
`FRAME_CLASSES`, built from it. So a new control frame type is a `FrameType` code and
a class here, listed in `Frame`; no dispatch code changes.
"""

from __future__ import annotations

import functools
import re
import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from operator import attrgetter
from typing import Any, ClassVar, Protocol, get_args

import msgpack

from .errors import InvalidRequest, ProtocolError, UnsupportedVersion
from .resume import Resume

MAGIC = b"SHFD"
VERSION = 3

#: length u32 (bytes after this header), type u8, flags u8, reserved u16, stream u32
HEADER = struct.Struct(">IBBHI")
HEADER_SIZE = HEADER.size  # 12

#: BufferResponse fixed part: sequence u32, backlog u32, kind u16, reserved u16, crc u32 (CRC32C of the payload,
#: 0 for events). The payload's packed groups say which partitions and attempts it holds (packed.py).
BUFFER_RESPONSE_FIXED = struct.Struct(">IIHHI")
#: PushData fixed part: sequence u32, crc u32 (CRC32C of the payload, one packed group)
PUSH_DATA_FIXED = struct.Struct(">II")
#: header and fixed part in one pack_into call
BUFFER_RESPONSE_PREFIX = struct.Struct(">IBBHIIIHHI")
PUSH_DATA_PREFIX = struct.Struct(">IBBHIII")
#: one group of a PushPlaced body: sequence u32, crc u32, slot u32, length u32 (a PushData whose payload is in
#: shared memory); a body holds one or more
PUSH_PLACED_ENTRY = struct.Struct(">IIII")
#: u32s per group of a PushPlaced body
PLACED_FIELDS = 4
#: one buffer of a BufferPlaced body: sequence u32, backlog u32, crc u32, slot u32, length u32 (a DATA
#: BufferResponse whose payload the daemon put in shared memory); a body holds one or more
BUFFER_PLACED_ENTRY = struct.Struct(">IIIII")
#: u32s per buffer of a BufferPlaced body
BUFFER_PLACED_FIELDS = 5

HELLO_FIXED = struct.Struct(">4sHBB")  # magic, version, role, reserved
U32 = struct.Struct(">I")
#: header and a u32 body in one pack (AddCredit, PushCredit, CommitMapOutput)
U32_FRAME = struct.Struct(">IBBHII")
ERROR_FIXED = struct.Struct(">H")
#: the longest application id a map output may be opened for or a read name, in bytes of UTF-8 (PROTOCOL.md §9)
MAX_APP_ID = 255
#: the CommitAck's u64 lengths are big-endian on the wire, native in an array
_SWAP = sys.byteorder == "little"


def check_app_id(app: str) -> None:
    """Refuse an application id no map output can have been opened for, without echoing it: an answer that
    repeats a client's 60 KB id is 60 KB a client that does not read makes the daemon queue."""
    if not app or len(app.encode()) > MAX_APP_ID:
        raise InvalidRequest(f"application id must be 1 to {MAX_APP_ID} bytes of UTF-8")


#: Largest control-frame body (PartitionRequest with many map attempts is the big one).
MAX_CONTROL_BODY = 8 << 20
#: Largest control body before the handshake is done (Hello, AuthChallenge, AuthResponse, HelloAck are
#: a few hundred bytes): an unauthenticated party cannot make a daemon buffer or decode more than this.
MAX_HANDSHAKE_BODY = 64 << 10
#: Default largest data payload; a daemon announces its own (its segment size) in HelloAck.
DEFAULT_MAX_PAYLOAD = 32 << 10
#: Default of the streams a daemon lets one party open on one connection (its max-streams-per-connection).
MAX_STREAMS_PER_CONNECTION = 65536


class FrameType(IntEnum):
    HELLO = 0x01
    HELLO_ACK = 0x02
    ERROR = 0x03
    CLOSE = 0x04
    AUTH_CHALLENGE = 0x05
    AUTH_RESPONSE = 0x06
    PARTITION_REQUEST = 0x10
    ADD_CREDIT = 0x11
    BUFFER_RESPONSE = 0x12
    CANCEL_PARTITION_REQUEST = 0x13
    BUFFER_PLACED = 0x14
    RETURN_SLOTS = 0x15
    OPEN_MAP_OUTPUT = 0x20
    PUSH_CREDIT = 0x21
    PUSH_DATA = 0x22
    COMMIT_MAP_OUTPUT = 0x23
    COMMIT_ACK = 0x24
    ABORT_MAP_OUTPUT = 0x25
    ABORT_ACK = 0x26
    PUSH_SLOTS = 0x27
    PUSH_PLACED = 0x28
    ADMIN_REQUEST = 0x30
    ADMIN_RESPONSE = 0x31


class Role(IntEnum):
    CLIENT = 1
    DAEMON = 2  # a peer daemon (in Hello) or the answering daemon (in HelloAck)


class BufferKind(IntEnum):
    DATA = 0
    END_OF_PARTITION = 1


# --------------------------------------------------------------------------- body codecs


class BodyCodec(Protocol):
    """How one frame class's fields map to its bytes; `codec.encode` and `codec.decode_control` only dispatch here.

    Stateless and shared by the classes that use it: the class comes in as an argument, so
    one generic codec (no body, one u32, a msgpack map) serves every frame of that shape.
    """

    def pack(self, ftype: FrameType, frame: Any) -> bytes:
        """The whole frame, header included (one struct pack where the layout allows it)."""
        ...

    def unpack(self, cls: Any, stream: int, body: memoryview) -> Any:
        """The `cls` frame a received body stands for; ProtocolError if the body is malformed."""
        ...


def _frame(ftype: int, stream: int, body: bytes) -> bytes:
    return HEADER.pack(len(body), ftype, 0, 0, stream) + body


def _packb(obj: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def _unpack_map(body: memoryview, what: str) -> dict[str, Any]:
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"{what}: body is not valid msgpack ({exc})") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what}: body must be a msgpack map")
    return obj


@dataclass(frozen=True, slots=True)
class NoBody:
    """An empty body: the type and the stream say it all (Close, CancelPartitionRequest, aborts)."""

    #: the field holding the stream id, the class's only field; None: a connection frame (stream 0), no fields
    stream: str | None = None

    def pack(self, ftype: FrameType, frame: Any) -> bytes:
        return HEADER.pack(0, ftype, 0, 0, 0 if self.stream is None else getattr(frame, self.stream))

    def unpack(self, cls: Any, stream: int, body: memoryview) -> Any:
        if len(body):
            raise ProtocolError(f"{cls.TYPE.name}: must have an empty body")
        return cls() if self.stream is None else cls(stream)


@dataclass(frozen=True, slots=True)
class U32Body:
    """A body of one u32 on a stream; the class's fields are the stream, then the value."""

    stream: str
    value: str
    #: zero is malformed (a credit grant of nothing)
    positive: bool = False

    def pack(self, ftype: FrameType, frame: Any) -> bytes:
        return U32_FRAME.pack(4, ftype, 0, 0, getattr(frame, self.stream), getattr(frame, self.value))

    def packer(self, ftype: FrameType) -> Callable[[int, int], bytes]:
        """(stream, value) -> frame bytes without a frame object: credit goes out every few buffers."""
        return functools.partial(U32_FRAME.pack, 4, ftype, 0, 0)

    def unpack(self, cls: Any, stream: int, body: memoryview) -> Any:
        if len(body) != 4:
            raise ProtocolError(f"{cls.TYPE.name}: body must be 4 bytes, got {len(body)}")
        (value,) = U32.unpack(body)
        if self.positive and value == 0:
            raise ProtocolError(f"{cls.__name__}: {self.value} must be positive")
        return cls(stream, value)


@dataclass(frozen=True, slots=True)
class SlotsBody:
    """A body of one or more entries of `per` u32s on a stream (PushSlots: a slot each; PushPlaced: a group's
    four fields each): the class's fields are the stream, then the flat list."""

    stream: str
    values: str
    per: int = 1

    def pack(self, ftype: FrameType, frame: Any) -> bytes:
        values = getattr(frame, self.values)
        if not values or len(values) % self.per:
            raise ValueError(f"{ftype.name}: one or more entries of {self.per} u32s, got {len(values)} values")
        return HEADER.pack(4 * len(values), ftype, 0, 0, getattr(frame, self.stream)) + _to_wire("I", values).tobytes()

    def unpack(self, cls: Any, stream: int, body: memoryview) -> Any:
        if not body or len(body) % (4 * self.per):
            what = "u32s" if self.per == 1 else f"entries of {4 * self.per} bytes"
            raise ProtocolError(f"{cls.TYPE.name}: body must be one or more {what}, got {len(body)} bytes")
        return cls(stream, _from_wire("I", body))


def _to_wire(typecode: str, values: Sequence[int]) -> array[int]:
    """`values` as a big-endian array of `typecode`: an array of that type already is byte-swapped in place,
    without a copy (a CommitAck's lengths can be 8 MB)."""
    wire = values if isinstance(values, array) and values.typecode == typecode else array(typecode, values)
    if _SWAP:
        wire.byteswap()
    return wire


def _from_wire(typecode: str, body: memoryview) -> list[int]:
    """The big-endian integers of `typecode` that fill `body`."""
    values = array(typecode)
    values.frombytes(body)
    if _SWAP:
        values.byteswap()
    return values.tolist()


#: checks one key of a received msgpack map: (map, key, frame class) -> the field's value, or ProtocolError
Reader = Callable[[dict[str, Any], str, Any], Any]


def _required(kind: type) -> Reader:
    def read(m: dict[str, Any], key: str, cls: Any) -> Any:
        value = m.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):  # msgpack keeps booleans apart from integers
            raise ProtocolError(f"{cls.TYPE.name}: field '{key}' missing or of the wrong type")
        return value

    return read


string = _required(str)
integer = _required(int)


def optional_string(m: dict[str, Any], key: str, cls: Any) -> Any:
    value = m.get(key)
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"{cls.TYPE.name}: field '{key}' must be a string")
    return value


def map_or_empty(m: dict[str, Any], key: str, cls: Any) -> Any:
    value = m.get(key, {})
    if not isinstance(value, dict):
        raise ProtocolError(f"{cls.__name__}: '{key}' must be a map")
    return value


def attempt_locations(m: dict[str, Any], key: str, cls: Any) -> Any:
    """Daemon address -> map attempt ids (u64) held there, checked in full: the daemon indexes by them."""
    value = m.get(key)
    if not isinstance(value, dict):
        raise ProtocolError(f"{cls.__name__}: '{key}' must be a map")
    for addr, attempts in value.items():
        if not isinstance(addr, str) or not isinstance(attempts, list):
            raise ProtocolError(f"{cls.__name__}: '{key}' maps address strings to attempt lists")
        for a in attempts:
            if not isinstance(a, int) or isinstance(a, bool) or not 0 <= a < 1 << 64:
                raise ProtocolError(f"{cls.__name__}: attempt ids are unsigned 64-bit integers")
    return value


#: the Hello/HelloAck feature two daemons agree on for replica pushes, `resume` and `holds` (§6, §12.4)
REPLICA = "replica"
#: the Hello/HelloAck feature a local client and its daemon agree on for pushes through shared memory (§6.3)
SHM = "shm"
#: with `SHM`: the daemon may also put served buffers in the region (BufferPlaced, ReturnSlots; §6.3)
SHM_READ = "shm-read"
#: most copies of one map output a push may ask for (OpenMapOutput `replicas`, §12.4)
MAX_REPLICAS = 4


def optional_replicas(m: dict[str, Any], key: str, cls: Any) -> Any:
    """Copies wanted (§12.4): 1..MAX_REPLICAS, absent for the daemon's own default."""
    value = m.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_REPLICAS):
        raise ProtocolError(f"{cls.TYPE.name}: '{key}' must be an integer in 1..{MAX_REPLICAS}")
    return value


#: what an OpenMapOutput may ask of its committed output (§7.8): nothing more, or an upload to the object store
DURABILITIES = ("none", "object-store")


def optional_durability(m: dict[str, Any], key: str, cls: Any) -> Any:
    """Whether the committed map output is to be made durable (§12.5): one of DURABILITIES, absent for the
    daemon's own default."""
    value = m.get(key)
    if value is not None and value not in DURABILITIES:
        raise ProtocolError(f"{cls.TYPE.name}: '{key}' must be one of {', '.join(DURABILITIES)}")
    return value


#: what an OpenMapOutput may ask of its commit's acknowledgement (§7.8): to follow an fsync of the data
FSYNCS = ("commit",)


def optional_fsync(m: dict[str, Any], key: str, cls: Any) -> Any:
    """`"commit"`: the CommitAck follows the fsync of the output (docs/durability.md); absent for the daemon's
    own `fsync` setting."""
    value = m.get(key)
    if value is not None and value not in FSYNCS:
        raise ProtocolError(f"{cls.TYPE.name}: '{key}' must be one of {', '.join(FSYNCS)}")
    return value


def optional_app_key(m: dict[str, Any], key: str, cls: Any) -> Any:
    """The digest of an application token a replica push carries instead of the token (§12.4): "" (no
    token) or 64 lowercase hex digits."""
    value = m.get(key)
    if value is not None and not (isinstance(value, str) and _APP_KEY.fullmatch(value)):
        raise ProtocolError(f"{cls.TYPE.name}: '{key}' must be \"\" or 64 lowercase hex digits")
    return value


def _u64(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 64


def optional_resume(m: dict[str, Any], key: str, cls: Any) -> Any:
    """Where a failed-over read goes on (§10.6), as a `Resume`: {done, attempt?, partition?, bytes?}, the last
    three all or none. Only the shape is checked here (PROTOCOL); whether the values fit the request is
    `Resume.check`'s (INVALID_REQUEST, on the stream)."""
    value = m.get(key)
    if value is None:
        return None
    bad = ProtocolError(
        f"{cls.TYPE.name}: '{key}' must be a map of done (attempt ids) and optionally attempt (an attempt id), "
        "partition (u32) and bytes (u64), all three or none"
    )
    if not isinstance(value, dict) or not set(value) <= _RESUME_KEYS or "done" not in value:
        raise bad
    done = value["done"]
    if not isinstance(done, list) or not all(_u64(a) for a in done):
        raise bad
    point = [value.get(k) for k in ("attempt", "partition", "bytes")]
    if any(v is not None for v in point) and not all(v is not None and _u64(v) for v in point):
        raise bad
    if point[1] is not None and point[1] >= 1 << 32:
        raise bad
    return Resume.from_wire(value)


_APP_KEY = re.compile(r"(?:[0-9a-f]{64})?")
_RESUME_KEYS = frozenset({"done", "attempt", "partition", "bytes"})


@dataclass(frozen=True, slots=True)
class Key:
    """One key of a msgpack body: the frame field of that name and the check a received value passes."""

    name: str
    read: Reader
    #: a None field is left out of the map and an absent key reads as None (the application token, §6.2)
    optional: bool = False
    #: the field's value as msgpack writes it (None: as it is)
    write: Callable[[Any], Any] | None = None


class MapBody:
    """A msgpack map of named keys (PROTOCOL.md §7), after an optional u32 (PartitionRequest's credit).

    The keys are written in the order given (it is part of the wire bytes; decoders accept any
    order). The class's fields are the stream (if any), the prefix (if any), then the keys in
    this order, so a received body builds the frame positionally.
    """

    __slots__ = ("_names", "_optional", "_written", "keys", "prefix", "stream")

    def __init__(self, *keys: Key, stream: str | None = None, prefix: str | None = None) -> None:
        self.keys = keys
        self.stream = stream
        self.prefix = prefix
        self._names = tuple(k.name for k in keys)
        self._optional = tuple(k.name for k in keys if k.optional)
        self._written = tuple((k.name, k.write) for k in keys if k.write is not None)

    def pack(self, ftype: FrameType, frame: Any) -> bytes:
        m = {name: getattr(frame, name) for name in self._names}
        for name in self._optional:
            if m[name] is None:
                del m[name]
        for name, write in self._written:
            if name in m:
                m[name] = write(m[name])
        body = _packb(m)
        if self.prefix is not None:
            body = U32.pack(getattr(frame, self.prefix)) + body
        return _frame(ftype, 0 if self.stream is None else getattr(frame, self.stream), body)

    def unpack(self, cls: Any, stream: int, body: memoryview) -> Any:
        values: list[Any] = [] if self.stream is None else [stream]
        if self.prefix is not None:
            if len(body) < U32.size:
                raise ProtocolError(f"{cls.__name__}: body shorter than its {self.prefix}")
            values.append(U32.unpack_from(body)[0])
            body = body[U32.size :]
        m = _unpack_map(body, cls.TYPE.name)
        values.extend(key.read(m, key.name, cls) for key in self.keys)
        return cls(*values)


@dataclass(frozen=True, slots=True)
class OpaqueMapBody:
    """The body is one msgpack map the frame carries whole (an admin result: its keys are the operation's)."""

    stream: str
    value: str

    def pack(self, ftype: FrameType, frame: Any) -> bytes:
        return _frame(ftype, getattr(frame, self.stream), _packb(getattr(frame, self.value)))

    def unpack(self, cls: Any, stream: int, body: memoryview) -> Any:
        return cls(stream, _unpack_map(body, cls.TYPE.name))


class HelloBody:
    """Magic, version and role in fixed fields, then the info map: a stranger is refused before any msgpack."""

    __slots__ = ()

    def pack(self, ftype: FrameType, frame: Any) -> bytes:
        return _frame(ftype, 0, HELLO_FIXED.pack(MAGIC, frame.version, frame.role, 0) + _packb(frame.info))

    def unpack(self, cls: Any, stream: int, body: memoryview) -> Any:
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
        return cls(role, version, _unpack_map(body[HELLO_FIXED.size :], "Hello"))


class ErrorBody:
    """A u16 code, then the message as UTF-8 to the end of the body (no msgpack: errors must always decode)."""

    __slots__ = ()

    def pack(self, ftype: FrameType, frame: Any) -> bytes:
        return _frame(ftype, frame.stream, ERROR_FIXED.pack(frame.code) + frame.message.encode("utf-8", "replace"))

    def unpack(self, cls: Any, stream: int, body: memoryview) -> Any:
        if len(body) < ERROR_FIXED.size:
            raise ProtocolError("Error: body shorter than its code")
        (code,) = ERROR_FIXED.unpack_from(body)
        return cls(stream, code, bytes(body[ERROR_FIXED.size :]).decode("utf-8", "replace"))


class CommitAckBody:
    """A u32 count, then that many u64 partition lengths: binary, as a map output can have 100k partitions
    (a u64 array either way, not a Python step per partition: a third of what a struct call with a repeat
    count took, which spread the lengths as its arguments and gathered them into a tuple)."""

    __slots__ = ()

    def pack(self, ftype: FrameType, frame: Any) -> bytes:
        return self.packer(ftype)(frame.writer, frame.lengths)

    def packer(self, ftype: FrameType) -> Callable[[int, Sequence[int]], bytes]:
        """(writer, lengths) -> frame bytes without a frame object, the lengths any sequence. A daemon's commit
        hands over its u64 array, which is byte-swapped in place and copied once, into the frame: a CommitAck
        of a million partitions is 8 MB, and each copy more was 8 MB more for the allocator to churn through
        (a list of them is a Python int a partition)."""

        def pack(writer: int, lengths: Sequence[int]) -> bytes:
            wire = _to_wire("Q", lengths)
            n = len(wire)
            return b"".join((HEADER.pack(4 + 8 * n, ftype, 0, 0, writer), U32.pack(n), memoryview(wire).cast("B")))

        return pack

    def unpack(self, cls: Any, stream: int, body: memoryview) -> Any:
        if len(body) < U32.size:
            raise ProtocolError("CommitAck: body shorter than its count")
        (n,) = U32.unpack_from(body)
        if len(body) != 4 + 8 * n:
            raise ProtocolError(f"CommitAck: {n} lengths need {4 + 8 * n} bytes, got {len(body)}")
        return cls(stream, _from_wire("Q", body[4:]))


def pack_buffer_response_prefix(
    into: bytearray | memoryview,
    offset: int,
    receiver: int,
    sequence: int,
    backlog: int,
    kind: int,
    payload_len: int,
    crc: int,
) -> None:
    """Write header + fixed part of a BufferResponse; the payload follows as its own slice(s)."""
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
        kind,
        0,
        crc,
    )


def pack_push_data_prefix(
    into: bytearray | memoryview, offset: int, writer: int, sequence: int, payload_len: int, crc: int
) -> None:
    PUSH_DATA_PREFIX.pack_into(
        into, offset, PUSH_DATA_FIXED.size + payload_len, FrameType.PUSH_DATA, 0, 0, writer, sequence, crc
    )


def _checksum(payload: bytes) -> int:
    # Imported here: the crc32c package pulls in importlib.metadata (and socket) when imported, and the codec
    # stays importable without any IO module; the hot paths pack the CRC their caller computed.
    from .integrity import checksum

    return checksum(payload)


class DataBody:
    """A data frame: header and fixed part packed in one struct, then the payload.

    Senders pack the prefix in place (`pack_buffer_response_prefix`, `pack_push_data_prefix`)
    and `FrameReader` parses the fixed part itself to land the payload in pool memory: the
    hot path stays direct. `pack` is for whole frames (tests, vectors, events).
    """

    __slots__ = ("_values", "fixed", "prefix")

    def __init__(self, fixed: struct.Struct, prefix: Callable[..., None], *fields: str) -> None:
        #: the fixed part after the header: FrameReader checks a frame's length against it
        self.fixed = fixed
        self.prefix = prefix
        #: the prefix packer's arguments before the payload length and crc, as the class's fields
        self._values = attrgetter(*fields)

    def pack(self, ftype: FrameType, frame: Any) -> bytes:
        """`crc` None: the payload's CRC32C (0 for an event)."""
        payload = bytes(frame.payload or b"")
        crc = frame.crc
        if crc is None:
            # events (BufferResponse's non-DATA kinds) carry a zero crc; PushData has no kind, it is all data
            crc = 0 if getattr(frame, "kind", BufferKind.DATA) != BufferKind.DATA else _checksum(payload)
        head = bytearray(HEADER_SIZE + self.fixed.size)
        self.prefix(head, 0, *self._values(frame), len(payload), crc)
        return bytes(head) + payload

    def unpack(self, cls: Any, stream: int, body: memoryview) -> Any:
        """Refused: `FrameReader` decodes data frames itself, into the sink's memory."""
        raise ProtocolError(f"{cls.TYPE.name} is not a control frame")


@dataclass(slots=True)
class Hello:
    TYPE: ClassVar[FrameType] = FrameType.HELLO
    BODY: ClassVar[HelloBody] = HelloBody()

    role: Role
    version: int = VERSION
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class HelloAck:
    TYPE: ClassVar[FrameType] = FrameType.HELLO_ACK
    BODY: ClassVar[HelloBody] = HelloBody()

    role: Role
    version: int = VERSION
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class AuthChallenge:
    """Acceptor → dialer after Hello when the acceptor has a secret: its nonce and its proof."""

    TYPE: ClassVar[FrameType] = FrameType.AUTH_CHALLENGE
    BODY: ClassVar[MapBody] = MapBody(Key("nonce", string), Key("proof", string))

    nonce: str
    proof: str


@dataclass(slots=True)
class AuthResponse:
    """Dialer → acceptor: the dialer's proof ("" when it has no secret)."""

    TYPE: ClassVar[FrameType] = FrameType.AUTH_RESPONSE
    BODY: ClassVar[MapBody] = MapBody(Key("proof", string))

    proof: str


@dataclass(slots=True)
class ErrorResponse:
    TYPE: ClassVar[FrameType] = FrameType.ERROR
    BODY: ClassVar[ErrorBody] = ErrorBody()

    stream: int  # 0: fatal for the whole connection
    code: int
    message: str


@dataclass(slots=True)
class Close:
    TYPE: ClassVar[FrameType] = FrameType.CLOSE
    BODY: ClassVar[NoBody] = NoBody()


@dataclass(slots=True)
class PartitionRequest:
    TYPE: ClassVar[FrameType] = FrameType.PARTITION_REQUEST
    BODY: ClassVar[MapBody] = MapBody(
        Key("app", string),
        Key("shuffle", integer),
        Key("start", integer),
        Key("end", integer),
        Key("locations", attempt_locations),
        Key("token", optional_string, optional=True),
        Key("resume", optional_resume, optional=True, write=Resume.to_wire),
        stream="receiver",
        prefix="credit",
    )

    receiver: int
    credit: int
    app: str
    shuffle: int
    start: int
    end: int
    #: daemon address ("" = the daemon receiving the request) -> map attempt ids held there
    locations: dict[str, list[int]]
    #: the application token (PROTOCOL.md §6.2); None: the request carries none
    token: str | None = None
    #: a read another daemon fails over to goes on where the failed one stopped (§10.6); daemons only
    resume: Resume | None = None


@dataclass(slots=True)
class AddCredit:
    TYPE: ClassVar[FrameType] = FrameType.ADD_CREDIT
    BODY: ClassVar[U32Body] = U32Body("receiver", "credit", positive=True)

    receiver: int
    credit: int


@dataclass(slots=True)
class BufferResponse:
    TYPE: ClassVar[FrameType] = FrameType.BUFFER_RESPONSE
    BODY: ClassVar[DataBody] = DataBody(
        BUFFER_RESPONSE_FIXED,
        pack_buffer_response_prefix,
        "receiver",
        "sequence",
        "backlog",
        "kind",
    )

    receiver: int
    sequence: int
    backlog: int
    kind: BufferKind
    length: int
    #: what the payload sink returned for this frame (e.g. a pool Buffer), None if discarded; a DATA payload is
    #: one or more packed groups (packed.py)
    payload: Any = None
    #: CRC32C of the payload as the writer computed it (0 for events); None: computed when encoded
    crc: int | None = None


@dataclass(slots=True)
class BufferPlaced:
    """DATA BufferResponses on a connection that agreed on shared-memory reads (§6.3), for one or more buffers
    the daemon put in slots of the region: `placed` holds each one's sequence, backlog, CRC32C, slot and
    length, one after the other."""

    TYPE: ClassVar[FrameType] = FrameType.BUFFER_PLACED
    BODY: ClassVar[SlotsBody] = SlotsBody("receiver", "placed", BUFFER_PLACED_FIELDS)

    receiver: int
    placed: list[int]


@dataclass(slots=True)
class ReturnSlots:
    """The client is done with these slots of its region that BufferPlaced named (§6.3): the daemon's again.
    On stream 0: a slot outlives its read (the last buffers are read after the stream's end)."""

    TYPE: ClassVar[FrameType] = FrameType.RETURN_SLOTS
    BODY: ClassVar[SlotsBody] = SlotsBody("stream", "slots")

    stream: int
    slots: list[int]


@dataclass(slots=True)
class CancelPartitionRequest:
    TYPE: ClassVar[FrameType] = FrameType.CANCEL_PARTITION_REQUEST
    BODY: ClassVar[NoBody] = NoBody("receiver")

    receiver: int


@dataclass(slots=True)
class OpenMapOutput:
    TYPE: ClassVar[FrameType] = FrameType.OPEN_MAP_OUTPUT
    BODY: ClassVar[MapBody] = MapBody(
        Key("app", string),
        Key("shuffle", integer),
        Key("map_index", integer),
        Key("attempt", integer),
        Key("partitions", integer),
        Key("token", optional_string, optional=True),
        Key("replicas", optional_replicas, optional=True),
        Key("replica_of", optional_string, optional=True),
        Key("app_key", optional_app_key, optional=True),
        Key("durability", optional_durability, optional=True),
        Key("fsync", optional_fsync, optional=True),
        stream="writer",
    )

    writer: int
    app: str
    shuffle: int
    map_index: int
    attempt: int
    partitions: int
    #: the application token (PROTOCOL.md §6.2); None: the request carries none
    token: str | None = None
    #: copies wanted, this one included (§12.4); None: the daemon's `replicas` setting
    replicas: int | None = None
    #: a replica push (daemons only, §12.4): the node of the primary, where Spark's MapStatus points
    replica_of: str | None = None
    #: with `replica_of`: SHA-256 of the application's token, hex ("" for none), instead of the token
    app_key: str | None = None
    #: "object-store": upload the committed output so any daemon can serve it (§12.5); None: the daemon's setting
    durability: str | None = None
    #: "commit": acknowledge the commit only once the output is on the device; None: the daemon's setting
    fsync: str | None = None


@dataclass(slots=True)
class PushCredit:
    TYPE: ClassVar[FrameType] = FrameType.PUSH_CREDIT
    BODY: ClassVar[U32Body] = U32Body("writer", "credit", positive=True)

    writer: int
    credit: int


@dataclass(slots=True)
class PushData:
    TYPE: ClassVar[FrameType] = FrameType.PUSH_DATA
    BODY: ClassVar[DataBody] = DataBody(PUSH_DATA_FIXED, pack_push_data_prefix, "writer", "sequence")

    writer: int
    sequence: int
    length: int
    #: one packed group (packed.py), landed where the payload sink said
    payload: Any = None
    #: CRC32C of the payload as the writer computed it; None: computed when encoded
    crc: int | None = None


@dataclass(slots=True)
class PushSlots:
    """Push credit on a connection that agreed on shared memory (§6.3): one credit per slot named, each the
    place in the connection's region where the writer may put one packed group."""

    TYPE: ClassVar[FrameType] = FrameType.PUSH_SLOTS
    BODY: ClassVar[SlotsBody] = SlotsBody("writer", "slots")

    writer: int
    slots: list[int]


@dataclass(slots=True)
class PushPlaced:
    """PushData on a connection that agreed on shared memory, for one or more packed groups in slots of the
    region: `placed` holds each group's sequence, CRC32C, slot and length, one after the other."""

    TYPE: ClassVar[FrameType] = FrameType.PUSH_PLACED
    BODY: ClassVar[SlotsBody] = SlotsBody("writer", "placed", PLACED_FIELDS)

    writer: int
    placed: list[int]


@dataclass(slots=True)
class CommitMapOutput:
    TYPE: ClassVar[FrameType] = FrameType.COMMIT_MAP_OUTPUT
    BODY: ClassVar[U32Body] = U32Body("writer", "pushes")

    writer: int
    pushes: int  # PushData frames the writer sent; the daemon checks it saw them all


@dataclass(slots=True)
class CommitAck:
    TYPE: ClassVar[FrameType] = FrameType.COMMIT_ACK
    BODY: ClassVar[CommitAckBody] = CommitAckBody()

    writer: int
    lengths: list[int]


@dataclass(slots=True)
class AbortMapOutput:
    TYPE: ClassVar[FrameType] = FrameType.ABORT_MAP_OUTPUT
    BODY: ClassVar[NoBody] = NoBody("writer")

    writer: int


@dataclass(slots=True)
class AbortAck:
    TYPE: ClassVar[FrameType] = FrameType.ABORT_ACK
    BODY: ClassVar[NoBody] = NoBody("writer")

    writer: int


@dataclass(slots=True)
class AdminRequest:
    TYPE: ClassVar[FrameType] = FrameType.ADMIN_REQUEST
    BODY: ClassVar[MapBody] = MapBody(Key("op", string), Key("args", map_or_empty), stream="request")

    request: int
    op: str
    args: dict[str, Any]


@dataclass(slots=True)
class AdminResponse:
    TYPE: ClassVar[FrameType] = FrameType.ADMIN_RESPONSE
    BODY: ClassVar[OpaqueMapBody] = OpaqueMapBody("request", "result")

    request: int
    result: dict[str, Any]


Frame = (
    Hello
    | HelloAck
    | AuthChallenge
    | AuthResponse
    | ErrorResponse
    | Close
    | PartitionRequest
    | AddCredit
    | BufferResponse
    | BufferPlaced
    | ReturnSlots
    | CancelPartitionRequest
    | OpenMapOutput
    | PushCredit
    | PushData
    | PushSlots
    | PushPlaced
    | CommitMapOutput
    | CommitAck
    | AbortMapOutput
    | AbortAck
    | AdminRequest
    | AdminResponse
)

#: The frame registry: every frame class by its wire type. Built from `Frame`, so listing a class there is
#: what registers it; encode, decode and the vector generator all look frame types up here.
FRAME_CLASSES: dict[FrameType, type[Frame]] = {cls.TYPE: cls for cls in get_args(Frame)}
