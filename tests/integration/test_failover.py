"""Read failover between three real daemons (PROTOCOL.md §10.4, §10.6).

A "replica" here is made without replication: the client pushes the same attempt with the same writes
to the primary and to a placement candidate, which stores it as the same chunks. The relaying daemon
must then hide the loss of the primary from the reader: the same bytes, each (partition, attempt) pair
whole and as one run, nothing repeated or dropped, whether the primary is gone before the read, its
link is cut in the middle of a partition (the read resumes on the copy, from memory or from disk), the
relaying daemon holds the copy itself, or the primary restarted without its data. With no copy left
the reader gets the error the primary failed with. Every pool returns to exactly its stored data.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from shuffled.launch import DaemonProcess, free_port
from shuffled.protocol.errors import ErrorCode, ShuffledError
from shuffled.protocol.frames import FrameType
from shuffled.server.cluster.replica_ring import candidates
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import Cluster, payload, pool_settled, start_daemon
from tests.integration.faultproxy import FaultProxy, Faults, Mark

APP = "failover-app"
KEYED = "failover-keyed"
SIZE = 256 << 10  # per pair: 8 buffers of 32 KiB
PARTS = 3
ATTEMPTS = [1, 2]
FAILOVER_TIMEOUT = 3.0
FLAGS = ["--peer-timeout", "3", "--failover-timeout", str(FAILOVER_TIMEOUT)]


def _want(attempts: list[int], lo: int = 0, hi: int = PARTS) -> dict[tuple[int, int], bytes]:
    return {(p, a): payload(a, p, SIZE) for p in range(lo, hi) for a in attempts}


async def _push(addr: str, shuffle: int, attempt: int, spill_midway: bool = False) -> None:
    """One attempt's pairs, written in halves, each write pushed at once (two ascending sequences of
    pieces); `spill_midway` flushes the daemon between the halves, so every pair has its first half on
    disk and the rest in memory."""
    async with await AsyncClient.connect(addr) as c:
        w = await c.open_writer(APP, shuffle, 0, attempt, PARTS, buffer_size=0)
        for half in (0, 1):
            for p in range(PARTS):
                data = payload(attempt, p, SIZE)
                await w.write(p, data[half * SIZE // 2 : (half + 1) * SIZE // 2])
            if spill_midway and half == 0:
                await c.flush(APP, shuffle)
        await w.commit()


async def _read(
    client: AsyncClient, shuffle: int, where: str, attempts: list[int], lo: int = 0, hi: int = PARTS
) -> dict[tuple[int, int], bytes]:
    """Each pair's bytes; a pair read in two runs, an attempt's pairs not together or out of partition order
    (§10.1: one location's stream goes attempt by attempt) fails the test."""
    got: dict[tuple[int, int], bytearray] = {}
    runs: list[tuple[int, int]] = []
    async with client.read(APP, shuffle, lo, hi, {where: attempts}) as r:
        async for chunk in r:
            pair = (chunk.partition, chunk.attempt)
            if not runs or runs[-1] != pair:
                assert pair not in runs, f"pair {pair} in two runs: {runs}"
                if runs and runs[-1][1] == pair[1]:
                    assert runs[-1][0] < pair[0], f"partition out of order: {runs} then {pair}"
                else:
                    assert pair[1] not in {a for _, a in runs}, f"attempt {pair[1]} not together: {runs} then {pair}"
                runs.append(pair)
            got.setdefault(pair, bytearray()).extend(chunk.data)
            chunk.release()
    return {k: bytes(v) for k, v in got.items()}


async def _stats(addr: str) -> dict[str, object]:
    async with await AsyncClient.connect(addr) as c:
        return await c.stats()


async def _settled(addrs: list[str]) -> None:
    for addr in addrs:
        async with await AsyncClient.connect(addr) as c:
            await pool_settled(c)


@dataclass
class Trio:
    """Daemons a, b, c; b advertises the proxy's address, so every daemon reaches b through it."""

    daemons: list[DaemonProcess]
    proxy: FaultProxy
    #: b's name (the proxy's address), then b's placement candidates for the shuffle in use
    primary: str

    def names(self) -> list[str]:
        return [self.daemons[0].addr, self.primary, self.daemons[2].addr]

    def copies(self, shuffle: int) -> list[str]:
        return candidates(self.names(), {}, self.primary, APP, shuffle)


@pytest_asyncio.fixture
async def trio() -> AsyncIterator[Trio]:
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    port = free_port(hosts)
    proxy = FaultProxy("127.0.0.7", f"127.0.0.2:{port}")
    paddr = await proxy.start()
    peers = ",".join([f"127.0.0.1:{port}", paddr, f"127.0.0.3:{port}"])
    flags = [[*FLAGS, "--peers", peers, *(["--advertise", paddr] if h == hosts[1] else [])] for h in hosts]
    # a small pool, so a relayed read also spills on the way (pushes wait for memory, reads do not)
    starts = [asyncio.to_thread(start_daemon, h, port, "16M", f) for h, f in zip(hosts, flags, strict=True)]
    daemons = list(await asyncio.gather(*starts, return_exceptions=True))
    try:
        assert all(isinstance(d, DaemonProcess) for d in daemons), daemons
        yield Trio([d for d in daemons if isinstance(d, DaemonProcess)], proxy, paddr)
    finally:
        await proxy.close()
        for d in daemons:
            if isinstance(d, DaemonProcess):
                await asyncio.to_thread(d.stop)


async def _cut_read(
    trio: Trio, shuffle: int, relay: str, nth: int, spill: tuple[bool, bool], span: tuple[int, int] = (0, PARTS)
) -> None:
    """Attempts on b and on its first candidate (`spill`: whether each holds the first half of every pair
    on disk); a read of partitions `span` relayed by `relay` loses b's link `nth` buffers in and must
    resume on the copy."""
    a, b, c = trio.daemons
    copy = trio.copies(shuffle)[0]
    for attempt in ATTEMPTS:
        await _push(b.addr, shuffle, attempt, spill_midway=spill[0])
        await _push(copy, shuffle, attempt, spill_midway=spill[1])
    trio.proxy.cut()  # the next read dials b anew, through the faults below
    trio.proxy.down = Faults(mark=Mark(FrameType.BUFFER_RESPONSE, nth, 1000, "cut"))
    resumed = (await _stats(copy))["failover"]["resumed_reads"]  # type: ignore[index]
    async with await AsyncClient.connect(relay) as client:
        assert await _read(client, shuffle, trio.primary, ATTEMPTS, *span) == _want(ATTEMPTS, *span)
        assert trio.proxy.down.fired.is_set()
        failover = (await client.stats())["failover"]
        assert failover["tries"].get("CONNECTION_LOST", 0) >= 1 and failover["recovered"] >= 1, failover
    assert (await _stats(copy))["failover"]["resumed_reads"] > resumed  # type: ignore[index]
    await _settled([a.addr, b.addr, c.addr])


@within(60)
async def test_a_cut_link_resumes_on_the_copy_without_a_byte_twice_or_missing(trio: Trio) -> None:
    a, _, c = trio.daemons
    # A location's stream goes attempt by attempt; a pair of 256 KiB written in two halves is about ten
    # buffers of packed groups, so buffer n of a read of [0, 3) is in attempt 1's partition n // 10.
    for shuffle, relay_is_copy, nth, spill, span in (
        # a copy elsewhere, cut in partition 0's pair, all in memory
        (1, False, 5, (False, False), (0, PARTS)),
        # cut in partition 2's pair, resumed across the copy's disk/memory split
        (2, False, 21, (True, True), (0, PARTS)),
        # the relaying daemon holds the copy: resumed from its own store, spilled pieces read back
        (3, True, 13, (False, True), (0, PARTS)),
        # a range that starts past partition 0 (as AQE's coalesced reads do), cut in its second pair
        (4, False, 12, (True, False), (1, PARTS)),
    ):
        copy = trio.copies(shuffle)[0]
        other = next(d.addr for d in (a, c) if d.addr != copy)
        await _cut_read(trio, shuffle, copy if relay_is_copy else other, nth, spill, span)
    async with await AsyncClient.connect(a.addr) as client:
        await client.remove_application(APP)
    await _settled([d.addr for d in trio.daemons])


@within(60)
async def test_a_lost_primary_is_read_from_its_copies_and_without_one_the_first_error_stays() -> None:
    """b is killed after commit: reads relayed by either other daemon get its copy's bytes, or b's error
    when it had none; b restarted without its data fails a client's read over to the copy itself, and
    answers a relayed read with PARTITION_NOT_FOUND, which fails over too. A copy refusing the read (bound
    to another token) is skipped like a missing one."""

    with Cluster(3, pool_size="16M", extra=FLAGS) as cluster:
        _, b, _ = cluster.daemons
        names = [d.addr for d in cluster.daemons]
        copy, other = candidates(names, {}, b.addr, APP, 0)
        await _push(b.addr, 0, 1)
        await _push(copy, 0, 1, spill_midway=True)
        await _push(b.addr, 0, 2)  # no copy anywhere
        async with await AsyncClient.connect(copy) as c0:
            await c0.flush(APP, 0)  # the copy's own read goes through the disk path too
        keyed_copy, keyed_relay = candidates(names, {}, b.addr, KEYED, 0)
        for addr, secret in ((b.addr, "one"), (keyed_copy, "two")):  # the copy is bound to another token
            async with await AsyncClient.connect(addr, app_secret=secret) as c0:
                w = await c0.open_writer(KEYED, 0, 0, 1, 1)
                await w.write(0, payload(1, 0, SIZE))
                await w.commit()
        b.proc.kill()
        await asyncio.to_thread(b.proc.wait)
        # The copy answers AUTH_FAILED, an error about that copy: the read goes on to the next candidate
        # (the relay, which lacks it) and ends with b's error, a fetch failure (Spark recomputes).
        async with await AsyncClient.connect(keyed_relay, app_secret="one") as client:
            with pytest.raises(ShuffledError) as err:
                async with client.read(KEYED, 0, 0, 1, {b.addr: [1]}) as r:
                    await r.read_all()
            assert err.value.code is ErrorCode.PEER_UNAVAILABLE and err.value.fetch_failure, err.value
        for relay in (other, copy):
            async with await AsyncClient.connect(relay) as client:
                assert await _read(client, 0, b.addr, [1]) == _want([1])
                with pytest.raises(ShuffledError) as err:
                    await _read(client, 0, b.addr, [2])
                assert err.value.code is ErrorCode.PEER_UNAVAILABLE and err.value.fetch_failure, err.value
                # tries count every copy looked for; the read of attempt 1 recovered, attempt 2's did not
                failover = (await client.stats())["failover"]
                assert failover["exhausted"] >= 1 and failover["tries"]["PEER_UNAVAILABLE"] >= 2, failover
                assert failover["recovered"] >= 1, failover
        # b comes back on its address with an empty data dir (a crash lost what was in memory)
        host, port = b.addr.split(":")
        flags = ["--data-dir", tempfile.mkdtemp(), "--peers", ",".join(names), *FLAGS]
        cluster.daemons[1] = await asyncio.to_thread(start_daemon, host, int(port), "16M", flags)
        async with await AsyncClient.connect(b.addr) as client:
            assert await _read(client, 0, "", [1]) == _want([1])
            assert await _read(client, 0, b.addr, [1]) == _want([1])
            with pytest.raises(ShuffledError) as err:
                await _read(client, 0, "", [2])
            assert err.value.code is ErrorCode.PARTITION_NOT_FOUND, err.value
        # Relayed by the copy, over the connection b just made to it: b answers PARTITION_NOT_FOUND.
        async with await AsyncClient.connect(copy) as client:
            assert await _read(client, 0, b.addr, [1]) == _want([1])
            assert (await client.stats())["failover"]["tries"]["PARTITION_NOT_FOUND"] >= 1
            await client.remove_application(APP)
        await _settled(names)


@within(60)
async def test_a_search_for_a_copy_ends_within_the_failover_timeout(trio: Trio) -> None:
    """c is killed and its first candidate is b, whose link now swallows everything (a dial there would
    wait the whole connect timeout): the read fails with c's error once the search took failover-timeout."""

    a, _, c = trio.daemons
    names = trio.names()
    shuffle = next(s for s in range(100) if candidates(names, {}, c.addr, APP, s)[0] == trio.primary)
    await _push(c.addr, shuffle, 1)
    c.proc.kill()
    await asyncio.to_thread(c.proc.wait)
    trio.proxy.cut()
    trio.proxy.up = Faults(blackhole=True)
    async with await AsyncClient.connect(a.addr) as client:
        started = time.monotonic()
        with pytest.raises(ShuffledError) as err:
            await _read(client, shuffle, c.addr, [1])
        waited = time.monotonic() - started
        assert err.value.code is ErrorCode.PEER_UNAVAILABLE, err.value
        assert FAILOVER_TIMEOUT * 0.8 <= waited <= FAILOVER_TIMEOUT + 2, waited
        failover = (await client.stats())["failover"]
        assert failover["exhausted"] == 1 and failover["recovered"] == 0, failover
        await pool_settled(client)
