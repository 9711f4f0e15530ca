"""Network faults between two daemons, injected by a TCP proxy (tests/integration/faultproxy.py).

Daemon A (127.0.0.1) relays a client's read of data held by daemon B (127.0.0.2),
dialling B through the proxy; daemon C (127.0.0.3) holds data read over a direct
connection, the "other streams" that must not notice anything. Each test checks the
affected read fails with a clear error (or completes, for slow but live links),
the unaffected reads complete, and every daemon's pool returns to exactly its
stored data.

The proxy's address is not a daemon's, so a relaying daemon that loses it fails over (PROTOCOL.md §10.6)
to the address's placement candidates; with `--replica-search 1` and these shuffle ids that is never B,
so a failed read here is one whose data has no other copy (tests/integration/test_failover.py covers
the reads that have one).

Corruption: a flipped *header* byte must be a PROTOCOL error on that connection; a flipped
*payload* byte fails that read with CORRUPT_DATA, found by the reader's end-to-end CRC32C check
(by default) or already by the relaying daemon's (``--relay-check crc``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from shuffled.protocol.errors import ConnectionLost, CorruptData, ErrorCode, ShuffledError, TimedOut
from shuffled.protocol.frames import BUFFER_RESPONSE_FIXED, HEADER, FrameType
from shuffled.server.cluster.replica_ring import candidates
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import Cluster, DaemonProcess, cluster_fixture, pool_settled
from tests.integration.faultproxy import FaultProxy, Mark
from tests.shuffles import push, pushed, read_range

PEER_TIMEOUT = 2.0
APP = "fault-app"
SIZE = 1 << 20  # per partition: 32 buffers of 32 KiB
PARTS = 2
SIZES = [SIZE] * PARTS


FAULT_SETTINGS = ["--peer-timeout", str(PEER_TIMEOUT), "--tcp-keepalive", "10", "--replica-search", "1"]
trio = cluster_fixture(3, pool_size="32M", extra=FAULT_SETTINGS)
checking_trio = cluster_fixture(3, pool_size="32M", extra=[*FAULT_SETTINGS, "--relay-check", "crc"])


async def _proxy(cluster: Cluster) -> AsyncIterator[tuple[FaultProxy, str]]:
    p = FaultProxy("127.0.0.7", cluster.daemons[1].addr)
    addr = await p.start()
    yield p, addr
    await p.close()


@pytest_asyncio.fixture
async def proxy(trio: Cluster) -> AsyncIterator[tuple[FaultProxy, str]]:
    async for p in _proxy(trio):
        yield p


@pytest_asyncio.fixture
async def checking_proxy(checking_trio: Cluster) -> AsyncIterator[tuple[FaultProxy, str]]:
    async for p in _proxy(checking_trio):
        yield p


async def _push(d: DaemonProcess, shuffle: int, attempt: int) -> None:
    async with await AsyncClient.connect(d.addr) as c:
        await push(c, APP, shuffle, attempt, SIZES, map_index=0)


async def _read(c: AsyncClient, shuffle: int, where: str, attempt: int) -> bytes:
    return await read_range(c, APP, shuffle, 0, PARTS, {where: [attempt]})


async def _all_settled(trio: Cluster) -> None:
    for d in trio.daemons:
        async with await AsyncClient.connect(d.addr) as c:
            s = await pool_settled(c)
            assert s["pool"]["used"] == s["store"]["stored_segments"], s


async def _cleanup(trio: Cluster) -> None:
    async with await AsyncClient.connect(trio.daemons[0].addr) as c:
        await c.remove_application(APP)
    for d in trio.daemons:
        async with await AsyncClient.connect(d.addr) as c:
            assert (await pool_settled(c))["pool"]["used"] == 0


async def _faulty_read(trio: Cluster, proxy_addr: str, shuffle: int) -> tuple[AsyncClient, asyncio.Task[bytes]]:
    """Data on B (attempt 1) and C (attempt 3); start the read of B's through the proxy, relayed by A."""
    a, b, c = trio.daemons
    peers = [d.addr for d in trio.daemons]
    assert b.addr not in candidates(peers, {}, proxy_addr, APP, shuffle)[:1], "B would be a copy to fail over to"
    await _push(b, shuffle, 1)
    await _push(c, shuffle, 3)
    client = await AsyncClient.connect(a.addr)
    return client, asyncio.create_task(_read(client, shuffle, proxy_addr, 1))


async def _others_still_read(trio: Cluster, client: AsyncClient, shuffle: int) -> None:
    assert await _read(client, shuffle, trio.daemons[2].addr, 3) == pushed(3, SIZES)


async def _finish(
    trio: Cluster, client: AsyncClient, other: asyncio.Task[None], retry: Callable[[], Awaitable[bytes]] | None = None
) -> None:
    """The unaffected read completed; every pool settles; a retry (if any) reads B's data whole; clean up."""
    await other
    await _all_settled(trio)
    if retry is not None:
        assert await retry() == pushed(1, SIZES)
    await client.close()
    await _cleanup(trio)


@within(60)
async def test_cut_mid_frame_fails_the_relayed_read_cleanly(trio: Cluster, proxy: tuple[FaultProxy, str]) -> None:
    p, addr = proxy
    # 1000 bytes into the 5th BufferResponse: inside a payload, with buffers already relayed.
    p.down.mark = Mark(FrameType.BUFFER_RESPONSE, 5, 1000, "cut")
    client, faulty = await _faulty_read(trio, addr, 8)
    other = asyncio.create_task(_others_still_read(trio, client, 8))
    with pytest.raises(ConnectionLost) as err:
        await faulty
    assert err.value.fetch_failure
    # The link is healthy again: A dials anew and the same read succeeds.
    p.down.mark = None
    await _finish(trio, client, other, lambda: _read(client, 8, addr, 1))


@within(60)
async def test_corrupt_header_is_a_protocol_error_on_that_connection_only(
    trio: Cluster, proxy: tuple[FaultProxy, str]
) -> None:
    p, addr = proxy
    # The type byte of the 3rd BufferResponse becomes 0x7f, a type that does not exist.
    p.down.corrupt = (FrameType.BUFFER_RESPONSE, 3, 4, 0x12 ^ 0x7F)
    client, faulty = await _faulty_read(trio, addr, 2)
    other = asyncio.create_task(_others_still_read(trio, client, 2))
    with pytest.raises(ShuffledError) as err:
        await faulty
    assert err.value.code == ErrorCode.CONNECTION_LOST and "PROTOCOL" in err.value.message, err.value
    assert (await client.stats())["errors"].get("PROTOCOL", 0) >= 1
    await _finish(trio, client, other)


async def _corrupt_payload(cluster: Cluster, proxy: tuple[FaultProxy, str]) -> int:
    """One flipped bit inside a relayed buffer's payload fails the read with CORRUPT_DATA (a fetch failure:
    Spark recomputes), never with wrong bytes; the other streams read on. The CORRUPT_DATA errors the
    relaying daemon counted (it reports what it finds itself)."""
    p, addr = proxy
    fixed = HEADER.size + BUFFER_RESPONSE_FIXED.size
    p.down.corrupt = (FrameType.BUFFER_RESPONSE, 3, fixed + 100, 0x01)
    client, faulty = await _faulty_read(cluster, addr, 9)
    other = asyncio.create_task(_others_still_read(cluster, client, 9))
    with pytest.raises(CorruptData) as err:
        await faulty
    assert err.value.fetch_failure and "failed its CRC32C check" in err.value.message
    p.down.corrupt = None
    counted = int((await client.stats())["errors"].get("CORRUPT_DATA", 0))
    await _finish(cluster, client, other, lambda: _read(client, 9, addr, 1))
    return counted


@within(60)
async def test_corrupt_payload_byte_is_corrupt_data_at_the_reader(trio: Cluster, proxy: tuple[FaultProxy, str]) -> None:
    """By default the relaying daemon forwards the writer's CRC32C unchecked and the reader checks it."""
    assert await _corrupt_payload(trio, proxy) == 0


@within(60)
async def test_corrupt_payload_byte_is_corrupt_data_at_the_checking_relay(
    checking_trio: Cluster, checking_proxy: tuple[FaultProxy, str]
) -> None:
    """With --relay-check crc the relaying daemon finds it on arrival and fails the read itself."""
    assert await _corrupt_payload(checking_trio, checking_proxy) == 1


@within(60)
async def test_blackhole_mid_payload_times_out_within_the_peer_timeout(
    trio: Cluster, proxy: tuple[FaultProxy, str]
) -> None:
    p, addr = proxy
    p.down.mark = Mark(FrameType.BUFFER_RESPONSE, 4, 2000, "blackhole")
    client, faulty = await _faulty_read(trio, addr, 3)
    other = asyncio.create_task(_others_still_read(trio, client, 3))
    await p.down.fired.wait()
    started = time.monotonic()
    with pytest.raises(TimedOut) as err:
        await faulty
    waited = time.monotonic() - started
    # Detected by silence, not sooner, and within the bound plus one watchdog tick and some slack.
    assert PEER_TIMEOUT * 0.8 <= waited <= PEER_TIMEOUT + 1.5, waited
    assert "peer-timeout" in err.value.message and err.value.fetch_failure
    await _finish(trio, client, other)  # B gives up on A the same way and frees its stream


@within(60)
async def test_slow_but_live_link_is_not_declared_dead(trio: Cluster, proxy: tuple[FaultProxy, str]) -> None:
    """A read through a delayed, throttled link takes longer than the peer timeout and still completes."""

    p, addr = proxy
    p.down.delay = p.up.delay = 0.02
    p.down.rate = (PARTS * SIZE) // int(2 * PEER_TIMEOUT)  # the whole read takes about twice the bound
    client, faulty = await _faulty_read(trio, addr, 4)
    started = time.monotonic()
    assert await faulty == pushed(1, SIZES)
    assert time.monotonic() - started > PEER_TIMEOUT
    await _finish(trio, client, asyncio.create_task(_others_still_read(trio, client, 4)))


@within(60)
async def test_a_frozen_peer_process_is_detected_and_found_again(trio: Cluster) -> None:
    """No proxy: daemon C is stopped with SIGSTOP (its kernel still acknowledges TCP, nothing answers)."""

    a, _, c = trio.daemons
    await _push(c, 5, 3)
    async with await AsyncClient.connect(a.addr) as client:
        assert await _read(client, 5, c.addr, 3) == pushed(3, SIZES)  # the A-C connection is up
        os.kill(c.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(TimedOut, match="peer-timeout"):
                await _read(client, 5, c.addr, 3)
            assert time.monotonic() - started <= PEER_TIMEOUT + 1.5
        finally:
            os.kill(c.pid, signal.SIGCONT)
        assert await _read(client, 5, c.addr, 3) == pushed(3, SIZES)  # A dials C again
    await _all_settled(trio)
    await _cleanup(trio)
