"""Optional per-application LZ4 compression of runs (PROTOCOL.md §10.5): the block format, and a
compressed application pushed into one daemon and read through another, byte-exact."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shuffled.protocol.compression import LZ4, OVERHEAD, STORED, compress_block, decompress_run
from shuffled.protocol.errors import CorruptData
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import Cluster, cluster_fixture, pool_settled

SEGMENT = 32 << 10
#: the most a writer compresses into one block: what fits an empty segment as a stored block (§10.5)
PIECE = SEGMENT - 12 - 8 - OVERHEAD


@given(st.lists(st.binary(min_size=1, max_size=PIECE), min_size=1, max_size=3))
def test_blocks_round_trip(pieces: list[bytes]) -> None:
    """Blocks back to back in a run find their ends (their length) and give back what they were made of."""
    run = memoryview(bytearray(sum(OVERHEAD + len(p) for p in pieces)))
    n = 0
    for piece in pieces:
        written = compress_block(memoryview(piece), run[n:])
        assert written <= OVERHEAD + len(piece)
        n += written
    assert bytes(decompress_run(run[:n])) == b"".join(pieces)


def test_compressible_data_is_compressed_and_random_data_stored() -> None:
    segment = memoryview(bytearray(SEGMENT))
    text = (b"customer-42,order-7,amount=19.99\n" * 2000)[:PIECE]
    n = compress_block(memoryview(text), segment)
    assert segment[0] == LZ4 and n < len(text) // 10
    noise = os.urandom(PIECE)
    assert compress_block(memoryview(noise), segment) == OVERHEAD + len(noise) and segment[0] == STORED


@pytest.mark.parametrize(
    "run",
    [
        b"",  # no block at all
        b"\x07\0\0\0\3abc",  # an unknown tag
        b"\x00\0\0\0\x09abc",  # a length past the run
        b"\x01\0\0\0\x0b\0\0\x10\0garbage",  # an LZ4 block that does not decompress
        b"\x00\0\0\0\x01a\x00\0",  # a block, then bytes that are none
    ],
)
def test_anything_else_is_corrupt_data(run: bytes) -> None:
    with pytest.raises(CorruptData):
        decompress_run(memoryview(run))


pair = cluster_fixture(2)


@within(60)
async def test_a_compressed_application_reads_back_byte_exact_through_a_relay(pair: Cluster) -> None:
    a, b = [await AsyncClient.connect(d.addr) for d in pair.daemons]
    text = b"".join(b"row %d,%d,some repeated text\n" % (i, i % 7) for i in range(40_000))
    noise = os.urandom(300_000)
    w = await b.open_writer("zapp", 1, 0, 11, 2, compression="lz4")
    for i in range(0, len(text), 10_000):
        await w.write(0, text[i : i + 10_000])
    await w.write(1, noise)
    stored = await w.commit()
    assert w.uncompressed_lengths == [len(text), len(noise)]
    assert stored[0] < len(text) // 4  # compressible
    assert len(noise) < stored[1] <= len(noise) + 20 * OVERHEAD  # stored as is: a block header per piece
    where = {pair.daemons[1].addr: [11]}
    for p, want in ((0, text), (1, noise)):
        async with a.read("zapp", 1, p, p + 1, where, compression="lz4") as r:
            got = b"".join([bytes(chunk.data) async for chunk in r])
        assert got == want
    # A reader that expects blocks, given plain data, says so instead of returning garbage.
    plain = await b.open_writer("plain", 1, 0, 12, 1)
    await plain.write(0, b"\x07 not a block")
    await plain.commit()
    with pytest.raises(CorruptData):
        async with b.read("plain", 1, 0, 1, {"": [12]}, compression="lz4") as r:
            [bytes(chunk.data) async for chunk in r]
    for c in (a, b):
        await c.remove_application("zapp")
        await c.remove_application("plain")
        assert (await pool_settled(c))["pool"]["used"] == 0
        await c.close()


def test_unknown_codec_is_refused() -> None:
    from shuffled.protocol.compression import check_codec

    with pytest.raises(ValueError, match="not one of lz4"):
        check_codec("zip")
