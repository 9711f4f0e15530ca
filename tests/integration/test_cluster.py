"""Three real daemons on 127.0.0.1-3: push, read everywhere, filter attempts, clean up."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import psutil
import pytest

from shuffled_client import AsyncClient, PartitionNotFound, PeerUnavailable, ReadChunk
from tests.aio import within
from tests.cluster import Cluster, cluster_fixture, payload, pool_settled

APP = "app-cluster"
PARTITIONS = 6
SEG = 32 << 10
#: sizes per partition: empty, tiny, exactly one segment, several segments, odd sizes
SIZES = [0, 7, SEG, 3 * SEG + 5, 100_000, 1]


cluster = cluster_fixture(3)


async def _connect_all(cluster: Cluster) -> list[AsyncClient]:
    return [await AsyncClient.connect(d.addr) for d in cluster.daemons]


async def _push(client: AsyncClient, shuffle: int, map_index: int, attempt: int, commit: bool = True) -> list[int]:
    w = await client.open_writer(APP, shuffle, map_index, attempt, PARTITIONS)
    for p, size in enumerate(SIZES):
        data = payload(attempt, p, size)
        # uneven write sizes exercise the per-partition batching into segments
        for i in range(0, len(data), 9_000):
            await w.write(p, data[i : i + 9_000])
    if commit:
        return await w.commit()
    await w.abort()
    return []


async def _collect(reader_iter: object) -> dict[tuple[int, int], bytes]:
    got: dict[tuple[int, int], bytearray] = defaultdict(bytearray)
    async for chunk in reader_iter:  # type: ignore[attr-defined]
        assert isinstance(chunk, ReadChunk)
        got[(chunk.attempt, chunk.partition)] += chunk.data
    return {k: bytes(v) for k, v in got.items()}


async def _pair_runs(reader_iter: object) -> list[tuple[int, int]]:
    """The (attempt, partition) pairs in arrival order, one entry per run of consecutive chunks."""
    runs: list[tuple[int, int]] = []
    async for chunk in reader_iter:  # type: ignore[attr-defined]
        if not runs or runs[-1] != (chunk.attempt, chunk.partition):
            runs.append((chunk.attempt, chunk.partition))
    return runs


@within(60)
async def test_every_partition_from_every_daemon_byte_exact(cluster: Cluster) -> None:
    clients = await _connect_all(cluster)
    shuffle = 1
    accepted: dict[str, list[int]] = {}
    for i, (client, d) in enumerate(zip(clients, cluster.daemons, strict=True)):
        attempts = [1000 * (i + 1) + m for m in range(4)]
        for m, attempt in enumerate(attempts):
            lengths = await _push(client, shuffle, 4 * i + m, attempt)
            assert lengths == SIZES
        accepted[d.addr] = attempts
    # Attempts that must never be served: a committed duplicate (speculative
    # loser), an aborted one and one left open.
    await _push(clients[0], shuffle, 0, 9001)
    await _push(clients[1], shuffle, 5, 9002, commit=False)
    loser = await clients[2].open_writer(APP, shuffle, 9, 9003, PARTITIONS)
    await loser.write(0, b"never committed")

    for reader_i, client in enumerate(clients):
        me = cluster.daemons[reader_i].addr
        locations = {("" if addr == me else addr): a for addr, a in accepted.items()}
        for p in range(PARTITIONS):
            got = await _collect(client.read(APP, shuffle, p, p + 1, locations))
            want = {(a, p): payload(a, p, SIZES[p]) for atts in accepted.values() for a in atts if SIZES[p]}
            assert got == want, f"reader at {me}, partition {p}"
        # A whole range in one request.
        got = await _collect(client.read(APP, shuffle, 0, PARTITIONS, locations))
        assert len(got) == 12 * sum(1 for s in SIZES if s)
        assert all(att < 9000 for att, _ in got)
        # One location per request: each pair's chunks arrive together (PROTOCOL.md §10.1), which
        # the Spark reader relies on to read a pair as one stream.
        for where, atts in locations.items():
            runs = await _pair_runs(client.read(APP, shuffle, 0, PARTITIONS, {where: atts}))
            assert len(runs) == len(set(runs)) == len(atts) * sum(1 for s in SIZES if s), runs

    await loser.abort()
    result = await clients[0].unregister_shuffle(APP, shuffle)
    assert set(result["peers"].values()) == {"ok"}
    for c in clients:
        s = await pool_settled(c)
        assert s["store"]["shuffles"] == 0 and s["pool"]["used"] == 0
        await c.close()


@within(60)
async def test_missing_data_gives_clear_per_stream_errors(cluster: Cluster) -> None:
    a, b = await AsyncClient.connect(cluster.daemons[0].addr), await AsyncClient.connect(cluster.daemons[1].addr)
    await _push(b, 2, 0, 77)
    with pytest.raises(PartitionNotFound, match="not held"):
        await _collect(a.read(APP, 999, 0, 1, {"": [1]}))
    with pytest.raises(PartitionNotFound, match="78"):
        await _collect(a.read(APP, 2, 0, 1, {cluster.daemons[1].addr: [77, 78]}))
    # (an attempt no daemon holds: the relaying daemon would find a copy of 77 on b, PROTOCOL.md §10.6)
    with pytest.raises(PeerUnavailable):
        await _collect(a.read(APP, 2, 0, 1, {"127.0.0.9:1": [79]}))
    # The same connections keep working after those errors.
    got = await _collect(a.read(APP, 2, 3, 4, {cluster.daemons[1].addr: [77]}))
    assert got == {(77, 3): payload(77, 3, SIZES[3])}
    await a.remove_application(APP)
    for c in (a, b):
        assert (await pool_settled(c))["pool"]["used"] == 0
        await c.close()


@within(90)
async def test_many_streams_between_two_daemons_share_one_connection(cluster: Cluster) -> None:
    """Reads in both directions at once, many streams each: exactly one TCP connection per pair."""

    da, db = cluster.daemons[0], cluster.daemons[1]
    a, b = await AsyncClient.connect(da.addr), await AsyncClient.connect(db.addr)
    await _push(a, 3, 0, 501)
    await _push(b, 3, 1, 502)
    reads = []
    for _ in range(20):
        for p in range(PARTITIONS):
            reads.append(_collect(a.read(APP, 3, p, p + 1, {db.addr: [502]})))
            reads.append(_collect(b.read(APP, 3, p, p + 1, {da.addr: [501]})))
    results = await asyncio.gather(*reads)
    assert sum(len(r) for r in results) == 2 * 20 * sum(1 for s in SIZES if s)

    def endpoints(pid: int) -> set[tuple[str, int]]:
        return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="tcp") if c.laddr}

    def connections_to(pid: int, other: int) -> int:
        theirs = endpoints(other)
        return sum(
            1
            for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.raddr and (c.raddr.ip, c.raddr.port) in theirs
        )

    assert connections_to(da.pid, db.pid) == 1
    assert connections_to(db.pid, da.pid) == 1
    assert (await a.stats())["connections"]["peers"] >= 1
    await a.unregister_shuffle(APP, 3)
    for c in (a, b):
        await pool_settled(c)
        await c.close()
