"""CRC32C, the one checksum of the service: on every data payload on the wire and every spilled chunk.

CRC32C (Castagnoli) because it has hardware support on x86 (SSE 4.2) and ARMv8
and a maintained C implementation in the `crc32c` package, and Java 9+ ships it
as `java.util.zip.CRC32C`; the writer computes it once per buffer, every hop and
the disk keep the same value.
"""

from __future__ import annotations

import crc32c


def checksum(data: bytes | bytearray | memoryview) -> int:
    """CRC32C of a whole buffer (one call per 32 KiB segment, never per record)."""
    return int(crc32c.crc32c(data))
