"""Malformed and hostile input against a live daemon: a clear error on that stream or
connection, everyone else keeps being served, every buffer returns to the pool."""

from __future__ import annotations

import asyncio

import pytest

from shuffled.protocol import codec
from shuffled.protocol.errors import ErrorCode, PartitionNotFound, PeerUnavailable
from shuffled.protocol.frames import (
    HEADER,
    MAX_CONTROL_BODY,
    MAX_HANDSHAKE_BODY,
    CommitAck,
    ErrorResponse,
    FrameType,
    Hello,
    HelloAck,
    OpenMapOutput,
    PushCredit,
    Role,
)
from shuffled.protocol.packed import group_bytes
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import Cluster, cluster_fixture, payload, pool_settled, wait_until

one = cluster_fixture(1, pool_size="32M")


class Raw:
    """A hand-driven connection: send any bytes, read whole frames back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buf = b""

    @classmethod
    async def open(cls, addr: str, source: str | None = None) -> Raw:
        host, port = addr.rsplit(":", 1)
        local = (source, 0) if source else None
        return cls(*await asyncio.open_connection(host, int(port), local_addr=local))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def frame(self) -> object:
        while True:
            if len(self.buf) >= 12:
                length = int.from_bytes(self.buf[:4], "big")
                if len(self.buf) >= 12 + length:
                    data, self.buf = self.buf[: 12 + length], self.buf[12 + length :]
                    return codec.decode_all(data)[0]
            chunk = await asyncio.wait_for(self.reader.read(65536), 10)
            if not chunk:
                raise EOFError
            self.buf += chunk

    async def hello(self) -> None:
        await self.send(codec.encode(Hello(Role.CLIENT)))
        assert isinstance(await self.frame(), HelloAck)

    async def closed(self) -> bool:
        try:
            await self.frame()
        except EOFError:
            return True
        return False


async def _still_serving(addr: str) -> None:
    c = await AsyncClient.connect(addr)
    w = await c.open_writer("ok-app", 1, 0, 1, 2)
    await w.write(1, payload(1, 1, 100_000))
    await w.commit()
    async with c.read("ok-app", 1, 1, 2, {"": [1]}) as r:
        assert await r.read_all() == payload(1, 1, 100_000)
    await c.remove_application("ok-app")
    assert (await pool_settled(c))["pool"]["used"] == 0
    await c.close()


@within(30)
@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x00\x00\x00\x04\x7f\x00\x00\x00\x00\x00\x00\x00abcd",  # unknown frame type
        b"\xff\xff\xff\xff\x01\x00\x00\x00\x00\x00\x00\x00",  # absurd length
    ],
)
async def test_garbage_gets_a_protocol_error_and_a_close(one: Cluster, garbage: bytes) -> None:
    raw = await Raw.open(one.daemons[0].addr)
    await raw.send(garbage)
    err = await raw.frame()
    assert isinstance(err, ErrorResponse) and err.stream == 0 and err.code == ErrorCode.PROTOCOL
    assert await raw.closed()
    await _still_serving(one.daemons[0].addr)


@within(60)
async def test_a_big_frame_before_authentication_costs_no_memory(one: Cluster) -> None:
    """Headers that announce an 8 MiB Hello, then one byte, on 300 connections at once (from three
    addresses): each is refused at its header, so the daemon buffers none of them (when it buffered them,
    its RSS went from 99 MB to 3.3 GB)."""
    import psutil

    daemon = one.daemons[0]
    rss = psutil.Process(daemon.pid).memory_info().rss
    header = HEADER.pack(MAX_CONTROL_BODY, FrameType.HELLO, 0, 0, 0) + b"\x81"
    # from three addresses: one holds at most max-handshakes-per-address (128) in their handshake
    raws = [await Raw.open(daemon.addr, f"127.0.0.{31 + i % 3}") for i in range(300)]
    await asyncio.gather(*(raw.send(header) for raw in raws))
    for raw in raws:
        err = await raw.frame()
        assert isinstance(err, ErrorResponse) and err.code == ErrorCode.PROTOCOL, err
        assert f"limit {MAX_HANDSHAKE_BODY}" in err.message
        assert await raw.closed()
    assert psutil.Process(daemon.pid).memory_info().rss - rss < 64 << 20
    await _still_serving(daemon.addr)


@within(30)
@pytest.mark.parametrize("where", ["x" * 64 + ".example:7337", "host-only", "[::1]:99999", "a..b:1"])
async def test_a_location_that_names_no_daemon_fails_that_stream_with_peer_unavailable(
    one: Cluster, where: str
) -> None:
    """A location that is no daemon's address (a 64-character host label, no port, a port past 65535, an empty
    label) fails its read with PEER_UNAVAILABLE naming it, not with INTERNAL and a traceback in the log."""

    c = await AsyncClient.connect(one.daemons[0].addr)
    with pytest.raises(PeerUnavailable, match="is not host:port"):
        async with c.read("bad-location", 1, 0, 1, {where: [1]}) as r:
            await r.read_all()
    await c.close()
    assert not any("Traceback" in line for line in one.daemons[0].log)
    await _still_serving(one.daemons[0].addr)


@within(60)
async def test_a_hello_of_many_tiny_objects_costs_little_cpu(one: Cluster) -> None:
    """Hellos whose info holds a list of empty msgpack maps, as large as allowed before the handshake and
    8 MiB, on 20 connections: under a second of daemon CPU in all (before the limit, millions of them in
    8 MiB bodies cost 14 s for 10 frames, and a legitimate reader fell from ~840 to ~10 MiB/s)."""
    import psutil

    daemon = one.daemons[0]
    proc = psutil.Process(daemon.pid)
    cpu = sum(proc.cpu_times()[:2])
    sizes = (MAX_HANDSHAKE_BODY, MAX_CONTROL_BODY)
    # the most allowed before the handshake, and what the old limit let through
    frames = [codec.encode(Hello(Role.CLIENT, info={"x": [{}] * (size - 64)})) for size in sizes]
    assert len(frames[0]) - HEADER.size <= MAX_HANDSHAKE_BODY
    for i in range(20):
        raw = await Raw.open(daemon.addr)
        await raw.send(frames[i % 2])
        reply = await raw.frame()
        if i % 2:  # refused at its header
            assert isinstance(reply, ErrorResponse) and reply.code == ErrorCode.PROTOCOL, reply
            assert await raw.closed()
        else:  # decoded (a few ms), and accepted: this daemon has no secret
            assert isinstance(reply, HelloAck), reply
            raw.writer.close()
    assert sum(proc.cpu_times()[:2]) - cpu < 1.0
    await _still_serving(daemon.addr)


@within(30)
async def test_frame_before_hello_is_refused(one: Cluster) -> None:
    raw = await Raw.open(one.daemons[0].addr)
    await raw.send(codec.encode_add_credit(1, 1))
    err = await raw.frame()
    assert isinstance(err, ErrorResponse) and "Hello" in err.message
    assert await raw.closed()


@within(30)
async def test_stray_stream_frames_get_per_stream_errors_and_the_connection_lives(one: Cluster) -> None:
    raw = await Raw.open(one.daemons[0].addr)
    await raw.hello()
    await raw.send(codec.encode_push_data(42, 0, group_bytes(1, [(0, b"x" * 100)])))  # writer never opened
    await raw.send(codec.encode_commit(43, 0))
    codes = {(f.stream, f.code) for f in [await raw.frame(), await raw.frame()] if isinstance(f, ErrorResponse)}
    assert codes == {(42, ErrorCode.UNKNOWN_STREAM), (43, ErrorCode.UNKNOWN_STREAM)}
    await raw.send(codec.encode(OpenMapOutput(5, "", 1, 0, 1, 4)))  # empty app id
    err = await raw.frame()
    assert isinstance(err, ErrorResponse) and err.stream == 5 and err.code == ErrorCode.INVALID_REQUEST
    await raw.send(codec.encode_admin_request(6, "stats", {}))
    assert (await raw.frame()).result["pool"]["used"] == 0  # type: ignore[attr-defined]


@within(30)
async def test_push_beyond_credit_is_fatal_and_frees_the_map_output(one: Cluster) -> None:
    raw = await Raw.open(one.daemons[0].addr)
    await raw.hello()
    await raw.send(codec.encode(OpenMapOutput(1, "bad-app", 1, 0, 9, 2)))
    grant = await raw.frame()
    assert isinstance(grant, PushCredit)
    # Credit tops up as pushes land, but never beyond the pool (896 usable segments
    # here): pushing 2000 without waiting for grants must run past it.
    pushes = b"".join(codec.encode_push_data(1, i, group_bytes(9, [(0, b"y" * 1000)])) for i in range(2000))
    await raw.send(pushes)
    while not isinstance(f := await raw.frame(), ErrorResponse):
        assert isinstance(f, PushCredit)
    assert f.stream == 0 and f.code == ErrorCode.CREDIT_VIOLATION
    assert await raw.closed()
    c = await AsyncClient.connect(one.daemons[0].addr)
    s = await pool_settled(c)
    assert s["pool"]["used"] == 0 and s["store"]["open_map_outputs"] == 0
    await c.close()
    await _still_serving(one.daemons[0].addr)


@within(30)
async def test_push_to_wrong_partition_fails_that_writer_only(one: Cluster) -> None:
    c = await AsyncClient.connect(one.daemons[0].addr)
    w = await c.open_writer("p-app", 1, 0, 1, 3)
    # Bypass the client's own check to put an out-of-range partition on the wire.
    raw = await Raw.open(one.daemons[0].addr)
    await raw.hello()
    await raw.send(codec.encode(OpenMapOutput(1, "p-app", 1, 1, 2, 3)))
    assert isinstance(await raw.frame(), PushCredit)
    await raw.send(codec.encode_push_data(1, 0, group_bytes(2, [(7, b"z" * 10)])))
    err = await raw.frame()
    assert isinstance(err, ErrorResponse) and err.stream == 1 and err.code == ErrorCode.INVALID_REQUEST
    await w.write(2, b"fine")
    assert await w.commit() == [0, 0, 4]
    await c.remove_application("p-app")
    assert (await pool_settled(c))["pool"]["used"] == 0
    await c.close()


@within(60)
async def test_a_malformed_group_after_good_ones_drops_the_whole_attempt_memory_and_disk(one: Cluster) -> None:
    """A push whose sixth group is malformed, after five good ones of which three were already spilled:
    INVALID_REQUEST on that stream, nothing of the attempt is stored or served (its spilled bytes are
    given back to the file system), every segment returns to the pool, and the connection pushes on."""

    d = one.daemons[0]
    c = await AsyncClient.connect(d.addr)
    kept = await c.open_writer("m-app", 2, 0, 1, 1)  # another shuffle: the application is not left empty
    await kept.write(0, b"kept")
    await kept.commit()
    await c.flush("m-app", 2)  # on disk: the pool holds nothing of it
    start = await c.stats()
    before, commits = start["disk"]["reclaimed_bytes"], start["store"]["commits"]
    raw = await Raw.open(d.addr)
    await raw.hello()
    await raw.send(codec.encode(OpenMapOutput(1, "m-app", 1, 0, 5, 8)))
    credit = await raw.frame()
    assert isinstance(credit, PushCredit) and credit.credit >= 2
    good = [group_bytes(5, [(p, payload(5, p, 20_000)), (p + 1, b"x")]) for p in range(5)]
    spilled = sum(len(g) for g in good[:3])
    available = credit.credit
    for i, group in enumerate(good):
        while not available:
            more = await raw.frame()
            assert isinstance(more, PushCredit), more
            available += more.credit
        await raw.send(codec.encode_push_data(1, i, group))
        available -= 1
        if i == 2:  # the first three pieces go to the data file
            await wait_until(c.stats, lambda s: s["store"]["pieces"] >= 3, what="three pieces stored")
            assert (await c.flush("m-app", 1))["flushed_bytes"] == spilled
    descending = group_bytes(5, [(4, b"a"), (2, b"b")])  # partitions not ascending
    while not available:
        more = await raw.frame()
        assert isinstance(more, PushCredit), more
        available += more.credit
    await raw.send(codec.encode_push_data(1, 5, descending) + codec.encode_commit(1, 6))
    while isinstance(err := await raw.frame(), PushCredit):
        pass
    assert isinstance(err, ErrorResponse) and (err.stream, err.code) == (1, ErrorCode.INVALID_REQUEST), err
    assert "ascending" in err.message
    s = await pool_settled(c)
    assert s["store"]["open_map_outputs"] == 0 and s["store"]["commits"] == commits and s["pool"]["used"] == 0, s
    with pytest.raises(PartitionNotFound):
        async with c.read("m-app", 1, 0, 8, {"": [5]}) as reader:
            await reader.read_all()
    await wait_until(
        c.stats,
        lambda s: s["disk"]["reclaimed_bytes"] - before >= spilled,
        what="the spilled pieces' blocks given back",
    )
    # The same connection pushes the attempt again, well formed this time (the commit that crossed the
    # error on the wire was answered UNKNOWN_STREAM, as the protocol says).
    await raw.send(codec.encode(OpenMapOutput(3, "m-app", 1, 0, 5, 8)))
    while isinstance(stale := await raw.frame(), ErrorResponse):
        assert (stale.stream, stale.code) == (1, ErrorCode.UNKNOWN_STREAM), stale
    assert isinstance(stale, PushCredit) and stale.writer == 3
    await raw.send(codec.encode_push_data(3, 0, good[0]) + codec.encode_commit(3, 1))
    while isinstance(ack := await raw.frame(), PushCredit):
        pass
    assert isinstance(ack, CommitAck) and ack.lengths[:2] == [20_000, 1], ack
    async with c.read("m-app", 1, 0, 8, {"": [5]}) as reader:
        assert await reader.read_all() == payload(5, 0, 20_000) + b"x"
    await c.remove_application("m-app")
    assert (await pool_settled(c))["pool"]["used"] == 0
    raw.writer.close()
    await c.close()
