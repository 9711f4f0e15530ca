"""Optional per-application compression of data payloads (PROTOCOL.md §10.5); no IO.

A compressed payload is one self-contained block: a 1-byte tag, then either the
bytes as they were (tag 0: compressing did not make them smaller) or, for tag 1,
the uncompressed length (u32, big endian) and an LZ4 block. Daemons never look
inside: they store, checksum and relay the payload like any other. Writers and
readers of an application must agree to use it.
"""

from __future__ import annotations

import struct

import lz4.block

from .errors import CorruptData

#: names a client accepts for `compression=`
CODECS = ("lz4",)
STORED, LZ4 = 0, 1
_LENGTH = struct.Struct(">I")
#: bytes a writer leaves free in each segment for the block header
OVERHEAD = 1 + _LENGTH.size


def check_codec(codec: str | None) -> None:
    if codec is not None and codec not in CODECS:
        raise ValueError(f"compression {codec!r} is not one of {', '.join(CODECS)} (or None)")


def compress_in_place(segment: memoryview, length: int) -> int:
    """Turn the first `length` bytes of `segment` into a block; return the block's length.

    `length` must be at most `len(segment) - OVERHEAD`, so that a stored block fits too.
    """
    raw = bytes(segment[:length])
    packed = lz4.block.compress(raw, store_size=False)
    if OVERHEAD + len(packed) < 1 + length:
        segment[0] = LZ4
        _LENGTH.pack_into(segment, 1, length)
        segment[OVERHEAD : OVERHEAD + len(packed)] = packed
        return OVERHEAD + len(packed)
    segment[0] = STORED
    segment[1 : 1 + length] = raw
    return 1 + length


def decompress(block: memoryview) -> memoryview:
    """The bytes a block holds; CorruptData if it is not a block this module wrote."""
    if not len(block):
        raise CorruptData("empty compressed payload")
    tag = block[0]
    if tag == STORED:
        return block[1:]
    if tag != LZ4 or len(block) < OVERHEAD:
        raise CorruptData(f"not a compressed payload (tag {tag}): do all writers of this application compress?")
    (size,) = _LENGTH.unpack_from(block, 1)
    try:
        raw = lz4.block.decompress(block[OVERHEAD:], uncompressed_size=size)
    except lz4.block.LZ4BlockError as exc:
        raise CorruptData(f"LZ4 block does not decompress: {exc}") from None
    if len(raw) != size:
        raise CorruptData(f"LZ4 block gave {len(raw)} bytes, its header says {size}")
    return memoryview(raw)
