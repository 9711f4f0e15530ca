"""Memory a client can make a daemon hold without holding any itself: answers it never reads, and groups
shaped to grow what the daemon caches per shape. Each is bounded (a daemon's RSS grows by far less than
what the client asked for) and the daemon keeps serving everyone else."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import pytest

from shuffled.protocol import codec
from shuffled.protocol.frames import (
    AdminRequest,
    CommitMapOutput,
    Hello,
    HelloAck,
    OpenMapOutput,
    PartitionRequest,
    PushCredit,
    Role,
)
from shuffled.protocol.packed import group_bytes
from shuffled_client import AsyncClient, InvalidRequest
from tests.aio import within
from tests.cluster import Cluster, DaemonProcess, pool_settled, rss, start_daemon, wait_until
from tests.integration.test_bad_input import Raw, _still_serving
from tests.integration.test_packed_reads import push_groups
from tests.units import MiB

APP = "hostile"
#: partitions of each map output the unread-answers client commits: each CommitAck is 8 MB
WIDE = 1_000_000


def _unread_commits(addr: str, outputs: int, shuffle: int = 1) -> socket.socket:
    """A client that opens `outputs` map outputs of `WIDE` partitions, reads their push credit, then commits
    them all, empty, in one send, and never reads again: 2.7 KB of requests for 8 MB of answers each."""
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    got = bytearray()

    def frames(n: int) -> list[Any]:
        """The next n frames."""
        while True:
            decoded: list[Any] = []
            at = 0
            while len(got) - at >= 12 and len(got) - at >= 12 + int.from_bytes(got[at : at + 4], "big"):
                end = at + 12 + int.from_bytes(got[at : at + 4], "big")
                decoded.append(codec.decode_all(bytes(got[at:end]))[0])
                at = end
                if len(decoded) == n:
                    del got[:at]
                    return decoded
            got.extend(sock.recv(65536))

    sock.sendall(codec.encode(Hello(Role.CLIENT)))
    assert isinstance(frames(1)[0], HelloAck)
    sock.sendall(b"".join(codec.encode(OpenMapOutput(w, APP, shuffle, w, w, WIDE)) for w in range(1, outputs + 1)))
    credits = frames(outputs)
    assert all(isinstance(f, PushCredit) for f in credits), credits
    sock.sendall(b"".join(codec.encode(CommitMapOutput(w, 0)) for w in range(1, outputs + 1)))
    return sock


def _cut_off(d: DaemonProcess) -> int:
    return sum("connection closed" in line and "unsent-timeout" in line for line in d.log)


@within(90)
async def test_a_client_that_never_reads_its_commit_acks_is_held_back_then_cut_off() -> None:
    """32 CommitAcks of 8 MB nobody reads: the daemon answers until `max-unsent-per-connection` is unsent,
    holds the other commits back, and closes the connection once none of it was read for `unsent-timeout`
    (the daemon grew by 288 MiB before the bound)."""
    d = start_daemon("127.0.0.1", 0, "16M", ["--unsent-timeout", "3"])
    try:
        before = peak = rss(d.pid)
        sock = await asyncio.to_thread(_unread_commits, d.addr, 32)

        async def sample() -> bool:
            nonlocal peak
            peak = max(peak, rss(d.pid))
            return _cut_off(d) > 0

        await wait_until(sample, bool, 60, "the connection closed for its unread answers")
        assert peak - before < 100 * MiB, f"RSS grew by {(peak - before) / MiB:.0f} MiB"
        sock.close()
        await _still_serving(d.addr)
    finally:
        d.stop()


def _send_until_refused(sock: socket.socket, frames: list[bytes]) -> None:
    """Send the frames (stopping if the daemon resets the connection: after a fatal error it reads on
    only to drop what comes, for a while)."""
    with contextlib.suppress(OSError):
        for frame in frames:
            sock.sendall(frame)


@within(90)
async def test_requests_held_back_for_unread_answers_are_bounded_in_bytes() -> None:
    """A client whose answers wait unread has its next requests held back, in order; they were bounded only
    by count (65,536): 256 admin requests of 180 KB (a list of 60,000 numbers each, 2 MB decoded), held
    back, grew the daemon by 175 MiB and more. It is cut off with LIMIT_EXCEEDED once 2 MiB of them wait,
    the daemon keeps its RSS within 100 MiB (24 MB of it the unread answers), and it serves everyone
    else."""
    flags = ["--max-unsent-per-connection", "16M", "--unsent-timeout", "60"]
    d = start_daemon("127.0.0.1", 0, "16M", flags)
    try:
        before = peak = rss(d.pid)
        sock = await asyncio.to_thread(_unread_commits, d.addr, 3)
        pad = {"pad": list(range(1000, 61_000))}
        frames = [codec.encode(AdminRequest(2 * i + 1, "stats", pad)) for i in range(256)]
        sending = asyncio.ensure_future(asyncio.to_thread(_send_until_refused, sock, frames))

        async def sample() -> bool:
            nonlocal peak
            peak = max(peak, rss(d.pid))
            return sending.done()

        await wait_until(sample, bool, 60, "the requests sent or refused")
        assert peak - before < 100 * MiB, f"RSS grew by {(peak - before) / MiB:.0f} MiB"
        line = await asyncio.to_thread(d.logged, "connection closed", "bytes of requests wait")
        assert "LIMIT_EXCEEDED" in line, line
        sock.close()
        await _still_serving(d.addr)
    finally:
        d.stop()


@within(120)
async def test_many_connections_that_never_read_share_one_bound() -> None:
    """Five such clients, each committing three (120 MB of answers), together hold at most `max-unsent` (16 MiB
    here) and what one connection's read asked for beyond it (twelve grew a daemon by 312 MiB); each is closed
    once unread for `unsent-timeout`, and the next ones are served as the memory comes back."""
    flags = ["--max-unsent-per-connection", "16M", "--max-unsent", "16M", "--unsent-timeout", "2"]
    d = start_daemon("127.0.0.1", 0, "16M", flags)
    try:
        before = peak = rss(d.pid)
        socks = [await asyncio.to_thread(_unread_commits, d.addr, 3, shuffle) for shuffle in range(5)]

        async def sample() -> int:
            nonlocal peak
            peak = max(peak, rss(d.pid))
            return _cut_off(d)

        await wait_until(sample, lambda n: n >= 3, 60, "the connections holding answers closed")
        assert peak - before < 100 * MiB, f"RSS grew by {(peak - before) / MiB:.0f} MiB"
        for sock in socks:
            sock.close()
        await _still_serving(d.addr)
    finally:
        d.stop()


@within(120)
@pytest.mark.parametrize("replicas", [1, 2])
async def test_clients_that_read_get_every_answer_however_many_at_once(replicas: int) -> None:
    """A client that reads, committing 24 map outputs of 200,000 partitions at once on one connection (38 MB
    of CommitAcks, over an 8 MiB bound), gets every one: the commits beyond the bound wait for the answers
    before them to be read, they are not refused; with two copies the replica's answers on the peer link
    wait the same way, and the link lives on (a hard bound cut both)."""
    flags = ["--max-unsent-per-connection", "8M", "--replicas", str(replicas)]
    with Cluster(2, "64M", flags) as cluster:
        c = await AsyncClient.connect(cluster.daemons[0].addr)
        writers = [await c.open_writer(APP, 1, m, m, 200_000) for m in range(24)]
        for m, w in enumerate(writers):
            await w.write(m % 7, b"x" * 100)
        lengths = await asyncio.gather(*(w.commit() for w in writers))
        assert [sum(n) for n in lengths] == [100] * 24
        assert (await c.stats())["errors"].get("LIMIT_EXCEEDED", 0) == 0
        await c.remove_application(APP)
        await c.close()


def _group(attempt: int, runs: int) -> bytes:
    """A group of `runs` 1-byte runs of partitions 0..runs-1 (under 32 KiB for up to 3,600 runs)."""
    return group_bytes(attempt, [(p, b"x") for p in range(runs)])


@within(120)
async def test_relaying_groups_of_many_run_counts_does_not_grow_a_cache_per_count() -> None:
    """A relay walks every group it forwards; groups of 512 different run counts of about 3,000 runs grew
    the relaying daemon by ~100 MiB of cached struct formats before their cache was bounded in bytes."""
    with Cluster(2) as cluster:
        a, b = cluster.daemons
        partitions = 3600
        #: per shuffle, the run count of each attempt's one group: 8 shapes again and again, then 512 shapes
        shapes = {1: [3000 + i % 8 for i in range(512)], 2: list(range(3000, 3512))}
        pusher = await AsyncClient.connect(b.addr)
        for shuffle, runs in shapes.items():
            for attempt, n in enumerate(runs, 1):
                w = await pusher.open_writer(APP, shuffle, attempt, attempt, partitions)
                await push_groups(w, [_group(attempt, n)])
                await w.commit()
        reader = await AsyncClient.connect(a.addr)

        async def relay(shuffle: int) -> int:
            got = 0
            async with reader.read(APP, shuffle, 0, partitions, {b.addr: list(range(1, 513))}) as r:
                async for g in r.groups():
                    got += len(g.data)
            return got

        assert await relay(1) == sum(shapes[1])  # as many groups of 8 shapes: touches the pool alike
        before = rss(a.pid)
        assert await relay(2) == sum(shapes[2])
        grown = rss(a.pid) - before
        assert grown < 20 * MiB, f"the relaying daemon grew by {grown / MiB:.0f} MiB"
        await reader.remove_application(APP)
        await reader.close()
        await pusher.close()


@within(90)
async def test_reads_never_consumed_hold_the_read_reserve_only() -> None:
    """A tenant's relayed reads that it never consumes (credit 0) took all 512 segments of a memory-only
    daemon, and another application's push there waited with no error for as long as that connection
    stayed. Reads hold the read reserve only (their exclusive buffers three quarters of it): the other
    push is stored at once (within the test's bound, against a 120 s push-wait-timeout)."""
    with Cluster(2, "16M", ["--data-dir", "none"]) as cluster:
        x, y = cluster.daemons
        owner = await AsyncClient.connect(x.addr)
        w = await owner.open_writer("hog", 1, 0, 1, 1)
        await w.write(0, b"h" * 200_000)
        await w.commit()
        raw = await Raw.open(y.addr)
        await raw.hello()
        for i in range(300):  # each read's exclusive buffers; their data never asked for
            await raw.send(codec.encode(PartitionRequest(2 * i + 1, 0, "hog", 1, 0, 1, {x.addr: [1]})))
        watcher = await AsyncClient.connect(y.addr)
        pool = (await watcher.stats())["pool"]
        exclusive = pool["reserve"] - pool["reserve"] // 4
        held = await wait_until(
            watcher.stats, lambda s: s["pool"]["reading"] >= exclusive, 30, "the reads holding what they may"
        )
        assert held["pool"]["reading"] <= pool["reserve"] and held["pool"]["waiting"] > 0, held["pool"]
        victim = await AsyncClient.connect(y.addr)
        vw = await victim.open_writer("victim", 1, 0, 1, 1)
        await vw.write(0, b"v" * MiB)
        assert await vw.commit() == [MiB]
        raw.writer.close()
        await victim.remove_application("victim")
        await pool_settled(watcher)
        await owner.remove_application("hog")
        for c in (owner, watcher, victim):
            await c.close()


@within(60)
async def test_applications_left_holding_nothing_are_dropped() -> None:
    """Map outputs opened under many application ids, none committed, and the connection gone: the ids and
    their usage went only with `app-ttl` (24 h), 128 MiB for 128 ids of 1 MiB. They go at once now, and an
    id longer than 255 bytes is refused."""
    d = start_daemon("127.0.0.1", 0, "16M")
    try:
        c = await AsyncClient.connect(d.addr)
        with pytest.raises(InvalidRequest, match="1 to 255 bytes"):
            await c.open_writer("x" * 256, 1, 0, 1, 1)
        writers = [await c.open_writer(f"left-{i}", 1, 0, 1, 1) for i in range(20)]
        assert (await c.stats())["store"]["applications"] == 20
        for w in writers:
            await w.abort()
        await wait_until(c.stats, lambda s: s["store"]["applications"] == 0, 10, "the empty applications dropped")
        await c.close()
    finally:
        d.stop()


@within(60)
async def test_a_read_naming_an_overlong_application_id_is_refused_without_echoing_it() -> None:
    """3,000 reads naming a 60,000-byte application id, never read, grew a daemon by 162 MiB: each answer
    repeated the id. A read's id is held to the 255 bytes a push's is, and the refusal does not repeat it."""
    d = start_daemon("127.0.0.1", 0, "16M", ["--data-dir", "none"])
    try:
        c = await AsyncClient.connect(d.addr)
        with pytest.raises(InvalidRequest, match="application id must be 1 to 255 bytes") as refused:
            async with c.read("x" * 60_000, 1, 0, 1, {"": [1]}) as reader:
                await reader.read_all()
        assert len(str(refused.value)) < 200
        await c.close()
        await _still_serving(d.addr)
    finally:
        d.stop()
