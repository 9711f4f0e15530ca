"""The unit of shuffle data a stream carries: one buffer of packed groups and its CRC32C.

It lives beside the pool, below everything that moves data, so the net layer (which queues chunks
on outbound streams and hands received ones to input channels), the daemon's store and the clients
share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from .pool import Buffer


@dataclass(slots=True)
class Chunk:
    """One data frame's payload (packed groups, PROTOCOL.md §3.3: the groups say whose bytes they are);
    while queued it holds one reference on `buffer`."""

    buffer: Buffer
    #: CRC32C of the bytes: the writer's for a stored piece sent as it is, else computed over what is sent
    crc: int = 0
