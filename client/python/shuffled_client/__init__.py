"""Python client for the shuffled daemon (asyncio and blocking APIs)."""

from shuffled.protocol.errors import (
    ConnectionLost,
    InvalidRequest,
    MapOutputStateError,
    PartitionNotFound,
    PeerUnavailable,
    ShuffledError,
)

from .aio import AsyncClient, MapWriter, PartitionReader, ReadChunk
from .sync import Client, Reader, Writer

__all__ = [
    "AsyncClient",
    "Client",
    "ConnectionLost",
    "InvalidRequest",
    "MapOutputStateError",
    "MapWriter",
    "PartitionNotFound",
    "PartitionReader",
    "PeerUnavailable",
    "ReadChunk",
    "Reader",
    "ShuffledError",
    "Writer",
]
