"""CRC32C, the one checksum of the service: on every data payload on the wire and every spilled chunk.

CRC32C (Castagnoli) because it has hardware support on x86 (SSE 4.2) and ARMv8
and a maintained C implementation in the `crc32c` package, and Java 9+ ships it
as `java.util.zip.CRC32C`; the writer computes it once per buffer, every hop and
the disk keep the same value.
"""

from __future__ import annotations

from collections.abc import Iterable

import crc32c


def checksum(data: bytes | bytearray | memoryview) -> int:
    """CRC32C of a whole buffer (one call per 32 KiB segment, never per record)."""
    return int(crc32c.crc32c(data))


def checksum_parts(parts: Iterable[bytes | bytearray | memoryview]) -> int:
    """CRC32C of the parts back to back, without joining them: a payload a daemon builds from slices of
    stored groups (packed.GroupSlice) goes out as those slices, and its CRC is computed over them in turn."""
    crc = 0
    for part in parts:
        crc = crc32c.crc32c(part, crc)
    return int(crc)
