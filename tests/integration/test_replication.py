"""Replicated pushes (PROTOCOL.md §12.4) between real daemons: the primary forwards every pushed buffer to
its replicas, which commit before it does; a slow replica slows the pusher, a lost one fails the attempt."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from shuffled.launch import free_port
from shuffled.protocol import codec
from shuffled.protocol.errors import AuthFailed, ErrorCode, InvalidRequest, PeerUnavailable
from shuffled.protocol.frames import REPLICA, ErrorResponse, Hello, HelloAck, OpenMapOutput, Role
from shuffled.server.cluster.replica_ring import candidates
from shuffled_client import AsyncClient, MapWriter
from tests.aio import within
from tests.cluster import Cluster, cluster_fixture, payload, pool_settled, start_daemon, wait_until
from tests.integration.test_bad_input import Raw
from tests.shuffles import push
from tests.units import MiB

APP = "app-replica"
REPLICATED = ["--replicas", "2"]

pair = cluster_fixture(2, pool_size="64M", extra=REPLICATED)


async def read_local(client: AsyncClient, shuffle: int, partitions: int, attempts: list[int]) -> list[bytes]:
    """Each partition as the client's own daemon holds it (a replica serves its copy like any data)."""
    out = []
    for p in range(partitions):
        async with client.read(APP, shuffle, p, p + 1, {"": attempts}) as reader:
            out.append(await reader.read_all())
    return out


async def open_raw(client: AsyncClient, **keys: Any) -> None:
    """Open a push with OpenMapOutput keys the client API does not send; returns at the first credit."""
    proto = client.session.proto
    w = MapWriter(client.session, proto.streams.new_id(), 1, 1)
    client.session.add_writer(w.stream.stream, w)
    proto.open_push(OpenMapOutput(w.stream.stream, APP, 99, 0, 1, 1, **keys), w.stream)
    await w._opened


@within(60)
async def test_a_push_is_committed_on_both_daemons_with_identical_bytes(pair: Cluster) -> None:
    da, db = pair.daemons
    a, b = await AsyncClient.connect(da.addr), await AsyncClient.connect(db.addr)
    sizes = [3 * MiB, 0, 100_000, 5 * MiB + 17]
    await push(a, APP, 1, 7, sizes)
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


@within(60)
async def test_the_replica_refuses_a_push_whose_app_key_is_not_the_applications(pair: Cluster) -> None:
    """A primary bound to another token forwards that token's digest: the replica, still bound to the first
    application's, refuses it, and the client's push fails with AUTH_FAILED. Removing the application
    frees its replica data too."""

    da, db = pair.daemons
    a1 = await AsyncClient.connect(da.addr, app_secret="one")
    b1 = await AsyncClient.connect(db.addr, app_secret="one")
    b2 = await AsyncClient.connect(db.addr, app_secret="two")
    await push(a1, "keyed", 2, 1, [MiB])  # bound to "one" on both daemons
    await b1.remove_application("keyed", propagate=False)  # only B forgets it
    commits = [(await c.stats())["store"]["commits"] for c in (a1, b1)]
    with pytest.raises(AuthFailed):
        await push(b2, "keyed", 2, 2, [MiB])  # B binds "two"; A still holds "keyed" for "one"
    assert [(await c.stats())["store"]["commits"] for c in (a1, b1)] == commits
    await b2.remove_application("keyed", propagate=False)
    await push(b1, "keyed", 3, 3, [2 * MiB])  # "one" again: replicated to A
    assert (await a1.stats())["store"]["replica_attempts"] == 1
    await a1.remove_application("keyed")  # propagated: B's data and A's replica go
    for c in (a1, b1):
        s = await pool_settled(c)
        assert s["store"]["stored_segments"] == 0 and s["store"]["replica_attempts"] == 0, s["store"]
    for c in (a1, b1, b2):
        await c.close()


@within(30)
async def test_a_client_may_not_send_replica_keys(pair: Cluster) -> None:
    a = await AsyncClient.connect(pair.daemons[0].addr)
    with pytest.raises(InvalidRequest, match="daemons only"):
        await open_raw(a, replica_of=pair.daemons[1].addr)
    with pytest.raises(InvalidRequest, match="daemons only"):
        await open_raw(a, app_key="")
    assert (await pool_settled(a))["store"]["open_map_outputs"] == 0  # the connection lives on
    await a.close()


@within(30)
async def test_a_replica_push_without_app_key_is_refused_and_binds_nothing(pair: Cluster) -> None:
    """Taken as "no token", it would bind an unbound application so: a client with a token is then locked
    out, and one without could read the data."""

    da = pair.daemons[0]
    node = "127.0.0.9:1"  # a daemon of its own (da may already dial db)
    raw = await Raw.open(da.addr)
    info = {"node": node, "segment_size": 32 << 10, "features": [REPLICA]}
    await raw.send(codec.encode(Hello(Role.DAEMON, info=info)))
    assert isinstance(await raw.frame(), HelloAck)
    await raw.send(codec.encode(OpenMapOutput(1, "unbound", 1, 0, 1, 1, replica_of=node)))
    err = await raw.frame()
    assert isinstance(err, ErrorResponse) and (err.stream, err.code) == (1, ErrorCode.INVALID_REQUEST), err
    raw.writer.close()
    keyed = await AsyncClient.connect(da.addr, app_secret="one")
    await push(keyed, "unbound", 1, 1, [MiB])  # still unbound: it binds to "one"
    await keyed.remove_application("unbound")
    await keyed.close()


@within(90)
async def test_a_stopped_replica_holds_the_pusher_back_and_it_completes_when_resumed(pair: Cluster) -> None:
    """With the replica SIGSTOPped the primary stops granting credit once `replica-lag` buffers wait: the
    writer waits (its bytes are not taken), memory does not grow; after SIGCONT the push commits on both."""

    da, db = pair.daemons
    a, b = await AsyncClient.connect(da.addr), await AsyncClient.connect(db.addr)
    total = 48 * MiB
    data = payload(4, 0, total)
    before = (await a.stats())["traffic"]["pushed_bytes"]
    w = await a.open_writer(APP, 4, 0, 4, 1)
    await w.write(0, data[:MiB])

    async def rest() -> list[int]:
        for i in range(MiB, total, MiB):
            await w.write(0, data[i : i + MiB])
        return await w.commit()

    os.kill(db.pid, signal.SIGSTOP)
    try:
        writing = asyncio.create_task(rest())
        s = await wait_until(
            a.stats,
            lambda s: s["replication"]["held_back"] == 1 and s["credit"]["push_outstanding"] == 0,
            what="the pusher is held back by the stopped replica",
        )
        assert not writing.done()
        # Taken before the replica stopped, or queued to it while it was stopping (credit it had granted,
        # the sockets' buffers, `replica-lag`): a few MiB of the 48 (about 1.5 when this was written).
        assert s["traffic"]["pushed_bytes"] - before < 8 * MiB, s["traffic"]
        assert s["pool"]["used"] <= s["store"]["stored_segments"] + 64, s["pool"]
    finally:
        os.kill(db.pid, signal.SIGCONT)
    assert await writing == [total]
    assert await read_local(b, 4, 1, [4]) == [data]
    await a.unregister_shuffle(APP, 4)
    for c in (a, b):
        assert (await pool_settled(c))["store"]["stored_segments"] == 0
        await c.close()


@within(30)
async def test_a_client_abort_or_vanishing_aborts_the_replica_push(pair: Cluster) -> None:
    da, db = pair.daemons
    a, b = await AsyncClient.connect(da.addr), await AsyncClient.connect(db.addr)
    aborts = (await b.stats())["store"]["aborts"]
    w = await a.open_writer(APP, 8, 0, 1, 1)
    await w.write(0, payload(1, 0, 2 * MiB))
    await w.abort()
    await wait_until(b.stats, lambda s: s["store"]["aborts"] == aborts + 1, what="the replica push aborted")
    gone = await AsyncClient.connect(da.addr)
    w = await gone.open_writer(APP, 8, 0, 2, 1)
    await w.write(0, payload(2, 0, 2 * MiB))
    await wait_until(b.stats, lambda s: s["streams"]["pushing"] == 1, what="the replica push is open")
    await gone.close()
    await wait_until(b.stats, lambda s: s["store"]["aborts"] == aborts + 2, what="the replica push aborted")
    for c in (a, b):
        s = await pool_settled(c)
        assert s["store"]["stored_segments"] == 0 and s["store"]["open_map_outputs"] == 0, s["store"]
        await c.close()


@pytest.fixture
def trio() -> Iterator[Cluster]:
    with Cluster(3, pool_size="64M", extra=REPLICATED) as cluster:
        yield cluster


@within(90)
async def test_replica_down_restarted_or_killed(trio: Cluster) -> None:
    """The first candidate down at open → the next one takes the copy; a restarted replica keeps its
    marking; a replica killed mid-push fails the attempt with PEER_UNAVAILABLE and nothing is committed on
    the primary; with no replica left the push degrades (counted); a primary killed mid-push leaves
    nothing on its replica."""

    d0 = trio.daemons[0]
    shuffle = 5
    order = candidates([d.addr for d in trio.daemons], {}, d0.addr, APP, shuffle)
    first, second = (next(d for d in trio.daemons if d.addr == node) for node in order)
    first.stop()
    a = await AsyncClient.connect(d0.addr)
    await push(a, APP, shuffle, 1, [2 * MiB, MiB])
    held = sum((2 * MiB, MiB))

    # The copy went to the second candidate; restarted, it still knows it holds a replica.
    second.stop()
    restarted = start_daemon(second.host, second.port, "64M", ["--peers", peers(trio), *REPLICATED])
    trio.daemons[trio.daemons.index(second)] = restarted
    r = await AsyncClient.connect(restarted.addr)
    assert (await r.stats())["store"]["replica_bytes"] == held
    assert await read_local(r, shuffle, 2, [1]) == [payload(1, 0, 2 * MiB), payload(1, 1, MiB)]

    # Killed mid-push: the attempt fails, nothing of it stays on the primary.
    w = await a.open_writer(APP, shuffle, 0, 2, 2, buffer_size=0)  # every write pushed at once
    await w.write(0, payload(2, 0, 4 * MiB))
    await wait_until(r.stats, lambda s: s["traffic"]["pushed_bytes"] > 0, what="the replica receives")
    restarted.proc.kill()
    with pytest.raises(PeerUnavailable):
        for _ in range(64):
            await w.write(0, payload(2, 0, MiB))
        await w.commit()
    s = await pool_settled(a)
    assert s["store"]["commits"] == 1 and s["store"]["open_map_outputs"] == 0, s["store"]
    assert s["replication"]["failed"] == 1, s["replication"]

    # No candidate left: the push goes on with this copy only, counted.
    await push(a, APP, shuffle, 3, [MiB, 0])
    s = await a.stats()
    assert s["replication"]["degraded"] == 1 and s["store"]["under_replicated"] == 1, s

    # Restarted, the primary still knows which attempts lack copies (the journal keeps `r` and `copies`).
    await a.close()
    d0.stop()
    d0 = start_daemon(d0.host, d0.port, "64M", ["--peers", peers(trio), *REPLICATED])
    trio.daemons[0] = d0
    a = await AsyncClient.connect(d0.addr)
    s = await a.stats()
    assert s["store"]["under_replicated"] == 1 and s["store"]["commits"] == 0, s["store"]

    # The primary killed mid-push: its replica aborts the copy and frees its memory.
    back = start_daemon(first.host, first.port, "64M", ["--peers", peers(trio), *REPLICATED])
    trio.daemons[trio.daemons.index(first)] = back
    f = await AsyncClient.connect(back.addr)
    w = await a.open_writer(APP, shuffle, 0, 4, 2, buffer_size=0)
    await w.write(0, payload(4, 0, 4 * MiB))
    await wait_until(f.stats, lambda s: s["traffic"]["pushed_bytes"] > 0, what="the replica receives")
    d0.proc.kill()
    s = await pool_settled(f)
    assert s["store"]["commits"] == 0 and s["store"]["stored_segments"] == 0, s["store"]
    for c in (a, r, f):
        await c.close()


@within(60)
async def test_a_replica_back_after_its_primary_was_lost_serves_the_reads(trio: Cluster) -> None:
    """Restart and rejoin: the replica is stopped (its copy goes to its data dir), the primary is killed,
    the replica comes back on its data dir; a read naming the lost primary, relayed by the third daemon,
    gets the exact bytes from the replica that came back."""

    names = [d.addr for d in trio.daemons]
    shuffle = 7
    primary = trio.daemons[0]
    replica = next(d for d in trio.daemons if d.addr == candidates(names, {}, primary.addr, APP, shuffle)[0])
    relay = next(d for d in trio.daemons if d not in (primary, replica))
    sizes = [MiB, 2 * MiB]
    async with await AsyncClient.connect(primary.addr) as a:
        await push(a, APP, shuffle, 1, sizes)
    await asyncio.to_thread(replica.stop)
    primary.proc.kill()
    await asyncio.to_thread(primary.proc.wait)
    back = await asyncio.to_thread(
        start_daemon, replica.host, replica.port, "64M", ["--peers", peers(trio), *REPLICATED]
    )
    trio.daemons[trio.daemons.index(replica)] = back
    async with await AsyncClient.connect(relay.addr) as r:
        for p, size in enumerate(sizes):
            async with r.read(APP, shuffle, p, p + 1, {primary.addr: [1]}) as reader:
                assert await reader.read_all() == payload(1, p, size)
        assert sum((await r.stats())["failover"]["tries"].values()) >= 1
        await pool_settled(r)


def peers(cluster: Cluster) -> str:
    return ",".join(d.addr for d in cluster.daemons)


@within(30)
async def test_without_a_replica_the_push_fails_with_replica_shortfall_fail() -> None:
    port = free_port(["127.0.0.1", "127.0.0.9"])
    flags = ["--peers", f"127.0.0.1:{port},127.0.0.9:{port}", *REPLICATED, "--replica-shortfall", "fail"]
    d = start_daemon("127.0.0.1", port, "32M", flags)  # nothing listens on 127.0.0.9
    try:
        a = await AsyncClient.connect(d.addr)
        with pytest.raises(PeerUnavailable, match="replica-shortfall"):
            await push(a, APP, 6, 1, [MiB])
        s = await pool_settled(a)
        assert s["store"]["commits"] == 0 and s["replication"]["failed"] == 1, s
        await a.close()
    finally:
        d.stop()


@within(60)
async def test_daemons_replicating_to_each_other_with_full_pools_spill_rather_than_wait_for_each_other() -> None:
    """A's pushes wait for B's replica credit and B's for A's: with pools a fraction of what both hold, the
    spillers make the room (replica sessions are ordinary sessions) and every push commits."""

    with Cluster(2, pool_size="16M", extra=REPLICATED) as cluster:
        clients = [await AsyncClient.connect(d.addr) for d in cluster.daemons]
        size = 12 * MiB
        pushes = [push(c, APP, 9, 10 * i + k, [size, size // 3]) for i, c in enumerate(clients) for k in range(2)]
        await asyncio.gather(*pushes)
        for c in clients:
            s = await c.stats()
            assert s["store"]["replica_bytes"] == 2 * (size + size // 3), s["store"]
            assert s["disk"]["spilled_bytes"] > 0, s["disk"]
            await c.close()
