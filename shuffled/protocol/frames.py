"""Frame types, fixed layouts and the decoded frame objects (see proto/PROTOCOL.md).

All integers are big-endian (network order, and what java.nio.ByteBuffer reads by
default). Data frames (BufferResponse, PushData) have fixed binary headers so the
hot path never touches msgpack; control frames carry small msgpack maps.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

MAGIC = b"SHFD"
VERSION = 2

#: length u32 (bytes after this header), type u8, flags u8, reserved u16, stream u32
HEADER = struct.Struct(">IBBHI")
HEADER_SIZE = HEADER.size  # 12

#: BufferResponse fixed part: sequence u32, backlog u32, partition u32, kind u16, reserved u16, attempt u64,
#: crc u32 (CRC32C of the payload, 0 for events)
BUFFER_RESPONSE_FIXED = struct.Struct(">IIIHHQI")
#: PushData fixed part: sequence u32, partition u32, crc u32 (CRC32C of the payload)
PUSH_DATA_FIXED = struct.Struct(">III")
#: header and fixed part in one pack_into call
BUFFER_RESPONSE_PREFIX = struct.Struct(">IBBHIIIIHHQI")
PUSH_DATA_PREFIX = struct.Struct(">IBBHIIII")

HELLO_FIXED = struct.Struct(">4sHBB")  # magic, version, role, reserved
U32 = struct.Struct(">I")
ERROR_FIXED = struct.Struct(">H")

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
    OPEN_MAP_OUTPUT = 0x20
    PUSH_CREDIT = 0x21
    PUSH_DATA = 0x22
    COMMIT_MAP_OUTPUT = 0x23
    COMMIT_ACK = 0x24
    ABORT_MAP_OUTPUT = 0x25
    ABORT_ACK = 0x26
    ADMIN_REQUEST = 0x30
    ADMIN_RESPONSE = 0x31


class Role(IntEnum):
    CLIENT = 1
    DAEMON = 2  # a peer daemon (in Hello) or the answering daemon (in HelloAck)


class BufferKind(IntEnum):
    DATA = 0
    END_OF_PARTITION = 1


@dataclass(slots=True)
class Hello:
    role: Role
    version: int = VERSION
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class HelloAck:
    role: Role
    version: int = VERSION
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class AuthChallenge:
    """Acceptor → dialer after Hello when the acceptor has a secret: its nonce and its proof."""

    nonce: str
    proof: str


@dataclass(slots=True)
class AuthResponse:
    """Dialer → acceptor: the dialer's proof ("" when it has no secret)."""

    proof: str


@dataclass(slots=True)
class ErrorResponse:
    stream: int  # 0: fatal for the whole connection
    code: int
    message: str


@dataclass(slots=True)
class Close:
    pass


@dataclass(slots=True)
class PartitionRequest:
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


@dataclass(slots=True)
class AddCredit:
    receiver: int
    credit: int


@dataclass(slots=True)
class BufferResponse:
    receiver: int
    sequence: int
    backlog: int
    partition: int
    kind: BufferKind
    attempt: int
    length: int
    #: what the payload sink returned for this frame (e.g. a pool Buffer), None if discarded
    payload: Any = None
    #: CRC32C of the payload as the writer computed it (0 for events); None: computed when encoded
    crc: int | None = None


@dataclass(slots=True)
class CancelPartitionRequest:
    receiver: int


@dataclass(slots=True)
class OpenMapOutput:
    writer: int
    app: str
    shuffle: int
    map_index: int
    attempt: int
    partitions: int
    #: the application token (PROTOCOL.md §6.2); None: the request carries none
    token: str | None = None


@dataclass(slots=True)
class PushCredit:
    writer: int
    credit: int


@dataclass(slots=True)
class PushData:
    writer: int
    sequence: int
    partition: int
    length: int
    payload: Any = None
    #: CRC32C of the payload as the writer computed it; None: computed when encoded
    crc: int | None = None


@dataclass(slots=True)
class CommitMapOutput:
    writer: int
    pushes: int  # PushData frames the writer sent; the daemon checks it saw them all


@dataclass(slots=True)
class CommitAck:
    writer: int
    lengths: list[int]


@dataclass(slots=True)
class AbortMapOutput:
    writer: int


@dataclass(slots=True)
class AbortAck:
    writer: int


@dataclass(slots=True)
class AdminRequest:
    request: int
    op: str
    args: dict[str, Any]


@dataclass(slots=True)
class AdminResponse:
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
    | CancelPartitionRequest
    | OpenMapOutput
    | PushCredit
    | PushData
    | CommitMapOutput
    | CommitAck
    | AbortMapOutput
    | AbortAck
    | AdminRequest
    | AdminResponse
)
