"""Memory a client can make a daemon hold without holding any itself: answers it never reads, and groups
shaped to grow what the daemon caches per shape. Each is bounded (a daemon's RSS grows by far less than
what the client asked for) and the daemon keeps serving everyone else."""

from __future__ import annotations

import asyncio
import socket

from shuffled.protocol import codec
from shuffled.protocol.frames import CommitMapOutput, Hello, HelloAck, OpenMapOutput, Role
from shuffled.protocol.packed import group_bytes
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import Cluster, rss, start_daemon, wait_until
from tests.integration.test_bad_input import _still_serving
from tests.integration.test_packed_reads import push_groups
from tests.units import MiB

APP = "hostile"
#: partitions of each map output the unread-answers client commits: each CommitAck is 8 MB
WIDE = 1_000_000


def _unread_commits(addr: str, outputs: int) -> socket.socket:
    """A client that commits `outputs` empty map outputs of `WIDE` partitions in one send and never reads
    an answer (the handshake's aside): 2.7 KB of requests for 8 MB of answers each."""
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(codec.encode(Hello(Role.CLIENT)))
    got = b""
    while len(got) < 12 or len(got) < 12 + int.from_bytes(got[:4], "big"):
        got += sock.recv(65536)
    assert isinstance(codec.decode_all(got)[0], HelloAck)
    requests = b"".join(codec.encode(OpenMapOutput(w, APP, 1, w, w, WIDE)) for w in range(1, outputs + 1))
    requests += b"".join(codec.encode(CommitMapOutput(w, 0)) for w in range(1, outputs + 1))
    sock.sendall(requests)
    return sock


@within(90)
async def test_a_client_that_never_reads_its_commit_acks_is_cut_off_not_buffered() -> None:
    """32 CommitAcks of 8 MB nobody reads: the daemon queues at most `max-unsent-per-connection` of them,
    then closes that connection with LIMIT_EXCEEDED (it grew by 288 MiB before the bound)."""
    d = start_daemon("127.0.0.1", 0, "16M")
    try:
        before = peak = rss(d.pid)
        watcher = await AsyncClient.connect(d.addr)
        sock = await asyncio.to_thread(_unread_commits, d.addr, 32)

        def cut_off() -> bool:
            return any("max-unsent-per-connection" in line and "connection closed" in line for line in d.log)

        async def sample() -> bool:
            nonlocal peak
            peak = max(peak, rss(d.pid))
            return cut_off() or (await watcher.stats())["store"]["commits"] == 32

        await wait_until(sample, bool, 60, "the connection closed, or every commit answered")
        assert peak - before < 100 * MiB, f"RSS grew by {(peak - before) / MiB:.0f} MiB"
        assert cut_off(), "the connection that does not read was not closed for it"
        sock.close()
        await watcher.close()
        await _still_serving(d.addr)
    finally:
        d.stop()


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
