"""Reads in place (PROTOCOL.md §6.3): a local client's daemon puts each served buffer in a read slot of the
connection's region and names it with BufferPlaced; the client reads it there and gives the slot back
(ReturnSlots) when iteration lets it go.

Hypothesis makes the shuffles (map outputs on the client's own daemon and on a peer, wide and narrow, small
and large blocks) and the reads (ranges, chunks or groups, several at once); each read must return exactly
what was pushed, whether the buffers come in place or through the socket, and in the end every buffer was
read in place and its slot given back, and every segment is back in both daemons' pools. Then what users
meet: read slots that run out (the rest comes through the socket), a client killed holding slots, a daemon
killed mid-read, and a client that gives back a slot it does not hold.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shuffled import children
from shuffled.launch import DaemonProcess
from shuffled.protocol import codec
from shuffled.protocol.errors import ConnectionLost, ErrorCode, ProtocolError, ShuffledError
from shuffled.protocol.frames import (
    SHM,
    SHM_READ,
    BufferKind,
    ErrorResponse,
    Hello,
    HelloAck,
    PartitionRequest,
    ReturnSlots,
    Role,
)
from shuffled_client import AsyncClient
from tests.aio import run, within
from tests.cluster import free_port, payload, pool_settled, start_daemon, wait_until
from tests.integration.test_bad_input import Raw
from tests.integration.test_security import corrupting_peer

SHM_ROOT = "/dev/shm"
APP = "in-place-app"
SEGMENT = 8192
_shuffles = itertools.count(1)


def _daemon(root: Path, name: str, extra: list[str]) -> tuple[DaemonProcess, str]:
    if not os.path.isdir(SHM_ROOT):
        pytest.skip(f"no {SHM_ROOT} on this host")
    sock = root / f"{name}.sock"
    flags = ["--data-dir", str(root / name), "--segment-size", str(SEGMENT), "--unix-socket", str(sock)]
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "8M", [*flags, "--shm-dir", SHM_ROOT, *extra])
    return d, f"unix:{sock}"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, DaemonProcess]]:
    """The client's own daemon (and its Unix socket's address), and a peer whose data it relays."""
    root = tmp_path_factory.mktemp("in-place")
    own, local = _daemon(root, "own", [])
    try:
        peer, _ = _daemon(root, "peer", [])
        try:
            yield local, peer
        finally:
            peer.stop()
    finally:
        own.stop()


@pytest.fixture
def own(tmp_path: Path) -> Iterator[tuple[DaemonProcess, str]]:
    """A daemon of its own for a test that kills or breaks things, and its Unix socket's address."""
    d, address = _daemon(tmp_path, "own", [])
    try:
        yield d, address
    finally:
        d.stop()


async def _one_partition(c: AsyncClient, size: int) -> None:
    """Map attempt 0 of shuffle 1: one partition of `size` bytes."""
    w = await c.open_writer(APP, 1, 0, 0, 1)
    await w.write(0, payload(0, 0, size))
    await w.commit()


async def _dial(address: str, features: list[str]) -> tuple[Raw, HelloAck]:
    """A hand-driven client of the Unix socket that offers `features`, and the daemon's HelloAck."""
    raw = Raw(*await asyncio.open_unix_connection(address.removeprefix("unix:")))
    await raw.send(codec.encode(Hello(Role.CLIENT, info={"features": features})))
    ack = await raw.frame()
    assert isinstance(ack, HelloAck), ack
    return raw, ack


#: one map output: (on the peer?, its partitions' sizes)
Output = tuple[bool, list[int]]


@st.composite
def shuffles(draw: st.DrawFn) -> tuple[int, list[Output], list[tuple[int, int, str]]]:
    partitions = draw(st.sampled_from([1, 5, 600]))
    sizes = st.sampled_from([0, 1, 90, SEGMENT - 100, 3 * SEGMENT + 7])
    if partitions == 600:  # AQE's shape: wide map outputs of small blocks
        sizes = st.sampled_from([0, 13, 70])
    outputs = [(draw(st.booleans()), [draw(sizes) for _ in range(partitions)]) for _ in range(draw(st.integers(1, 3)))]
    reads = []
    for _ in range(draw(st.integers(1, 3))):
        start = draw(st.integers(0, partitions - 1))
        reads.append((start, draw(st.integers(start + 1, partitions)), draw(st.sampled_from(["chunks", "groups"]))))
    return partitions, outputs, reads


async def _read(
    c: AsyncClient, shuffle: int, start: int, end: int, mode: str, where: dict[str, list[int]]
) -> dict[tuple[int, int], bytearray]:
    """The range's bytes, by (attempt, partition)."""
    got: dict[tuple[int, int], bytearray] = {}
    async with c.read(APP, shuffle, start, end, where) as r:
        if mode == "chunks":
            async for chunk in r:
                got.setdefault((chunk.attempt, chunk.partition), bytearray()).extend(chunk.data)
        else:
            async for group in r.groups():
                at = 0
                for p, n in zip(group.partitions, group.lengths, strict=True):
                    got.setdefault((group.attempt, p), bytearray()).extend(group.data[at : at + n])
                    at += n
    return got


def _traffic(s: dict[str, Any]) -> tuple[int, int]:
    t = s["traffic"]
    return t["served_local_buffers"] + t["relayed_buffers"], t["read_placed_buffers"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shuffles())
@pytest.mark.parametrize("shared", [True, False], ids=["in-place", "socket"])
def test_reads_return_what_was_pushed_and_every_slot_comes_back(
    pair: tuple[str, DaemonProcess],
    shared: bool,
    case: tuple[int, list[Output], list[tuple[int, int, str]]],
) -> None:
    local, peer = pair
    partitions, outputs, reads = case
    shuffle = next(_shuffles)

    async def body() -> None:
        async with (
            await AsyncClient.connect(local, shared_memory=shared) as c,
            await AsyncClient.connect(peer.addr) as far,
        ):
            assert (c.session.in_place is not None) == shared
            where: dict[str, list[int]] = {}
            for attempt, (remote, sizes) in enumerate(outputs):
                w = await (far if remote else c).open_writer(APP, shuffle, attempt, attempt, partitions)
                for p, size in enumerate(sizes):
                    await w.write(p, payload(attempt, p, size))
                await w.commit()
                where.setdefault(peer.addr if remote else "", []).append(attempt)
            before = _traffic(await c.stats())
            got = await asyncio.gather(*(_read(c, shuffle, s, e, mode, where) for s, e, mode in reads))
            for (start, end, _), result in zip(reads, got, strict=True):
                want = {
                    (a, p): payload(a, p, sizes[p])
                    for a, (_, sizes) in enumerate(outputs)
                    for p in range(start, end)
                    if sizes[p]
                }
                assert result == want, (start, end)

            def all_back(s: dict[str, Any]) -> bool:
                served, placed = (now - then for now, then in zip(_traffic(s), before, strict=True))
                return placed == (served if shared else 0)

            await wait_until(c.stats, all_back, 10, "every buffer read in place and its slot given back")
            await c.unregister_shuffle(APP, shuffle)
            await far.unregister_shuffle(APP, shuffle)
            for client in (c, far):
                s = await pool_settled(client)
                assert s["pool"]["used"] == 0, s["pool"]

    run(body(), 90)


@within(90)
async def test_read_slots_that_run_out_send_the_rest_through_the_socket(tmp_path: Path) -> None:
    """Three read slots for a reader whose credit is sixty-six buffers: most buffers come through the socket,
    some in place, all of them right; with none (`--shm-read-slots 0`) the daemon does not offer reads in
    place at all."""
    for slots in (3, 0):
        d, address = _daemon(tmp_path, f"slots{slots}", ["--shm-read-slots", str(slots)])
        try:
            async with await AsyncClient.connect(address) as c:
                assert SHM in c.session.proto.features
                assert (SHM_READ in c.session.proto.features) == (slots > 0)
                w = await c.open_writer(APP, 1, 0, 0, 4)
                for p in range(4):
                    await w.write(p, payload(0, p, 400_000))
                await w.commit()
                before = _traffic(await c.stats())
                async with c.read(APP, 1, 0, 4, {"": [0]}) as r:
                    assert await r.read_all() == b"".join(payload(0, p, 400_000) for p in range(4))
                s = await pool_settled(c)
                served, placed = (now - then for now, then in zip(_traffic(s), before, strict=True))
                if slots:
                    assert 0 < placed < served, (placed, served)
                else:
                    assert placed == 0 and served > 0, (placed, served)
        finally:
            d.stop()


#: a reader that takes two buffers in place and holds them (its slots lent) until it is killed
CHILD_READ = """
import asyncio, sys
sys.path[:0] = sys.argv[2:]
from shuffled_client import AsyncClient

async def main(address):
    async with await AsyncClient.connect(address) as c:
        r = c.read("in-place-app", 1, 0, 1, {"": [0]})
        held = [await r.next_group(), await r.next_group()]
        print("holding" if c.session.in_place is not None else "socket", flush=True)
        await asyncio.sleep(3600)  # until killed

asyncio.run(main(sys.argv[1]))
"""


@within(90)
async def test_a_reader_killed_holding_slots_leaves_nothing_behind(own: tuple[DaemonProcess, str]) -> None:
    d, address = own
    async with await AsyncClient.connect(address, shared_memory=False) as watcher:
        await _one_partition(watcher, 2 << 20)
        root = str(Path(__file__).resolve().parents[2])
        child = children.spawn(
            [sys.executable, "-c", CHILD_READ, address, root, os.path.join(root, "client", "python")],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            assert await asyncio.to_thread(child.stdout.readline) == "holding\n"
            assert (await watcher.stats())["streams"]["served"] == 1
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            s = await pool_settled(watcher)
            assert s["pool"]["used"] == s["store"]["stored_segments"] and s["streams"]["served"] == 0, s
        finally:
            child.kill()
            child.wait(10)
        mine = [n for n in os.listdir(SHM_ROOT) if n.startswith(f"shuffled-{d.pid}-")]
        assert [os.listdir(os.path.join(SHM_ROOT, n)) for n in mine] == [[]], "no region left on the host"


@within(90)
async def test_a_daemon_killed_mid_read_fails_the_read(own: tuple[DaemonProcess, str]) -> None:
    d, address = own
    async with await AsyncClient.connect(address) as c:
        await _one_partition(c, 2 << 20)
        async with c.read(APP, 1, 0, 1, {"": [0]}) as r:
            first = await r.next_group()
            assert first is not None and c.session.in_place is not None
            d.proc.send_signal(signal.SIGKILL)
            with pytest.raises(ConnectionLost):
                while await r.next_group() is not None:
                    pass


@within(60)
async def test_buffers_a_reader_holds_stay_whole_when_the_daemon_ends_its_connection(
    own: tuple[DaemonProcess, str],
) -> None:
    """The daemon may end a connection while its reader still holds buffers in place (here: the client breaks
    a rule on purpose); what arrived stays readable and whole, and the read then fails."""
    _, address = own
    want = payload(0, 0, 2 << 20)
    async with await AsyncClient.connect(address) as c:
        await _one_partition(c, len(want))
        async with c.read(APP, 1, 0, 1, {"": [0]}) as r:
            first = await r.next_group()
            assert first is not None and c.session.in_place is not None
            got = bytearray(first.data)
            c.session.proto.send(codec.encode(ReturnSlots(0, [0])))  # a push slot, never lent: the daemon ends it
            await wait_until(lambda: asyncio.sleep(0, c.session.lost), lambda lost: lost is not None, 10, "lost")
            assert bytes(first.data) == want[: len(got)], "the buffer held is as it arrived"
            with pytest.raises(ShuffledError):
                while (group := await r.next_group()) is not None:
                    got += group.data
            assert len(got) < len(want) and got == want[: len(got)]


@within(60)
async def test_a_client_that_returns_a_slot_it_does_not_hold_loses_its_connection_only(
    own: tuple[DaemonProcess, str],
) -> None:
    _, address = own
    # without the feature, ReturnSlots breaks the rules
    plain, ack = await _dial(address, [SHM])
    assert ack.info["features"] == [SHM], ack
    await plain.send(codec.encode(ReturnSlots(0, [1])))
    err = await plain.frame()
    assert isinstance(err, ErrorResponse) and err.stream == 0 and err.code == ErrorCode.PROTOCOL, err
    assert "did not agree" in err.message and await plain.closed()
    # with it, a slot the daemon never put a buffer in
    raw, ack = await _dial(address, [SHM, SHM_READ])
    assert ack.info["features"] == [SHM, SHM_READ], ack
    await raw.send(codec.encode(ReturnSlots(0, [ack.info["shm"]["size"] // SEGMENT - 1])))
    err = await raw.frame()
    assert isinstance(err, ErrorResponse) and err.stream == 0 and err.code == ErrorCode.PROTOCOL, err
    assert "holds no served buffer" in err.message and await raw.closed()
    # everyone else is served as before, in place
    async with await AsyncClient.connect(address) as c:
        await _one_partition(c, 100_000)
        async with c.read(APP, 1, 0, 1, {"": [0]}) as r:
            assert await r.read_all() == payload(0, 0, 100_000)
        s = await pool_settled(c)
        assert s["traffic"]["read_placed_buffers"] > 0, s["traffic"]


@within(60)
async def test_an_empty_payload_from_a_peer_fails_that_read_only(own: tuple[DaemonProcess, str]) -> None:
    """A DATA buffer holds at least one group: a peer's empty one fails the read it came on (a reader in place
    could not even be told of it), and the client's connection serves on."""
    _, address = own

    def empty(req: PartitionRequest) -> bytes:
        return codec.encode_buffer_response(req.receiver, 0, 0, BufferKind.DATA, b"", 0)

    async with corrupting_peer(empty) as peer, await AsyncClient.connect(address) as c:
        with pytest.raises(ProtocolError, match="no group"):
            await _read(c, 1, 0, 1, "chunks", {peer: [1]})
        await _one_partition(c, 100_000)
        async with c.read(APP, 1, 0, 1, {"": [0]}) as r:
            assert await r.read_all() == payload(0, 0, 100_000)
