"""Optional per-application compression of the runs in packed groups (PROTOCOL.md §10.5); no IO.

Each run's data is a sequence of whole blocks, a block never spanning runs. A block is a 1-byte tag, a
u32 length of what follows, then either the bytes as they were (tag 0: compressing did not make them
smaller) or (tag 1) the u32 size they decompress to and an LZ4 block. The length makes a block find its
end inside a run, so a run packs as many blocks as fill its buffer. Daemons never look inside: they
store, checksum and relay compressed runs like any other. Writers and readers of an application must
agree to use it.
"""

from __future__ import annotations

import struct

import lz4.block

from .errors import CorruptData

#: names a client accepts for `compression=`
CODECS = ("lz4",)
STORED, LZ4 = 0, 1
#: tag u8, length u32 of the body that follows
_BLOCK = struct.Struct(">BI")
_SIZE = struct.Struct(">I")
#: a block of n raw bytes takes at most OVERHEAD + n bytes (an LZ4 block is written only when smaller)
OVERHEAD = _BLOCK.size
_LZ4_OVERHEAD = OVERHEAD + _SIZE.size


def check_codec(codec: str | None) -> None:
    if codec is not None and codec not in CODECS:
        raise ValueError(f"compression {codec!r} is not one of {', '.join(CODECS)} (or None)")


def compress_block(raw: memoryview, dest: memoryview) -> int:
    """Write `raw` as one block at the start of `dest` (which has room for OVERHEAD + len(raw)); its length."""
    packed = lz4.block.compress(raw, store_size=False)
    n = len(raw)
    if _LZ4_OVERHEAD + len(packed) < OVERHEAD + n:
        _BLOCK.pack_into(dest, 0, LZ4, _SIZE.size + len(packed))
        _SIZE.pack_into(dest, OVERHEAD, n)
        dest[_LZ4_OVERHEAD : _LZ4_OVERHEAD + len(packed)] = packed
        return _LZ4_OVERHEAD + len(packed)
    _BLOCK.pack_into(dest, 0, STORED, n)
    dest[OVERHEAD : OVERHEAD + n] = raw
    return OVERHEAD + n


def decompress_run(run: memoryview) -> memoryview:
    """The bytes a run of blocks holds; CorruptData if it is not blocks this module wrote."""
    out: list[memoryview] = []
    offset = 0
    while offset < len(run):
        if len(run) - offset < OVERHEAD:
            raise CorruptData(f"{len(run) - offset} bytes at the end of a compressed run are not a block")
        tag, length = _BLOCK.unpack_from(run, offset)
        body = run[offset + OVERHEAD : offset + OVERHEAD + length]
        if len(body) != length or tag not in (STORED, LZ4):
            raise CorruptData(
                f"not a compressed run (block tag {tag}, length {length}): do all writers of this application compress?"
            )
        out.append(body if tag == STORED else memoryview(_decompress(body)))
        offset += OVERHEAD + length
    if not out:
        raise CorruptData("empty compressed run")
    return out[0] if len(out) == 1 else memoryview(b"".join(out))


def _decompress(body: memoryview) -> bytes:
    if len(body) < _SIZE.size:
        raise CorruptData("LZ4 block without its size")
    (size,) = _SIZE.unpack_from(body)
    try:
        raw: bytes = lz4.block.decompress(body[_SIZE.size :], uncompressed_size=size)
    except lz4.block.LZ4BlockError as exc:
        raise CorruptData(f"LZ4 block does not decompress: {exc}") from None
    if len(raw) != size:
        raise CorruptData(f"LZ4 block gave {len(raw)} bytes, its header says {size}")
    return raw
