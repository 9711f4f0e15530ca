"""One error hierarchy for the daemon, the clients and the wire.

Every class carries the wire error code it travels as, so an error raised deep in
the daemon reaches a client (Python or JVM) as the same class it was raised as.
Codes are part of the wire format: see proto/PROTOCOL.md, "Error codes".
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum, IntEnum


class ErrorCode(IntEnum):
    PROTOCOL = 1
    UNSUPPORTED_VERSION = 2
    AUTH_FAILED = 3
    UNKNOWN_STREAM = 4
    PARTITION_NOT_FOUND = 5
    PEER_UNAVAILABLE = 6
    LIMIT_EXCEEDED = 7
    CREDIT_VIOLATION = 8
    SEQUENCE_GAP = 9
    MAP_OUTPUT_STATE = 10
    CANCELLED = 11
    SHUTTING_DOWN = 12
    INTERNAL = 13
    DUPLICATE_CONNECTION = 14
    INVALID_REQUEST = 15
    CONNECTION_LOST = 16
    STORAGE_ERROR = 17
    QUOTA_EXCEEDED = 18
    CORRUPT_DATA = 19
    TIMEOUT = 21


class ShuffledError(Exception):
    """Base of every error the service reports; `code` is its wire code."""

    code: ErrorCode = ErrorCode.INTERNAL
    #: True when a Spark reader should treat it as lost shuffle data (FetchFailed).
    fetch_failure: bool = False
    #: True when retrying the same operation later may succeed.
    retryable: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.__class__.__name__
        #: frames a decoder completed before it raised this (their payloads need releasing)
        self.decoded: Sequence[object] = ()


class ProtocolError(ShuffledError):
    """The peer sent bytes that do not follow proto/PROTOCOL.md; fatal for the connection."""

    code = ErrorCode.PROTOCOL


class StreamStateError(ProtocolError):
    """A step its stream's transition table does not have (streams.py): fatal unless the caller maps it to a
    refusal on the stream. `state` and `step` are the stream's state and the step refused."""

    def __init__(self, message: str, state: Enum, step: Enum) -> None:
        super().__init__(message)
        self.state = state
        self.step = step


class UnsupportedVersion(ProtocolError):
    code = ErrorCode.UNSUPPORTED_VERSION


class AuthFailed(ShuffledError):
    code = ErrorCode.AUTH_FAILED


class UnknownStream(ShuffledError):
    code = ErrorCode.UNKNOWN_STREAM


class PartitionNotFound(ShuffledError):
    """Shuffle, partition or map attempt not held where the reader was told it is."""

    code = ErrorCode.PARTITION_NOT_FOUND
    fetch_failure = True


class PeerUnavailable(ShuffledError):
    """The daemon holding part of the data cannot be reached."""

    code = ErrorCode.PEER_UNAVAILABLE
    fetch_failure = True


class LimitExceeded(ShuffledError):
    code = ErrorCode.LIMIT_EXCEEDED


class CreditViolation(ProtocolError):
    """A data buffer arrived on a stream that had no credit for it."""

    code = ErrorCode.CREDIT_VIOLATION


class SequenceGap(ProtocolError):
    """Buffers of one stream arrived out of order or with a gap."""

    code = ErrorCode.SEQUENCE_GAP


class MapOutputStateError(ShuffledError):
    """Push, commit or abort that does not fit the map output's state (e.g. push after commit)."""

    code = ErrorCode.MAP_OUTPUT_STATE


class Cancelled(ShuffledError):
    code = ErrorCode.CANCELLED


class ShuttingDown(ShuffledError):
    code = ErrorCode.SHUTTING_DOWN
    retryable = True


class InternalError(ShuffledError):
    code = ErrorCode.INTERNAL


class DuplicateConnection(ShuffledError):
    """Two daemons dialled each other at once; the other connection is kept."""

    code = ErrorCode.DUPLICATE_CONNECTION
    retryable = True


class InvalidRequest(ShuffledError):
    """A well-formed request with values the daemon refuses (bad range, unknown field...)."""

    code = ErrorCode.INVALID_REQUEST


class ConnectionLost(ShuffledError):
    """The connection closed while a stream on it was open."""

    code = ErrorCode.CONNECTION_LOST
    fetch_failure = True
    retryable = True


class StorageError(ShuffledError):
    """The daemon could not write or read its disk (full, I/O error); the map output was aborted.

    Not a fetch failure: the data was never acknowledged, so the Spark task fails
    with this reason and is retried, possibly once the disk has room again.
    """

    code = ErrorCode.STORAGE_ERROR
    retryable = True


class QuotaExceeded(ShuffledError):
    """The application holds more memory or disk on this daemon than its quota allows."""

    code = ErrorCode.QUOTA_EXCEEDED


class CorruptData(ShuffledError):
    """Stored data failed its checksum: it is lost, so Spark must recompute the map output."""

    code = ErrorCode.CORRUPT_DATA
    fetch_failure = True


class TimedOut(ShuffledError):
    """A party did not answer within a configured bound (handshake, idle, a peer daemon gone silent).

    A fetch failure: a read whose data sits behind a silent daemon cannot finish,
    so Spark should treat the data as lost; retrying may reach the daemon again.
    """

    code = ErrorCode.TIMEOUT
    fetch_failure = True
    retryable = True


def _subclasses(cls: type[ShuffledError]) -> list[type[ShuffledError]]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


#: the class each wire code is received as: the one that declares the code (a refinement that keeps its
#: parent's code, such as StreamStateError, is the parent on the wire)
_BY_CODE: dict[int, type[ShuffledError]] = {cls.code: cls for cls in _subclasses(ShuffledError) if "code" in vars(cls)}
assert len(_BY_CODE) == len(ErrorCode), "every wire error code has exactly one class"


def error_from_code(code: int, message: str) -> ShuffledError:
    """The exception a received ErrorResponse stands for (unknown codes become InternalError)."""
    cls = _BY_CODE.get(code, InternalError)
    return cls(message)
