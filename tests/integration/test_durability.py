"""Durability on real daemon processes and real files: spill with bounded memory, reads that mix
memory and disk, attempt bookkeeping, duplicate pushes, cleanup, quotas, a full disk and restarts."""

from __future__ import annotations

import asyncio
import hashlib
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled.config import DaemonConfig
from shuffled.protocol import codec
from shuffled.protocol.frames import CommitAck, OpenMapOutput, PushCredit
from shuffled.protocol.packed import group_bytes
from shuffled_client import (
    AsyncClient,
    CorruptData,
    PartitionNotFound,
    QuotaExceeded,
    ShuffledError,
    StorageError,
)
from tests.aio import within
from tests.cluster import DaemonProcess, free_port, payload, pool_settled, rss, start_daemon, wait_until
from tests.integration.test_bad_input import Raw
from tests.shuffles import push
from tests.units import KiB, MiB

APP = "app-durable"


def daemon(data: Path | None, pool: str = "32M", extra: list[str] | None = None, **kw: object) -> DaemonProcess:
    host = "127.0.0.1"
    # A short drain: restart tests stop the daemon with a push still open, which must be aborted, not awaited.
    args = ["--data-dir", str(data) if data is not None else "none", "--drain-timeout", "1", *(extra or [])]
    return start_daemon(host, free_port([host]), pool, args, **kw)  # type: ignore[arg-type]


@pytest.fixture
def stop_later() -> Iterator[Callable[[DaemonProcess], DaemonProcess]]:
    started: list[DaemonProcess] = []

    def register(d: DaemonProcess) -> DaemonProcess:
        started.append(d)
        return d

    yield register
    for d in started:
        d.stop()


def files_under(root: Path) -> list[str]:
    """Every file below `root` except the daemons' LOCK files."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != "LOCK")


async def read_by_attempt(
    client: AsyncClient, shuffle: int, start: int, end: int, locations: dict[str, list[int]], app: str = APP
) -> dict[tuple[int, int], bytes]:
    """Bytes per (partition, attempt), in the order they arrived (that order is what must be exact)."""
    got: dict[tuple[int, int], bytearray] = {}
    async with client.read(app, shuffle, start, end, locations) as reader:
        async for chunk in reader:
            got.setdefault((chunk.partition, chunk.attempt), bytearray()).extend(chunk.data)
    return {k: bytes(v) for k, v in got.items()}


def expected(attempts: list[int], sizes: list[int]) -> dict[tuple[int, int], bytes]:
    return {(p, a): payload(a, p, n) for a in attempts for p, n in enumerate(sizes) if n}


@within(240)
async def test_twenty_times_the_pool_spills_with_bounded_rss_and_reads_back_byte_exact(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """640 MiB through a 32 MiB pool: the excess goes to disk, RSS stays near the pool, every
    byte comes back; unregistering leaves no file and no used segment."""

    d = stop_later(daemon(tmp_path / "data"))
    c = await AsyncClient.connect(d.addr)
    sizes = [5 * MiB] * 16
    attempts = list(range(1, 9))
    peak = rss(d.pid)

    async def pusher(mine: list[int]) -> None:
        nonlocal peak
        for a in mine:
            await push(c, APP, 1, a, sizes)
            peak = max(peak, rss(d.pid))

    await asyncio.gather(pusher(attempts[::2]), pusher(attempts[1::2]))
    stats = await c.stats()
    assert sum(sizes) * len(attempts) >= 20 * d.pool_size
    assert stats["disk"]["spills"] > 0 and stats["disk"]["files"] == 1, stats["disk"]  # one per shuffle
    assert stats["disk"]["used_bytes"] >= sum(sizes) * len(attempts) - d.pool_size, stats
    for p in range(16):
        want = {a: hashlib.sha256(payload(a, p, sizes[p])).digest() for a in attempts}
        hashes = {a: hashlib.sha256() for a in attempts}
        async with c.read(APP, 1, p, p + 1, {"": attempts}) as reader:
            async for chunk in reader:
                hashes[chunk.attempt].update(chunk.data)
        assert {a: h.digest() for a, h in hashes.items()} == want, f"partition {p}"
        peak = max(peak, rss(d.pid))
    assert peak <= d.pool_size + 100 * MiB, f"peak RSS {peak / MiB:.0f} MiB"
    disk = (await c.stats())["disk"]
    # what the pool could not hold when it was read came back from the file, and the daemon says so
    assert disk["loads"] > 0 and disk["loaded_bytes"] >= sum(sizes) * len(attempts) - d.pool_size, disk
    await c.unregister_shuffle(APP, 1)
    settled = await pool_settled(c)
    assert settled["pool"]["used"] == 0
    assert settled["disk"]["used_bytes"] == 0 and settled["disk"]["files"] == 0, settled["disk"]
    assert files_under(tmp_path / "data") == []
    await c.close()


@within(120)
async def test_pushes_reads_and_unregisters_overlapping_while_spilling(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """Rounds in which shuffle k is pushed (spilling), shuffle k-1 read back and shuffle k-2
    unregistered, all at once: every read byte-exact, and at the end no segment used, no file left."""

    d = stop_later(daemon(tmp_path / "data", pool="16M"))
    c = await AsyncClient.connect(d.addr)
    sizes = [3 * MiB] * 8
    want = {p: hashlib.sha256(payload(1, p, n)).digest() for p, n in enumerate(sizes)}

    async def check(shuffle: int) -> None:
        for p in range(len(sizes)):
            h = hashlib.sha256()
            async with c.read(APP, shuffle, p, p + 1, {"": [1]}) as reader:
                async for chunk in reader:
                    h.update(chunk.data)
            assert h.digest() == want[p], f"shuffle {shuffle} partition {p}"

    async def nothing() -> None:
        pass

    for k in range(1, 7):
        await asyncio.gather(
            push(c, APP, k, 1, sizes),
            check(k - 1) if k > 1 else nothing(),
            c.unregister_shuffle(APP, k - 2) if k > 2 else nothing(),
        )
    await check(6)
    for k in (5, 6):
        await c.unregister_shuffle(APP, k)
    s = await pool_settled(c)
    assert s["pool"]["used"] == 0 and s["disk"]["files"] == 0 and s["disk"]["used_bytes"] == 0
    assert s["disk"]["spills"] > 0
    assert files_under(tmp_path / "data") == []
    await c.close()


@within(60)
async def test_one_map_output_eight_times_a_tiny_pool(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """A 2 MiB pool (64 segments, 8 of them the read reserve): the spill mark must still be reachable
    by pushes, or one big uncommitted map output would wait forever for memory. It spills, commits
    and reads back byte-exact."""

    d = stop_later(daemon(tmp_path / "data", pool="2M"))
    c = await AsyncClient.connect(d.addr)
    await push(c, APP, 1, 1, [16 * MiB, 1])
    assert await read_by_attempt(c, 1, 0, 2, {"": [1]}) == expected([1], [16 * MiB, 1])
    assert (await c.stats())["disk"]["spills"] > 0
    await c.close()


@within(120)
async def test_mixed_memory_and_disk_reads_are_byte_exact_locally_and_through_a_peer(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """One attempt wholly on disk, one wholly in memory, one split (a disk prefix, a memory
    suffix) on each daemon; reads relayed by the other daemon and local ones see exactly the
    bytes pushed per (partition, attempt), and nothing from an attempt the reader did not name."""

    port = free_port(["127.0.0.1", "127.0.0.2"])
    peers = f"127.0.0.1:{port},127.0.0.2:{port}"
    da = stop_later(start_daemon("127.0.0.1", port, "32M", ["--data-dir", str(tmp_path / "a"), "--peers", peers]))
    db = stop_later(start_daemon("127.0.0.2", port, "32M", ["--data-dir", str(tmp_path / "b"), "--peers", peers]))
    a, b = await AsyncClient.connect(da.addr), await AsyncClient.connect(db.addr)
    sizes = [300 * KiB, 0, 700 * KiB, 1 * MiB + 5]
    for client, base in ((a, 10), (b, 20)):
        await push(client, APP, 2, base + 1, sizes)
        assert (await client.flush(APP, 2))["flushed_bytes"] >= sum(sizes)
        await push(client, APP, 2, base + 2, sizes)  # stays in memory
        # Split attempt: what has landed when the flush runs goes to disk, the rest stays in memory.
        before = (await client.stats())["store"]["stored_segments"]
        w = await client.open_writer(APP, 2, 3, base + 3, len(sizes), buffer_size=0)  # each write pushed at once
        for p, n in enumerate(sizes):
            await w.write(p, payload(base + 3, p, n)[: n // 2])
        full = before + sum(n // 2 // (32 * KiB) for n in sizes)  # at least these segments

        def landed(s: dict[str, Any], full: int = full) -> bool:
            return bool(s["store"]["stored_segments"] >= full)

        await wait_until(client.stats, landed, what="first half landed")
        assert (await client.flush(APP, 2))["flushed_bytes"] > 0
        for p, n in enumerate(sizes):
            await w.write(p, payload(base + 3, p, n)[n // 2 :])
        assert await w.commit() == sizes
        # A second attempt of the first one's map index: stored beside it, never named by the readers.
        await push(client, APP, 2, base + 4, sizes, map_index=(base + 1) % 1000)
    want = expected([11, 12, 13, 21, 22, 23], sizes)
    relayed = await read_by_attempt(b, 2, 0, 4, {"": [21, 22, 23], da.addr: [11, 12, 13]})
    assert relayed == want
    local = await read_by_attempt(a, 2, 1, 4, {"": [11, 12, 13]})
    assert local == {k: v for k, v in want.items() if k[1] < 20 and k[0] >= 1}
    for client in (a, b):
        await client.unregister_shuffle(APP, 2)
        assert (await pool_settled(client))["pool"]["used"] == 0
        await client.close()
    assert files_under(tmp_path) == []


@within(60)
async def test_unregister_during_a_read_of_spilled_data(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """A read of spilled data that is under way when its shuffle is unregistered fails with
    PARTITION_NOT_FOUND (its data is gone) after the bytes it already got, which are right; every
    segment comes back and no file is left."""

    d = stop_later(daemon(tmp_path / "data"))
    c = await AsyncClient.connect(d.addr)
    sizes = [4 * MiB, 64 * KiB]
    await push(c, APP, 9, 1, sizes)
    await c.flush(APP, 9)
    reader = c.read(APP, 9, 0, 2, {"": [1]})
    first = await reader.next_chunk()  # held: the daemon can load at most the reader's credit ahead
    assert first is not None and first.partition == 0
    got = bytearray(first.data)
    await c.unregister_shuffle(APP, 9)
    assert files_under(tmp_path / "data") == []
    with pytest.raises(PartitionNotFound, match="gone"):
        while (chunk := await reader.next_chunk()) is not None:
            assert chunk.partition == 0
            got += chunk.data
    assert len(got) < sizes[0] and bytes(got) == payload(1, 0, sizes[0])[: len(got)]
    s = await pool_settled(c)
    assert s["pool"]["used"] == 0 and s["disk"]["files"] == 0
    await c.close()


@within(60)
async def test_duplicate_push_is_dropped_and_its_credit_returned(
    stop_later: Callable[[DaemonProcess], DaemonProcess],
) -> None:
    """A writer that resends PushData with a sequence number already received (a retry after a
    lost reply) does not store the bytes twice; the commit counts distinct sequence numbers."""

    d = stop_later(daemon(None))
    raw = await Raw.open(d.addr)
    await raw.hello()
    await raw.send(codec.encode(OpenMapOutput(1, APP, 3, 0, 7, 1)))
    grant = await raw.frame()
    assert isinstance(grant, PushCredit) and grant.credit >= 4
    parts = [b"a" * 1000, b"b" * 2000, b"c" * 3000]
    push = [codec.encode_push_data(1, i, group_bytes(7, [(0, part)])) for i, part in enumerate(parts)]
    await raw.send(push[0] + push[1])
    await raw.send(push[1] + push[0])
    await raw.send(push[2] + codec.encode_commit(1, 3))
    while not isinstance(f := await raw.frame(), CommitAck):
        assert isinstance(f, PushCredit), f
    assert f.lengths == [6000]
    c = await AsyncClient.connect(d.addr)
    assert (await pool_settled(c))["store"]["stored_segments"] == 3
    assert await read_by_attempt(c, 3, 0, 1, {"": [7]}) == {(0, 7): b"".join(parts)}
    await c.close()


@within(60)
async def test_ttl_and_start_remove_what_nobody_can_serve(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """Leftovers without a valid journal are deleted at start (only under the daemon's own app-*
    dirs); an application idle past its TTL loses its memory and files; an active one does not."""

    data = tmp_path / "data"
    (data / "app-ghost" / "4").mkdir(parents=True)
    (data / "app-ghost" / "4" / "p0.data").write_bytes(b"x" * 5000)
    (data / "app-torn" / "1").mkdir(parents=True)
    (data / "app-torn" / "1" / "journal").write_bytes(b"\0\0\0\x10garbage")
    (data / "app-ghost" / "stray.tmp").write_bytes(b"?")
    (data / "not-ours.txt").write_bytes(b"an operator's note")
    d = stop_later(daemon(data, extra=["--app-ttl", "2"]))
    assert files_under(data) == ["not-ours.txt"]
    (data / "not-ours.txt").unlink()
    c = await AsyncClient.connect(d.addr)
    await push(c, "idle-app", 1, 1, [256 * KiB] * 2)
    await c.flush("idle-app")
    assert files_under(data) != []

    async def busy() -> dict[str, object]:
        # Another application keeps reading its data: activity keeps it alive.
        await read_by_attempt(c, 1, 0, 2, {"": [2]}, app="busy-app")
        return await c.stats()

    await push(c, "busy-app", 1, 2, [64 * KiB] * 2)
    s = await wait_until(
        busy,
        lambda s: s["store"]["applications"] == 1 and s["disk"]["files"] == 0,
        timeout=30,
        what="idle app expired and its files deleted",
    )
    assert s["store"]["memory_bytes"] >= 2 * 64 * KiB and s["disk"]["used_bytes"] == 0  # busy-app's data stays
    assert files_under(data) == []
    await c.remove_application("busy-app")
    assert (await pool_settled(c))["pool"]["used"] == 0
    await c.close()


async def _restart_case(tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess], kill: bool) -> None:
    data = tmp_path / "data"
    sizes = [600 * KiB, 1 * MiB, 0, 333 * KiB]
    d = stop_later(daemon(data))
    c = await AsyncClient.connect(d.addr)
    await push(c, APP, 5, 1, sizes)
    await c.flush(APP, 5)  # attempt 1 on disk
    await push(c, APP, 5, 2, sizes)  # attempt 2 committed, in memory
    w = await c.open_writer(APP, 5, 3, 3, len(sizes))  # attempt 3 never committed
    await w.write(0, payload(3, 0, 100 * KiB))
    await wait_until(c.stats, lambda s: s["streams"]["pushing"] == 1, what="attempt 3 open")
    if kill:
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
    else:
        d.stop()
        assert d.proc.returncode == 0, "".join(d.log)
    await c.close()
    d2 = stop_later(daemon(data))
    c2 = await AsyncClient.connect(d2.addr)
    survivors = [1] if kill else [1, 2]
    assert await read_by_attempt(c2, 5, 0, 4, {"": survivors}) == expected(survivors, sizes)
    lost = [2, 3] if kill else [3]
    for attempt in lost:
        with pytest.raises(PartitionNotFound) as info:
            await read_by_attempt(c2, 5, 0, 4, {"": [attempt]})
        assert info.value.fetch_failure
    s = await c2.stats()
    assert s["store"]["commits"] == 0 and s["disk"]["used_bytes"] > 0
    # A new attempt after the restart lands next to the restored ones.
    await push(c2, APP, 5, 4, sizes)
    assert await read_by_attempt(c2, 5, 0, 4, {"": [*survivors, 4]}) == expected([*survivors, 4], sizes)
    await c2.close()
    d2.stop()
    d3 = stop_later(daemon(data))
    c3 = await AsyncClient.connect(d3.addr)
    assert await read_by_attempt(c3, 5, 0, 4, {"": [*survivors, 4]}) == expected([*survivors, 4], sizes)
    await c3.unregister_shuffle(APP, 5)
    assert files_under(data) == []
    await c3.close()


@within(90)
async def test_graceful_restart_serves_every_committed_attempt(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """SIGTERM writes what is committed and in memory to disk; the next daemon serves all of it
    (checked against the journal) and reports the uncommitted attempt as missing."""
    await _restart_case(tmp_path, stop_later, kill=False)


@within(90)
async def test_kill_9_restart_serves_what_it_can_verify_and_reports_the_rest_missing(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """After SIGKILL only the attempt whose every byte is on disk and journaled is served; the one
    that was committed in memory only is PARTITION_NOT_FOUND (a fetch failure: Spark recomputes)."""
    await _restart_case(tmp_path, stop_later, kill=True)


@within(90)
async def test_corrupt_spill_data_and_a_torn_journal(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """A flipped byte in a spill file fails that read with CORRUPT_DATA (a fetch failure) instead
    of serving it; a torn journal tail costs only the record it cut; the daemon keeps serving."""

    data = tmp_path / "data"
    sizes = [200 * KiB, 200 * KiB]
    d = stop_later(daemon(data))
    c = await AsyncClient.connect(d.addr)
    await push(c, APP, 6, 1, sizes)
    await push(c, APP, 6, 2, sizes)
    await c.flush(APP, 6)
    await push(c, APP, 6, 3, sizes)
    await c.flush(APP, 6)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    await c.close()
    shuffle_dir = next(data.glob("app-*/6"))
    journal = shuffle_dir / "journal"
    raw = journal.read_bytes()
    journal.write_bytes(raw[:-3])  # cut into the last record: attempt 3's commit
    spilled = shuffle_dir / "data"
    blob = bytearray(spilled.read_bytes())
    blob[1000] ^= 0xFF  # attempt 1's first piece (partition 0 only)
    spilled.write_bytes(bytes(blob))
    d2 = stop_later(daemon(data))
    c2 = await AsyncClient.connect(d2.addr)
    with pytest.raises(CorruptData) as info:
        await read_by_attempt(c2, 6, 0, 1, {"": [1]})
    assert info.value.fetch_failure
    assert await read_by_attempt(c2, 6, 0, 2, {"": [2]}) == expected([2], sizes)
    assert await read_by_attempt(c2, 6, 1, 2, {"": [1]}) == {(1, 1): payload(1, 1, sizes[1])}
    with pytest.raises(PartitionNotFound):
        await read_by_attempt(c2, 6, 0, 2, {"": [3]})
    assert (await pool_settled(c2))["pool"]["used"] == 0
    await c2.close()


@within(90)
async def test_quotas_refuse_the_pusher_of_that_application_only(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """Without a data dir the memory quota refuses pushes (QUOTA_EXCEEDED, not a fetch failure);
    with one it spills instead, and the disk quota refuses. Other applications are unaffected."""

    mem = stop_later(daemon(None, extra=["--app-memory-quota", "2M"]))
    disk = stop_later(daemon(tmp_path / "data", extra=["--app-memory-quota", "2M", "--app-disk-quota", "3M"]))
    for d, over in ((mem, 4 * MiB), (disk, 8 * MiB)):
        c = await AsyncClient.connect(d.addr)
        with pytest.raises(QuotaExceeded) as info:
            await push(c, "greedy", 1, 1, [over])
        assert not info.value.fetch_failure and "quota" in info.value.message
        await push(c, "modest", 1, 1, [1 * MiB])
        s = await c.stats()
        assert s["store"]["commits"] == 1
        await c.remove_application("greedy")
        await c.remove_application("modest")
        assert (await pool_settled(c))["pool"]["used"] == 0
        await c.close()
    assert files_under(tmp_path / "data") == []


def _small_dir(path: Path, size: int, how: str) -> tuple[Callable[[], None] | None, Callable[[], object]]:
    """A data dir that fills up after `size` bytes: a tmpfs of that size (a real ENOSPC; skipped
    where mounting is not allowed), or RLIMIT_FSIZE on the daemon (a file growing past `size` fails
    with EFBIG, SIGXFSZ ignored), which works anywhere."""
    path.mkdir()
    if how == "tmpfs":
        mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
        try:
            mounted = subprocess.run(mount, capture_output=True, timeout=30).returncode == 0
        except OSError:  # no mount binary
            mounted = False
        if not mounted:
            pytest.skip("mounting a tmpfs is not allowed here; the RLIMIT_FSIZE case covers a full disk")
        return None, lambda: subprocess.run(["umount", "-l", str(path)], check=False)

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit, lambda: None


@within(120)
@pytest.mark.parametrize("how", ["tmpfs", "rlimit"])
async def test_full_disk_aborts_the_map_output_and_never_serves_partial_data(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess], how: str
) -> None:
    """A data dir on an 8 MiB tmpfs, or files capped at 8 MiB by RLIMIT_FSIZE: a map output that
    must spill past it fails with STORAGE_ERROR; data committed before stays readable byte-exact,
    also after a kill -9 restart; the daemon returns every segment and keeps taking pushes."""

    async def body(data: Path, preexec: Callable[[], None] | None) -> None:
        d = stop_later(daemon(data, extra=["--app-ttl", "0"], preexec=preexec))
        c = await AsyncClient.connect(d.addr)
        await push(c, APP, 1, 1, [2 * MiB, 1 * MiB])
        await c.flush(APP, 1)
        with pytest.raises(StorageError) as info:
            await push(c, APP, 1, 2, [20 * MiB, 20 * MiB])
        assert not info.value.fetch_failure and "disk" in info.value.message
        assert await read_by_attempt(c, 1, 0, 2, {"": [1]}) == expected([1], [2 * MiB, 1 * MiB])
        s = await pool_settled(c)
        assert s["store"]["aborts"] >= 1
        await push(c, APP, 1, 3, [1 * MiB, 1 * MiB])  # small enough for memory: still taken
        await c.close()
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        d2 = stop_later(daemon(data, preexec=preexec))
        c2 = await AsyncClient.connect(d2.addr)
        assert await read_by_attempt(c2, 1, 0, 2, {"": [1]}) == expected([1], [2 * MiB, 1 * MiB])
        with pytest.raises(PartitionNotFound):
            await read_by_attempt(c2, 1, 0, 2, {"": [2]})
        await c2.unregister_shuffle(APP, 1)
        assert files_under(data) == []
        await c2.close()

    data = tmp_path / "small"
    preexec, cleanup = _small_dir(data, 8 * MiB, how)
    try:
        await asyncio.wait_for(body(data, preexec), 120)
    finally:
        cleanup()


@within(60)
async def test_by_default_a_full_pool_spills_to_the_daemons_own_data_dir(
    stop_later: Callable[[DaemonProcess], DaemonProcess],
) -> None:
    """With data-dir auto (the default), the ready line names the directory derived from the daemon's
    address, and a shuffle four times the pool spills there instead of stopping the pusher."""
    host = "127.0.0.1"
    port = free_port([host])
    where = Path(str(DaemonConfig(host=host, port=port).data_directory()))

    try:
        d = stop_later(start_daemon(host, port, "16M", ["--data-dir", "auto"]))
        assert any(f"data_dir={where} " in line for line in d.log if "msg=ready" in line), d.log
        c = await AsyncClient.connect(d.addr)
        for attempt in (1, 2):
            await push(c, APP, 1, attempt, [16 * MiB, 16 * MiB])
        assert (await c.stats())["disk"]["spills"] > 0
        got = await read_by_attempt(c, 1, 0, 2, {"": [1, 2]})
        assert got == expected([1, 2], [16 * MiB, 16 * MiB])
        await c.remove_application(APP)
        assert files_under(where) == []
        await c.close()
    finally:
        shutil.rmtree(where, ignore_errors=True)


@within(60)
async def test_data_dir_auto_with_port_0_names_the_directory_after_the_bound_port(
    stop_later: Callable[[DaemonProcess], DaemonProcess],
) -> None:
    """Two daemons on one host that each pick their port get directories of their own, named after the
    port they listen on: the second does not refuse to start ("another daemon uses this data dir"), and a
    later one would not restore what an earlier one on another port committed."""
    host = "127.0.0.1"
    daemons = [stop_later(start_daemon(host, 0, "16M", ["--data-dir", "auto"])) for _ in range(2)]
    wheres = []
    for d in daemons:
        port = int(d.addr.rsplit(":", 1)[1])
        where = Path(str(DaemonConfig(host=host, port=port).data_directory()))
        assert any(f"data_dir={where} " in line for line in d.log if "msg=ready" in line), d.log
        wheres.append(where)
    try:
        assert wheres[0] != wheres[1]
        for d in daemons:  # each serves from its own directory
            c = await AsyncClient.connect(d.addr)
            await push(c, APP, 1, 1, [64 * KiB])
            await c.flush(APP)
            assert await read_by_attempt(c, 1, 0, 1, {"": [1]}) == expected([1], [64 * KiB])
            await c.remove_application(APP)
            await c.close()
    finally:
        for where in wheres:
            shutil.rmtree(where, ignore_errors=True)


async def _fill_until_refused(c: AsyncClient, shuffle: int, most: int) -> tuple[StorageError, list[int]]:
    """Push and commit 1 MiB map outputs until a push is refused; the refusal and the attempts committed."""
    committed: list[int] = []
    for attempt in range(1, most + 1):
        try:
            await push(c, APP, shuffle, attempt, [512 * KiB, 512 * KiB])
        except StorageError as exc:
            return exc, committed
        committed.append(attempt)
    raise AssertionError(f"{most} MiB of pushes were all taken")


@within(60)
async def test_without_a_data_dir_a_push_into_a_pool_full_of_stored_data_fails_at_once(
    stop_later: Callable[[DaemonProcess], DaemonProcess],
) -> None:
    """data-dir none: once stored data fills the memory pushes may use, the next push fails with
    STORAGE_ERROR naming the cause, instead of waiting for credit until the client times out
    (Spark keeps finished queries' shuffles until its driver collects them, so that credit never comes).
    Removing a shuffle makes room again, and every segment is accounted for."""

    d = stop_later(daemon(None, pool="8M"))
    c = await AsyncClient.connect(d.addr)
    error, committed = await _fill_until_refused(c, 1, 16)
    assert "data-dir none" in error.message and not error.fetch_failure
    assert len(committed) >= 4
    assert (await c.stats())["errors"]["STORAGE_ERROR"] >= 1
    assert await read_by_attempt(c, 1, 0, 2, {"": committed}) == expected(committed, [512 * KiB] * 2)
    await c.unregister_shuffle(APP, 1)
    await push(c, APP, 2, 1, [512 * KiB, 512 * KiB])
    await c.remove_application(APP)
    assert (await pool_settled(c))["pool"]["used"] == 0
    await c.close()


@within(60)
async def test_without_a_data_dir_idle_push_credit_does_not_starve_another_application(
    stop_later: Callable[[DaemonProcess], DaemonProcess],
) -> None:
    """data-dir none: one tenant keeps a map output open with its credit unused while its other pushes fill
    memory. Another application's push then fails at once with STORAGE_ERROR naming the idle credit, instead
    of waiting, with no error, until the first tenant's connection ends (PROTOCOL.md §9: a writer is never
    left waiting for a floor that cannot come)."""
    d = stop_later(daemon(None, pool="8M"))
    hog = await AsyncClient.connect(d.addr)
    idle = await hog.open_writer("hog", 9, 0, 1, 2)

    async def outstanding() -> int:
        return int((await hog.stats())["credit"]["push_outstanding"])

    await wait_until(outstanding, lambda n: n > 0, 10, "the idle writer holds push credit")
    for attempt in range(1, 300):  # one segment each, until the memory left is the idle writer's credit
        try:
            await push(hog, APP, 1, attempt, [16 * KiB])
        except StorageError:
            break
    else:
        raise AssertionError("an 8 MiB pool took 300 segments")
    victim = await AsyncClient.connect(d.addr)
    with pytest.raises(StorageError, match="push credit they have not used") as refused:
        await asyncio.wait_for(push(victim, "victim", 1, 1, [100]), 10)
    assert not refused.value.fetch_failure
    await idle.abort()
    await hog.remove_application(APP)
    await push(victim, "victim", 2, 1, [64 * KiB, 64 * KiB])  # room again once the tenant lets go
    await victim.remove_application("victim")
    assert (await pool_settled(victim))["pool"]["used"] == 0
    await hog.close()
    await victim.close()


@within(90)
async def test_a_full_disk_behind_a_full_pool_fails_pushes_at_once(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """Files capped at 2 MiB (RLIMIT_FSIZE) behind an 8 MiB pool: once the disk refuses spills and
    committed data fills memory, a push fails with STORAGE_ERROR naming the disk's error instead of
    hanging; the committed data stays readable."""

    limit, _ = _small_dir(tmp_path / "small", 2 * MiB, "rlimit")
    d = stop_later(daemon(tmp_path / "small", pool="8M", preexec=limit))
    c = await AsyncClient.connect(d.addr)
    # A push whose data was in a failed spill is aborted; the others commit, until committed data
    # fills memory and a push has nothing to wait for: that one is refused before it gets credit.
    committed: dict[int, list[int]] = {}
    for shuffle in range(1, 33):
        error, committed[shuffle] = await _fill_until_refused(c, shuffle, 32)
        if "spilling to" in error.message:
            break
    assert "spilling to" in error.message, error.message
    for shuffle, attempts in committed.items():
        got = await read_by_attempt(c, shuffle, 0, 2, {"": attempts})
        assert got == expected(attempts, [512 * KiB] * 2)
    await c.remove_application(APP)
    assert (await pool_settled(c))["pool"]["used"] == 0
    await c.close()


@within(60)
async def test_flush_after_writes_idle_committed_shuffles_to_disk(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """With --flush-after, a shuffle that stopped receiving commits (its map stage is done) moves
    to disk by itself: its memory is free for the next stage and it is read back from the files."""

    d = stop_later(daemon(tmp_path / "data", extra=["--flush-after", "0.5"]))
    c = await AsyncClient.connect(d.addr)
    sizes = [1 * MiB, 512 * KiB]
    await push(c, APP, 8, 1, sizes)
    await push(c, APP, 8, 2, sizes)
    s = await wait_until(c.stats, lambda s: s["store"]["stored_segments"] == 0, what="idle shuffle flushed")
    assert s["disk"]["used_bytes"] >= 2 * sum(sizes) and s["pool"]["used"] == 0  # the groups, directories too
    assert await read_by_attempt(c, 8, 0, 2, {"": [1, 2]}) == expected([1, 2], sizes)
    await c.close()


@within(60)
async def test_an_application_cannot_share_a_long_ids_spill_directory(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """An application whose id is a 230-character id's shortened directory name (its first 100 characters,
    '-' and a SHA-256) gets a directory of its own: sharing it, removing its own shuffle would delete the
    other application's spill files."""

    d = stop_later(daemon(tmp_path / "data"))
    c = await AsyncClient.connect(d.addr)
    victim = "v" * 230
    squatter = victim[:100] + "-" + hashlib.sha256(victim.encode()).hexdigest()
    sizes = [200 * KiB, 100 * KiB]
    for app in (victim, squatter):
        await push(c, app, 3, 1, sizes)
        await c.flush(app)
    await c.unregister_shuffle(squatter, 3)
    assert await read_by_attempt(c, 3, 0, 2, {"": [1]}, app=victim) == expected([1], sizes)
    await c.close()


@within(60)
@pytest.mark.parametrize("how", ["abort", "vanish"])
async def test_an_aborted_map_output_gives_its_spilled_bytes_back(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess], how: str
) -> None:
    """24 MiB pushed into an 8 MiB pool and never committed: most of it is spilled. When the writer aborts
    or its connection vanishes, those bytes are freed on disk too, not kept until the shuffle goes
    (kept, they let one client fill 876 MB of disk in 8 s); committed data stays readable."""

    data_dir = tmp_path / "data"
    d = stop_later(daemon(data_dir, pool="8M"))
    c = await AsyncClient.connect(d.addr)
    await push(c, APP, 4, 1, [256 * KiB, 256 * KiB])
    await c.flush(APP)
    kept = (await c.stats())["disk"]["used_bytes"]
    hog = await AsyncClient.connect(d.addr)
    w = await hog.open_writer(APP, 4, 2, 2, 2)
    chunk = payload(2, 0, MiB)
    for _ in range(24):
        await w.write(0, chunk)
    await wait_until(c.stats, lambda s: s["disk"]["used_bytes"] >= kept + 8 * MiB, what="the open push spilled")
    if how == "abort":
        await w.abort()
    await hog.close()
    s = await wait_until(c.stats, lambda s: s["disk"]["used_bytes"] == kept, what="aborted bytes reclaimed")
    assert s["disk"]["reclaimed_bytes"] >= 8 * MiB
    allocated = sum(f.stat().st_blocks * 512 for f in data_dir.rglob("p*.data"))
    assert allocated < kept + 2 * MiB, f"{allocated} bytes still allocated on disk"
    assert await read_by_attempt(c, 4, 0, 2, {"": [1]}) == expected([1], [256 * KiB, 256 * KiB])
    await c.remove_application(APP)
    assert (await pool_settled(c))["pool"]["used"] == 0
    await c.close()


@within(120)
async def test_a_second_daemon_on_the_same_data_dir_refuses_to_start(
    tmp_path: Path, stop_later: Callable[[DaemonProcess], DaemonProcess]
) -> None:
    """It would otherwise delete the first one's files as leftovers it cannot serve."""
    first = stop_later(daemon(tmp_path / "data"))
    argv = [sys.executable, "-m", "shuffled", "serve", "--port", "0", "--data-dir", str(tmp_path / "data")]
    second = await asyncio.wait_for(
        asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60), 90
    )
    assert second.returncode == 1
    assert f"another daemon (pid {first.pid}) uses this data dir" in second.stderr
    assert first.proc.poll() is None


@within(30)
async def test_flush_without_data_dir_is_a_clear_error(stop_later: Callable[[DaemonProcess], DaemonProcess]) -> None:
    d = stop_later(daemon(None))
    c = await AsyncClient.connect(d.addr)
    with pytest.raises(ShuffledError, match="data-dir"):
        await c.flush(APP)
    await c.close()
