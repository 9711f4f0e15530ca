"""The blocking JVM client (client/jvm, package io.shuffled.client) against a real daemon process.

Builds the plugin jar and the test jar with shuffled.spark_jar, starts `python -m shuffled serve` and runs
the Java check program ClientCheck against it: its full check, and its push/verify modes for the
cross-language tests (Java pushes, Python reads byte-exact; Python pushes, Java reads) and for a writer that
asks for its commit to follow an fsync. Skipped only when no JDK is installed.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from shuffled import spark_jar
from shuffled.protocol import codec
from shuffled.protocol.errors import ErrorCode
from shuffled.protocol.frames import BufferKind, ErrorResponse, Hello, HelloAck, PartitionRequest, Role
from shuffled.protocol.packed import group_bytes
from shuffled.server.serving.view_reader import LOOKAHEAD
from shuffled_client import AsyncClient, Client
from tests import small_tmpfs
from tests.aio import within
from tests.cluster import DaemonProcess, free_port, payload, pool_settled, secret_flags, start_daemon
from tests.jvm import SUMMARY, needs_jdk

ROOT = Path(__file__).parents[2]
JAVA_TIMEOUT = 60
ASYNC_TIMEOUT = 60
PARTITIONS = 4  # ClientCheck.PARTITIONS


pytestmark = needs_jdk


def size(index: int, partition: int) -> int:
    """Bytes attempt number `index` writes to `partition` (ClientCheck.size)."""
    return [0, 100 + index, 40_000 + 1000 * index, (3 << 20) + 17 * index][partition]


@pytest.fixture(scope="module")
def jars() -> tuple[Path, Path]:
    return spark_jar.build_jar(), spark_jar.build_test_classes()


@pytest.fixture(scope="module")
def unix_socket(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("jvm") / "shuffled.sock"


@pytest.fixture(scope="module")
def daemon(unix_socket: Path) -> Iterator[DaemonProcess]:
    flags = ["--unix-socket", str(unix_socket), "--shm-dir", "/dev/shm"]  # clients of the socket: shared memory
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "64M", flags)
    try:
        yield d
    finally:
        d.stop()


def _client_check(jars: tuple[Path, Path], address: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [spark_jar.find_tool("java"), "-cp", spark_jar.classpath(*jars), "io.shuffled.client.ClientCheck"]
    return subprocess.run([*cmd, address, *args], capture_output=True, text=True, timeout=JAVA_TIMEOUT, cwd=ROOT)


def _assert_clean(proc: subprocess.CompletedProcess[str]) -> int:
    """Exit 0 and a last line `N passed, 0 failed`; returns N."""
    failures = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert proc.returncode == 0, failures + proc.stderr.splitlines()
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output; stderr:\n{proc.stderr}"
    m = SUMMARY.fullmatch(lines[-1])
    assert m, f"last line is not a summary: {lines[-1]!r}"
    assert m.group(2) == "0", failures
    return int(m.group(1))


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_client_check_against_a_daemon(
    jars: tuple[Path, Path], daemon: DaemonProcess, unix_socket: Path, transport: str
) -> None:
    """Over the Unix socket the Java client pushes and reads through shared memory (PROTOCOL.md §6.3), over TCP
    it cannot: every buffer it pushes is placed, and the buffers served to it are read in place and their slots
    given back (all but those queued for the reads it closes early, which are never sent: a few per read)."""
    address = daemon.addr if transport == "tcp" else f"unix:{unix_socket}"
    unix = transport == "unix"
    early = 8 * LOOKAHEAD  # buffers queued for the reads ClientCheck closes early (never sent), generously

    def moved(s: dict[str, Any]) -> tuple[int, int, int, int]:
        t = s["traffic"]
        return (
            t["pushed_buffers"] - before["pushed_buffers"],
            t["placed_buffers"] - before["placed_buffers"],
            t["served_local_buffers"]
            + t["relayed_buffers"]
            - before["served_local_buffers"]
            - before["relayed_buffers"],
            t["read_placed_buffers"] - before["read_placed_buffers"],
        )

    with Client(daemon.addr, timeout=10) as client:
        before = client.stats()["traffic"]
        passed = _assert_clean(_client_check(jars, address))
        now = moved(client.stats())
        deadline = time.monotonic() + 10  # the last ReturnSlots may still be on its way when the JVM is gone
        while unix and now[3] < now[2] - early and time.monotonic() < deadline:
            time.sleep(0.02)
            now = moved(client.stats())
    assert passed >= 30
    pushed, placed, served, read_placed = now
    assert pushed > 0 and placed == (pushed if unix else 0), now
    assert served > 0 and (served - early <= read_placed <= served if unix else read_placed == 0), now


def test_java_writer_pushes_through_the_socket_when_the_tmpfs_is_full(jars: tuple[Path, Path], tmp_path: Path) -> None:
    """A daemon whose shm-dir tmpfs is full grants the credit it has no room for as PushCredit on the Java
    writer's shared-memory connection (PROTOCOL.md §6.3): the writer sends those groups as PushData, in
    sequence with any it placed, and the output reads back exact."""
    if (why := small_tmpfs.why_not()) is not None:
        pytest.skip(why)
    app, shuffle, attempts = "java-full-tmpfs", 15, ["41", "42"]
    with small_tmpfs.tmpfs_daemon(tmp_path, "48m") as where:
        subprocess.run(small_tmpfs.fill(where), check=True, timeout=60)
        java = [spark_jar.find_tool("java"), "-cp", spark_jar.classpath(*jars), "io.shuffled.client.ClientCheck"]
        argv = where.enter(*java, where.unix, "push", app, str(shuffle), *attempts)
        _assert_clean(subprocess.run(argv, capture_output=True, text=True, timeout=JAVA_TIMEOUT, cwd=ROOT))
        _assert_clean(_client_check(jars, where.daemon.addr, "verify", app, str(shuffle), *attempts))
        with Client(where.daemon.addr, timeout=10) as client:
            traffic = client.stats()["traffic"]
        log = list(where.daemon.log)
    assert traffic["pushed_buffers"] > 100 and traffic["placed_buffers"] < traffic["pushed_buffers"], traffic
    assert any("pushes through the socket" in line for line in log), log[-5:]


def test_java_writer_asks_for_its_commit_to_follow_an_fsync(jars: tuple[Path, Path], daemon: DaemonProcess) -> None:
    """`openWriter(..., fsync "commit")` makes the commit wait for a sync of the data dir on a daemon whose own
    `--fsync` is `none` (the fixture's default), where a writer that does not ask gets none (PROTOCOL.md §7.8)."""
    app, shuffle = "java-fsync", 14
    with Client(daemon.addr, timeout=10) as client:
        before = client.stats()["disk"]["syncs"]
        _assert_clean(_client_check(jars, daemon.addr, "push", app, str(shuffle), "51"))
        assert client.stats()["disk"]["syncs"] == before
        assert _assert_clean(_client_check(jars, daemon.addr, "push-fsync", app, str(shuffle + 1), "52", "53")) == 2
        assert client.stats()["disk"]["syncs"] > before
        for s in (shuffle, shuffle + 1):
            client.unregister_shuffle(app, s)


def test_java_writer_asking_for_an_fsync_is_refused_without_a_data_dir(jars: tuple[Path, Path]) -> None:
    """A daemon with nothing to sync refuses the ask at open, as a named error rather than an unsynced commit."""
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "64M", ["--data-dir", "none"])
    try:
        proc = _client_check(jars, d.addr, "push-fsync", "java-fsync", "1", "61")
    finally:
        d.stop()
    assert proc.returncode != 0
    assert (
        "ShuffledException: this map output asks for fsync at commit, and this daemon has no data dir" in proc.stdout
    ), proc.stdout + proc.stderr


@within(ASYNC_TIMEOUT)
async def test_java_pushes_python_reads(jars: tuple[Path, Path], daemon: DaemonProcess) -> None:
    app, shuffle, attempts = "java-to-python", 11, [21, 22, 2**63 + 3]
    proc = await asyncio.to_thread(_client_check, jars, daemon.addr, "push", app, str(shuffle), *map(str, attempts))
    _assert_clean(proc)

    async with await AsyncClient.connect(daemon.addr) as client:
        for p in range(PARTITIONS):
            got: dict[int, bytearray] = {a: bytearray() for a in attempts}
            async with client.read(app, shuffle, p, p + 1, {"": attempts}) as reader:
                async for chunk in reader:
                    assert chunk.partition == p
                    got[chunk.attempt] += chunk.data
            for i, a in enumerate(attempts):
                assert bytes(got[a]) == payload(a, p, size(i, p)), (a, p)
        await client.unregister_shuffle(app, shuffle)
        stats = await pool_settled(client)
        assert stats["pool"]["used"] == 0


@within(120)
async def test_python_pushes_java_reads(jars: tuple[Path, Path], daemon: DaemonProcess) -> None:
    app, shuffle, attempts = "python-to-java", 12, [31, 32, 33]

    async def push(client: AsyncClient) -> None:
        for i, a in enumerate(attempts):
            writer = await client.open_writer(app, shuffle, i, a, PARTITIONS)
            for p in range(PARTITIONS):
                data = payload(a, p, size(i, p))
                for off in range(0, len(data), 50_000):
                    await writer.write(p, data[off : off + 50_000])
            assert await writer.commit() == [size(i, p) for p in range(PARTITIONS)]

    async with await AsyncClient.connect(daemon.addr) as client:
        await asyncio.wait_for(push(client), ASYNC_TIMEOUT)
        args = ["verify", app, str(shuffle), *map(str, attempts)]
        proc = await asyncio.to_thread(_client_check, jars, daemon.addr, *args)
        passed = _assert_clean(proc)
        assert passed == PARTITIONS * (1 + len(attempts))
        await asyncio.wait_for(client.unregister_shuffle(app, shuffle), ASYNC_TIMEOUT)


@within(120)
async def test_java_client_authenticates_and_keeps_applications_apart(jars: tuple[Path, Path], tmp_path: Path) -> None:
    """ClientCheck's auth mode: wrong and missing secrets refused, tokens enforced, CRC32C on the way."""
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "64M", secret_flags(tmp_path, "jvm-cluster-secret"))
    try:
        proc = await asyncio.to_thread(_client_check, jars, d.addr, "auth", "jvm-cluster-secret")
        assert _assert_clean(proc) >= 10
        await asyncio.to_thread(d.logged, 'msg="authentication failed"')
    finally:
        d.stop()


@within(120)
async def test_java_reader_refuses_a_buffer_that_fails_its_crc(jars: tuple[Path, Path]) -> None:
    from tests.integration.test_security import corrupting_peer

    async with corrupting_peer() as peer:
        proc = await asyncio.to_thread(_client_check, jars, peer, "corrupt", "c-app", "1", "1")
        assert _assert_clean(proc) == 1


@asynccontextmanager
async def closing_daemon(buffers: int) -> AsyncIterator[tuple[str, list[int]]]:
    """A scripted daemon that answers every read with `buffers` data buffers, then `SHUTTING_DOWN`: with 0,
    what a draining daemon says to a client's new read (PROTOCOL.md §8). Yields its node and the receiver
    ids it refused, in order."""
    from tests.integration.test_bad_input import Raw

    refused: list[int] = []

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        raw = Raw(r, w)
        assert isinstance(await raw.frame(), Hello)
        await raw.send(codec.encode(HelloAck(Role.DAEMON, info={"node": node, "segment_size": 32 << 10})))
        try:
            while True:
                req = await raw.frame()
                if isinstance(req, PartitionRequest):
                    (attempt,) = next(iter(req.locations.values()))
                    for seq in range(buffers):
                        data = group_bytes(attempt, [(req.start, payload(attempt, req.start, 1000))])
                        await raw.send(codec.encode_buffer_response(req.receiver, seq, 0, BufferKind.DATA, data))
                    refused.append(req.receiver)
                    await raw.send(codec.encode(ErrorResponse(req.receiver, ErrorCode.SHUTTING_DOWN, "draining")))
        except (TimeoutError, EOFError, ConnectionError):
            return

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    node = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield node, refused
    finally:
        server.close()


def _read_streams(jars: tuple[Path, Path], addresses: list[str], timeout_ms: int, *args: str) -> list[str]:
    """ReadStreamsCheck's output lines (see its Javadoc)."""
    cmd = [spark_jar.find_tool("java"), "-cp", spark_jar.classpath(*jars), "io.shuffled.spark.ReadStreamsCheck"]
    proc = subprocess.run(
        [*cmd, ",".join(addresses), str(timeout_ms), *args], capture_output=True, text=True, timeout=JAVA_TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@within(120)
async def test_a_read_refused_before_its_first_byte_goes_through_another_daemon(
    jars: tuple[Path, Path], daemon: DaemonProcess
) -> None:
    """A draining daemon refuses a task's new reads with SHUTTING_DOWN: the task reads through the next daemon
    of spark.shuffled.address instead of failing, every stream opened ahead included, and gets every byte once;
    a refusal after a byte was taken ends the read as before; a refusal everywhere ends it after the timeout."""
    app, shuffle, attempts = "read-retry", 13, [41, 42, 43, 44, 45]
    sizes = [0, 100, 40_000, 70_000]

    async def push(client: AsyncClient) -> None:
        for i, a in enumerate(attempts):
            writer = await client.open_writer(app, shuffle, i, a, len(sizes))
            for p, n in enumerate(sizes):
                await writer.write(p, payload(a, p, n))
            await writer.commit()

    async with await AsyncClient.connect(daemon.addr) as client:
        await asyncio.wait_for(push(client), ASYNC_TIMEOUT)
        args = [app, str(shuffle), str(len(sizes)), daemon.addr, *map(str, attempts)]
        expected = [
            f"pair {p} {a} {n} {zlib.crc32(payload(a, p, n))}" for a in attempts for p, n in enumerate(sizes) if n
        ]
        async with closing_daemon(0) as (closing, refused):
            lines = await asyncio.to_thread(_read_streams, jars, [closing, daemon.addr], 20_000, *args)
            assert lines == [*expected, f"via {daemon.addr}"]
            assert len(refused) >= 1  # the task's own daemon was asked first
            lines = await asyncio.to_thread(_read_streams, jars, [closing], 1_000, *args)
            assert lines == ["error SHUTTING_DOWN draining after 0 bytes"]
            assert len(refused) >= 4, "the task waited for its daemon to come back, asking again"
        async with closing_daemon(1) as (closing, refused):
            lines = await asyncio.to_thread(_read_streams, jars, [closing, daemon.addr], 20_000, *args)
            assert lines == ["error SHUTTING_DOWN draining after 1000 bytes"]  # not read again elsewhere
        await asyncio.wait_for(client.unregister_shuffle(app, shuffle), ASYNC_TIMEOUT)
