"""Replicated pushes (PROTOCOL.md §12.4) between real daemons: the primary forwards every pushed buffer to
its replicas, which commit before it does; a slow replica slows the pusher, a lost one fails the attempt."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shuffled.protocol.frames import OpenMapOutput
from shuffled_client import AsyncClient
from shuffled_client.aio import MapWriter
from tests.cluster import Cluster, cluster_fixture, payload, pool_settled

pytestmark = pytest.mark.asyncio

APP = "app-replica"
MiB = 1 << 20
REPLICATED = ["--replicas", "2"]

pair = cluster_fixture(2, pool_size="64M", extra=REPLICATED)


async def push(client: AsyncClient, shuffle: int, attempt: int, sizes: list[int], app: str = APP) -> None:
    w = await client.open_writer(app, shuffle, 0, attempt, len(sizes))
    for p, size in enumerate(sizes):
        data = payload(attempt, p, size)
        for i in range(0, size, MiB):
            await w.write(p, data[i : i + MiB])
    assert await w.commit() == sizes


async def read_local(client: AsyncClient, shuffle: int, partitions: int, attempts: list[int]) -> list[bytes]:
    """Each partition as the client's own daemon holds it (a replica serves its copy like any data)."""
    out = []
    for p in range(partitions):
        async with client.read(APP, shuffle, p, p + 1, {"": attempts}) as reader:
            out.append(await reader.read_all())
    return out


async def open_raw(client: AsyncClient, **keys: Any) -> None:
    """Open a push with OpenMapOutput keys the client API does not send; returns at the first credit."""
    proto = client._proto()
    w = MapWriter(client, proto.new_stream_id(), 1)
    client._writers[w.stream.stream] = w
    proto.open_push(OpenMapOutput(w.stream.stream, APP, 99, 0, 1, 1, **keys), w.stream)
    await w._opened


async def test_a_push_is_committed_on_both_daemons_with_identical_bytes(pair: Cluster) -> None:
    async def body() -> None:
        da, db = pair.daemons
        a, b = await AsyncClient.connect(da.addr), await AsyncClient.connect(db.addr)
        sizes = [3 * MiB, 0, 100_000, 5 * MiB + 17]
        await push(a, 1, 7, sizes)
        sa, sb = await a.stats(), await b.stats()
        assert sb["store"]["replica_attempts"] == 1 and sb["store"]["replica_bytes"] == sum(sizes), sb["store"]
        assert sa["store"]["replica_attempts"] == 0 and sa["store"]["under_replicated"] == 0, sa["store"]
        assert sa["replication"]["forwarded_bytes"] == sum(sizes), sa["replication"]
        expected = [payload(7, p, n) for p, n in enumerate(sizes)]
        assert await read_local(b, 1, len(sizes), [7]) == expected
        assert await read_local(a, 1, len(sizes), [7]) == expected
        await a.unregister_shuffle(APP, 1)  # propagated: the replica goes too
        for c in (a, b):
            s = await pool_settled(c)
            assert s["store"]["stored_segments"] == 0 and s["store"]["replica_attempts"] == 0, s["store"]
            await c.close()

    await asyncio.wait_for(body(), 60)
