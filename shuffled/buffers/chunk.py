"""The unit of shuffle data a stream carries: one buffer of one map attempt for one reduce partition.

It lives beside the pool, below everything that moves data, so the net layer (which queues chunks
on outbound streams and hands received ones to input channels), the daemon's store and the clients
share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from .pool import Buffer


@dataclass(slots=True)
class Chunk:
    """Bytes of one map attempt for one reduce partition; while queued it holds one reference on `buffer`."""

    buffer: Buffer
    partition: int
    attempt: int
    #: CRC32C of the bytes, as the writer computed it (a writer's own chunks get theirs when pushed)
    crc: int = 0
