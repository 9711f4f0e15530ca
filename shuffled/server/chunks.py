"""The unit of stored shuffle data, kept apart from the store so that the net layer, which
queues chunks on outbound streams and hands received ones to input channels, and the
clients can use it without importing the store (which imports this module)."""

from __future__ import annotations

from dataclasses import dataclass

from ..buffers import Buffer


@dataclass(slots=True)
class Chunk:
    """Bytes of one map attempt for one reduce partition; while queued it holds one reference on `buffer`."""

    buffer: Buffer
    partition: int
    attempt: int
    #: CRC32C of the bytes, as the writer computed it (a writer's own chunks get theirs when pushed)
    crc: int = 0
