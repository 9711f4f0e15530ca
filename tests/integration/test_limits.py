"""Limits and deadlines against a live daemon configured with small bounds: every refusal is an
error naming the setting, on the stream or connection that went over it, and nothing else is hurt."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from shuffled.protocol import codec
from shuffled.protocol.errors import ErrorCode, LimitExceeded
from shuffled.protocol.frames import (
    AdminResponse,
    ErrorResponse,
    Hello,
    HelloAck,
    OpenMapOutput,
    PartitionRequest,
    PushCredit,
    Role,
)
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import Cluster, cluster_fixture, free_port, pool_settled, start_daemon, wait_until
from tests.integration.test_bad_input import Raw

LIMITS = {
    "--max-streams-per-connection": "4",
    "--max-pushes-per-connection": "2",
    "--max-admin-per-connection": "2",
    "--max-connections-per-client": "6",
    "--max-connections-per-peer": "2",
    "--max-handshakes-per-address": "3",
    "--max-handshakes": "5",
    "--handshake-timeout": "1",
    "--idle-timeout": "3",
}


limited = cluster_fixture(1, pool_size="16M", extra=[x for kv in LIMITS.items() for x in kv])


def _addr(c: Cluster) -> str:
    return c.daemons[0].addr


async def _error(raw: Raw) -> ErrorResponse:
    f = await raw.frame()
    assert isinstance(f, ErrorResponse), f
    return f


@within(30)
async def test_streams_beyond_the_limit_are_refused_per_stream(limited: Cluster) -> None:
    async with await AsyncClient.connect(_addr(limited)) as c:
        w = await c.open_writer("lim", 1, 0, 1, 1)
        await w.write(0, b"d" * 100_000)
        await w.commit()
    raw = await Raw.open(_addr(limited))
    await raw.hello()
    for rid in range(1, 6):  # no credit: each read stays open with its data queued
        await raw.send(codec.encode(PartitionRequest(rid, 0, "lim", 1, 0, 1, {"": [1]})))
    err = await _error(raw)
    assert (err.stream, err.code) == (5, ErrorCode.LIMIT_EXCEEDED)
    assert "max-streams-per-connection (4)" in err.message
    await raw.send(codec.encode_cancel(1))  # one fewer open: the next one is served
    await raw.send(codec.encode(PartitionRequest(6, 1, "lim", 1, 0, 1, {"": [1]})))
    f = await raw.frame()
    assert not isinstance(f, ErrorResponse) and f.receiver == 6  # type: ignore[attr-defined]
    raw.writer.close()
    async with await AsyncClient.connect(_addr(limited)) as c:
        await c.remove_application("lim")
        assert (await pool_settled(c))["pool"]["used"] == 0


@within(30)
async def test_map_outputs_beyond_the_limit_are_refused_per_stream(limited: Cluster) -> None:
    raw = await Raw.open(_addr(limited))
    await raw.hello()
    for writer in (1, 2, 3):
        await raw.send(codec.encode(OpenMapOutput(writer, "lim-p", 1, writer, writer, 2)))
    frames = [await raw.frame() for _ in range(3)]
    errors = [f for f in frames if isinstance(f, ErrorResponse)]
    assert [(e.stream, e.code) for e in errors] == [(3, ErrorCode.LIMIT_EXCEEDED)]
    assert "max-pushes-per-connection (2)" in errors[0].message
    assert sum(isinstance(f, PushCredit) for f in frames) == 2
    raw.writer.close()
    async with await AsyncClient.connect(_addr(limited)) as c:
        s = await pool_settled(c)
        assert s["pool"]["used"] == 0 and s["store"]["open_map_outputs"] == 0


@within(30)
async def test_admin_requests_beyond_the_limit_are_refused_and_each_gets_one_answer(limited: Cluster) -> None:
    raw = await Raw.open(_addr(limited))
    await raw.hello()
    await raw.send(b"".join(codec.encode_admin_request(i, "stats", {}) for i in range(1, 41)))
    answers = [await raw.frame() for _ in range(40)]
    assert sorted(f.stream if isinstance(f, ErrorResponse) else f.request for f in answers) == list(range(1, 41))  # type: ignore[attr-defined]
    refused = [f for f in answers if isinstance(f, ErrorResponse)]
    assert refused and all(f.code == ErrorCode.LIMIT_EXCEEDED for f in refused)
    assert "max-admin-per-connection (2)" in refused[0].message
    assert any(isinstance(f, AdminResponse) for f in answers)
    raw.writer.close()


@within(30)
async def test_client_connections_beyond_the_limit_are_refused(limited: Cluster) -> None:
    clients = [await AsyncClient.connect(_addr(limited)) for _ in range(6)]
    with pytest.raises(LimitExceeded, match=r"max-connections-per-client \(6\)"):
        await AsyncClient.connect(_addr(limited))
    await clients.pop().close()

    async def admitted() -> bool:
        try:
            clients.append(await AsyncClient.connect(_addr(limited)))
        except LimitExceeded:
            return False
        return True

    await wait_until(admitted, bool, timeout=10, what="a client admitted once another closed")
    assert (await clients[-1].stats())["connections"]["clients"] == 6
    for c in clients:
        await c.close()


@within(30)
async def test_connections_stuck_before_hello_are_bounded_per_address_and_in_all(limited: Cluster) -> None:
    """Strangers that connect and say nothing hold a connection each until the handshake timeout: a few
    per address, a few more in all, then further ones are refused at once; other addresses, and the
    same one once the stuck connections are gone, get in."""

    first = [await Raw.open(_addr(limited), "127.0.0.1") for _ in range(3)]
    refused = await _error(await Raw.open(_addr(limited), "127.0.0.1"))
    assert refused.code == ErrorCode.LIMIT_EXCEEDED and "max-handshakes-per-address (3)" in refused.message
    second = [await Raw.open(_addr(limited), "127.0.0.21") for _ in range(2)]
    refused = await _error(await Raw.open(_addr(limited), "127.0.0.22"))
    assert refused.code == ErrorCode.LIMIT_EXCEEDED and "max-handshakes (5)" in refused.message
    for raw in first + second:
        raw.writer.close()

    async def admitted() -> bool:
        try:
            await (await AsyncClient.connect(_addr(limited))).close()
        except LimitExceeded:
            return False
        return True

    await wait_until(admitted, bool, timeout=10, what="a client admitted once the stuck ones closed")


@within(30)
async def test_one_connection_cannot_take_every_push_window() -> None:
    """A connection that opens map outputs and never commits them (spread over many applications, so no
    application quota bites) is refused once its guaranteed windows would pass its share of the pool;
    a writer on another connection still gets credit at once and commits, instead of waiting without an
    error until the hog disconnects."""
    cluster = Cluster(1, pool_size="8M")

    try:
        addr = _addr(cluster)
        hog = await AsyncClient.connect(addr)
        opened = []
        with pytest.raises(LimitExceeded, match=r"push-share-per-connection \(0.25\)"):
            for i in range(200):
                opened.append(await hog.open_writer(f"hog-{i % 50}", 1, i, i, 4))
        assert 0 < len(opened) < 200
        async with await AsyncClient.connect(addr) as other:
            w = await asyncio.wait_for(other.open_writer("fair", 1, 0, 1, 1), 5)
            await w.write(0, b"x" * 100_000)
            assert await w.commit() == [100_000]
            await other.remove_application("fair")
        await hog.close()
        async with await AsyncClient.connect(addr) as c:
            assert (await pool_settled(c))["pool"]["used"] == 0
    finally:
        cluster.stop()


async def _open_many(
    client: AsyncClient, apps: Callable[[int], str], shuffle: int, n: int
) -> tuple[int, list[str], int]:
    """Open `n` map outputs of `shuffle` and never commit them: (how many got credit, the LIMIT_EXCEEDED
    messages, 1 if one got neither within a few seconds: a silent wait)."""
    opened, refused = 0, []
    for i in range(n):
        try:
            await asyncio.wait_for(client.open_writer(apps(i), shuffle, i, i, 4), 3)
            opened += 1
        except LimitExceeded as exc:
            refused.append(str(exc))
        except TimeoutError:
            return opened, refused, 1  # the next ones would wait as well
    return opened, refused, 0


async def _hog(addr: str, apps: Callable[[int, int], str]) -> tuple[list[AsyncClient], int, list[str]]:
    """Four connections open 40 map outputs each, at once, and never commit them (`apps(connection, i)` names
    their applications). Returns (the connections, opens that got credit, the refusals' messages)."""
    hogs = [await AsyncClient.connect(addr) for _ in range(4)]
    results = await asyncio.gather(*(_open_many(h, partial(apps, n), n + 1, 40) for n, h in enumerate(hogs)))
    assert sum(silent for _, _, silent in results) == 0, "a hog's open neither got credit nor an error"
    return hogs, sum(o for o, _, _ in results), [m for _, r, _ in results for m in r]


async def _write_fair(addr: str, refused: int) -> None:
    """Another application's writer gets credit and commits 1 MiB (more than its window) within a few
    seconds; every refusal so far was counted in the error metrics."""
    async with await AsyncClient.connect(addr) as c:

        async def write() -> None:
            w = await c.open_writer("fair", 1, 0, 1, 1)
            await w.write(0, b"x" * (1 << 20))
            assert await w.commit() == [1 << 20]

        await asyncio.wait_for(write(), 5)
        assert (await c.stats())["errors"]["LIMIT_EXCEEDED"] >= refused
        await c.remove_application("fair")


async def _settled(addr: str, hogs: list[AsyncClient]) -> None:
    for h in hogs:
        await h.close()
    async with await AsyncClient.connect(addr) as c:
        assert (await pool_settled(c))["pool"]["used"] == 0


@within(60)
async def test_an_application_on_many_connections_cannot_take_every_push_window() -> None:
    """One application's map outputs on four connections, never committed, hold at most its share of push
    memory: its opens beyond that are refused with LIMIT_EXCEEDED at once, and a writer of another
    application still gets credit and commits (a share per connection alone would let four connections
    take every push window, leaving the next writer waiting without an error)."""
    cluster = Cluster(1, pool_size="8M")  # 224 segments of push memory: an application's share is 56

    try:
        addr = _addr(cluster)
        hogs, opened, refused = await _hog(addr, lambda n, i: "hog")
        assert 0 < opened <= 56 // 2, opened  # its guaranteed windows fit in its share
        assert len(refused) == 160 - opened
        assert all("push-share-per-application (0.25)" in m for m in refused), refused[:3]
        async with await AsyncClient.connect(addr) as c:  # its floors within its share, all at most twice
            credit = (await c.stats())["credit"]
            assert credit["push_floor_segments"] <= 56 and credit["push_extra_segments"] <= 56, credit
        await _write_fair(addr, len(refused))
        await _settled(addr, hogs)
    finally:
        cluster.stop()


@within(60)
async def test_writers_the_push_memory_cannot_guarantee_are_refused_not_left_waiting() -> None:
    """A tenant with four connections and a new application for every map output gets past the shares per
    connection and per application, but the guaranteed windows of all writers together may take only half
    the push memory: its opens beyond that, and then another application's, are refused with
    LIMIT_EXCEEDED at once; windows beyond the guarantees never take the memory an admitted writer is owed,
    and once the tenant is gone the other writer gets credit (rather than waiting, with no error, until
    the client's timeout)."""
    cluster = Cluster(1, pool_size="8M")  # guaranteed windows: at most 112 segments, 56 map outputs

    try:
        addr = _addr(cluster)
        hogs, opened, refused = await _hog(addr, lambda n, i: f"tenant-{n}-{i}")
        assert opened == 112 // 2 and len(refused) == 160 - opened, opened
        assert all("guaranteed windows" in m and "pool-size" in m for m in refused), refused[:3]
        with pytest.raises(LimitExceeded, match="guaranteed windows"):
            await _write_fair(addr, len(refused))
        await _settled(addr, hogs)
        await _write_fair(addr, len(refused) + 1)
    finally:
        cluster.stop()


@within(60)
async def test_one_local_process_at_the_limit_locks_out_only_itself(tmp_path: Path) -> None:
    """Over the Unix socket the connection limit counts per client process (its credentials): a process
    holding its maximum is refused one more, while another local process, `shuffled stats` here, still
    gets in: one process cannot lock every local client out."""
    sock = tmp_path / "d.sock"
    d = start_daemon(
        "127.0.0.1", free_port(["127.0.0.1"]), "16M", ["--unix-socket", str(sock), "--max-connections-per-client", "3"]
    )

    try:
        mine = [await AsyncClient.connect(f"unix:{sock}") for _ in range(3)]
        with pytest.raises(LimitExceeded, match=r"max-connections-per-client \(3\)"):
            await AsyncClient.connect(f"unix:{sock}")
        argv = [sys.executable, "-m", "shuffled", "stats", f"unix:{sock}"]
        other = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)
        assert other.returncode == 0, other.stderr
        for c in mine:
            await c.close()
    finally:
        d.stop()


@within(30)
async def test_peer_connections_beyond_the_limit_are_refused(limited: Cluster) -> None:
    """Daemons saying Hello from one address under different names: the third is one too many."""

    raws = []
    for n in range(1, 4):
        raw = await Raw.open(_addr(limited))
        await raw.send(codec.encode(Hello(Role.DAEMON, info={"node": f"127.0.0.1:{n}", "segment_size": 32768})))
        raws.append(raw)
    for r in raws[:2]:
        assert isinstance(await r.frame(), HelloAck)
    err = await _error(raws[2])
    assert (err.stream, err.code) == (0, ErrorCode.LIMIT_EXCEEDED)
    assert "max-connections-per-peer (2)" in err.message and "127.0.0.1" in err.message
    for r in raws:
        r.writer.close()


@within(10)
@pytest.mark.parametrize("sent", [b"", b"\x00\x00\x00\x15\x01"])
async def test_a_connection_without_a_hello_times_out(limited: Cluster, sent: bytes) -> None:
    raw = await Raw.open(_addr(limited))
    await raw.send(sent)  # nothing, or a few bytes of a header
    err = await _error(raw)
    assert (err.stream, err.code) == (0, ErrorCode.TIMEOUT) and "handshake-timeout 1 s" in err.message
    assert await raw.closed()


@within(20)
async def test_idle_connections_close_and_busy_ones_stay(limited: Cluster) -> None:
    busy = await AsyncClient.connect(_addr(limited))
    w = await busy.open_writer("lim-i", 1, 0, 1, 1)
    idle = await Raw.open(_addr(limited))
    await idle.hello()
    err = await _error(idle)  # after about --idle-timeout
    assert (err.stream, err.code) == (0, ErrorCode.TIMEOUT) and "idle-timeout 3 s" in err.message
    assert await idle.closed()
    # The connection with an open map output was just as quiet, and lives on.
    await w.write(0, b"late")
    assert await w.commit() == [4]
    await busy.remove_application("lim-i")
    await busy.close()


@within(30)
async def test_reads_a_daemon_relays_to_one_peer_are_bounded_too() -> None:
    """The receiver ids a relaying daemon opens on one peer connection count against the same limit."""
    pair = Cluster(2, pool_size="16M", extra=["--max-streams-per-connection", "2"])

    try:
        a, b = pair.daemons
        async with await AsyncClient.connect(b.addr) as c:
            w = await c.open_writer("lim-r", 1, 0, 1, 1)
            # More than a relayed read holds in flight (the relay's gate and the client's reader, up to
            # 2 + 64 buffers each): the reads stay open.
            await w.write(0, b"r" * (8 << 20))
            await w.commit()
        clients = [await AsyncClient.connect(a.addr) for _ in range(3)]
        readers = [c.read("lim-r", 1, 0, 1, {b.addr: [1]}) for c in clients]
        for r in readers[:2]:
            assert await r.next_chunk() is not None  # open, holding their buffers, unread
        with pytest.raises(LimitExceeded, match=r"max-streams-per-connection \(2\) reads from daemon"):
            await readers[2].next_chunk()
        for r, c in zip(readers, clients, strict=True):
            await r.aclose()
            await c.remove_application("lim-r")
            await c.close()
        for d in pair.daemons:
            async with await AsyncClient.connect(d.addr) as c:
                assert (await pool_settled(c))["pool"]["used"] == 0
    finally:
        pair.stop()
