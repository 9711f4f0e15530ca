"""Optional per-application LZ4 compression of payloads (PROTOCOL.md §10.5): the block format, and a
compressed application pushed into one daemon and read through another, byte-exact."""

from __future__ import annotations

import asyncio
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shuffled.protocol.compression import LZ4, OVERHEAD, STORED, compress_in_place, decompress
from shuffled.protocol.errors import CorruptData
from shuffled_client import AsyncClient
from tests.cluster import Cluster, cluster_fixture, pool_settled

SEGMENT = 32 << 10


@given(st.binary(min_size=1, max_size=SEGMENT - OVERHEAD))
def test_blocks_round_trip(data: bytes) -> None:
    segment = memoryview(bytearray(SEGMENT))
    segment[: len(data)] = data
    n = compress_in_place(segment, len(data))
    assert n <= min(SEGMENT, 1 + len(data))
    assert bytes(decompress(segment[:n])) == data


def test_compressible_data_is_compressed_and_random_data_stored() -> None:
    segment = memoryview(bytearray(SEGMENT))
    text = (b"customer-42,order-7,amount=19.99\n" * 2000)[: SEGMENT - OVERHEAD]
    segment[: len(text)] = text
    n = compress_in_place(segment, len(text))
    assert segment[0] == LZ4 and n < len(text) // 10
    noise = os.urandom(SEGMENT - OVERHEAD)
    segment[: len(noise)] = noise
    assert compress_in_place(segment, len(noise)) == 1 + len(noise) and segment[0] == STORED


@pytest.mark.parametrize("block", [b"", b"\x07abc", b"\x01\x00\x00\x10\x00garbage"])
def test_anything_else_is_corrupt_data(block: bytes) -> None:
    with pytest.raises(CorruptData):
        decompress(memoryview(block))


pair = cluster_fixture(2)


@pytest.mark.asyncio
async def test_a_compressed_application_reads_back_byte_exact_through_a_relay(pair: Cluster) -> None:
    async def body() -> None:
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
        assert len(noise) < stored[1] <= len(noise) + 20  # stored as is: a tag byte per buffer
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

    await asyncio.wait_for(body(), 60)


def test_unknown_codec_is_refused() -> None:
    from shuffled.protocol.compression import check_codec

    with pytest.raises(ValueError, match="not one of lz4"):
        check_codec("zip")
