"""Python client for the shuffled daemon (asyncio and blocking APIs)."""

from shuffled.net.tls import dialer_context as tls_context
from shuffled.protocol.errors import (
    ConnectionLost,
    CorruptData,
    InvalidRequest,
    MapOutputStateError,
    PartitionNotFound,
    PeerUnavailable,
    QuotaExceeded,
    ShuffledError,
    ShuttingDown,
    StorageError,
)

from .aio import AsyncClient
from .reader import PartitionReader, ReadChunk, ReadGroup
from .sync import Client, Reader, Writer
from .writer import MapWriter

__all__ = [
    "AsyncClient",
    "Client",
    "ConnectionLost",
    "CorruptData",
    "InvalidRequest",
    "MapOutputStateError",
    "MapWriter",
    "PartitionNotFound",
    "PartitionReader",
    "PeerUnavailable",
    "QuotaExceeded",
    "ReadChunk",
    "ReadGroup",
    "Reader",
    "ShuffledError",
    "ShuttingDown",
    "StorageError",
    "Writer",
    "tls_context",
]
