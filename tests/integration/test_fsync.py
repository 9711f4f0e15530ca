"""`--fsync`: with `commit` a CommitAck follows the fsync of what it acknowledges, and commits under way at
once share syncs; with `background` what was written is synced within the interval; with `none` nothing is
ever synced. A shim (fsync_shim/sitecustomize.py) sees every fsync the daemon makes and can stop one."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuffled.launch import DaemonProcess
from shuffled_client import AsyncClient, InvalidRequest
from tests.aio import within
from tests.cluster import free_port, payload, wait_until

HOST = "127.0.0.1"
SHIM = Path(__file__).parent / "fsync_shim"


class Gate:
    """The shim's side door (see the shim): its log of fsyncs, and a way to stop the next one."""

    def __init__(self, where: Path) -> None:
        self.where = where
        for fifo in ("entered", "release"):
            os.mkfifo(where / fifo)

    def synced(self) -> list[str]:
        log = self.where / "log"
        return log.read_text().splitlines() if log.exists() else []

    def arm(self) -> None:
        (self.where / "armed").touch()

    async def entered(self) -> None:
        """Returns once a sync is stopped in the shim (it opened `entered` and wrote its byte); waits on the
        loop, so that the test's deadline ends the wait when no sync ever comes."""
        fd = os.open(self.where / "entered", os.O_RDONLY | os.O_NONBLOCK)
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        loop.add_reader(fd, readable.set_result, None)
        try:
            await readable
            assert os.read(fd, 1) == b"!"
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    async def release(self) -> None:
        await asyncio.to_thread((self.where / "release").write_bytes, b"!")


def start(tmp_path: Path, *flags: str) -> tuple[DaemonProcess, Gate]:
    gate = Gate(tmp_path)
    path = os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "SHUFFLED_FSYNC_GATE": str(tmp_path)}
    data_dir = tmp_path / "data"
    d = DaemonProcess(HOST, free_port([HOST]), "16M", ["--data-dir", str(data_dir), *flags], env=env)
    return d.wait_ready(), gate


@pytest.fixture
def committing(tmp_path: Path) -> Iterator[tuple[DaemonProcess, Gate]]:
    d, gate = start(tmp_path, "--fsync", "commit")
    try:
        yield d, gate
    finally:
        d.stop()


async def push(c: AsyncClient, shuffle: int, attempt: int, size: int = 200_000, fsync: str | None = None) -> list[int]:
    w = await c.open_writer("fsync-app", shuffle, attempt, attempt, 2, fsync=fsync)
    await w.write(0, payload(attempt, 0, size))
    await w.write(1, payload(attempt, 1, size // 3))
    return await w.commit()


@within(60)
async def test_a_commit_ack_follows_the_fsync_of_its_data(committing: tuple[DaemonProcess, Gate]) -> None:
    d, gate = committing
    c = await AsyncClient.connect(d.addr)
    gate.arm()
    commit = asyncio.ensure_future(push(c, 1, 0))
    await gate.entered()
    # The daemon is inside the first fsync. Had it sent the CommitAck before, the ack would be ahead of the
    # stats answer on this connection, and the commit done by the time the answer is read.
    await c.stats()
    assert not commit.done(), "the CommitAck came before the fsync of what it acknowledges"
    await gate.release()
    assert await commit == [200_000, 200_000 // 3]
    synced = gate.synced()
    data = [s for s in synced if s.startswith("fdatasync ") and s.endswith("/1/data")]
    journal = [s for s in synced if s.startswith("fsync ") and s.endswith("/1/journal")]
    assert data and journal, synced
    assert synced.index(data[0]) < synced.index(journal[-1])  # the data first, then the record naming it
    async with c.read("fsync-app", 1, 0, 2, {d.addr: [0]}) as reader:
        assert await reader.read_all() == payload(0, 0, 200_000) + payload(0, 1, 200_000 // 3)
    stats = (await c.stats())["disk"]
    assert stats["syncs"] >= 2 and stats["fsyncs"] >= 3 and stats["unsynced_bytes"] == 0
    await c.close()


@within(60)
async def test_commits_under_way_at_once_share_their_syncs(committing: tuple[DaemonProcess, Gate]) -> None:
    d, gate = committing
    c = await AsyncClient.connect(d.addr)
    await push(c, 2, 99)  # the shuffle's files exist: the commits below each need their data and a record
    before = (await c.stats())["disk"]["syncs"]
    gate.arm()
    first = asyncio.ensure_future(push(c, 2, 0))
    await gate.entered()  # the first commit's sync is stopped: the other commits queue behind it
    rest = [asyncio.ensure_future(push(c, 2, a)) for a in range(1, 12)]
    await c.stats()
    await gate.release()
    assert all(r == [200_000, 200_000 // 3] for r in await asyncio.gather(first, *rest))
    syncs = (await c.stats())["disk"]["syncs"] - before
    assert syncs < 2 * 12, f"12 commits took {syncs} syncs: they did not share them"
    await c.close()


@within(60)
async def test_background_syncs_what_was_written_within_the_interval(tmp_path: Path) -> None:
    d, gate = start(tmp_path, "--fsync", "background", "--fsync-interval", "0.2")
    try:
        c = await AsyncClient.connect(d.addr)
        await push(c, 3, 0)
        await c.flush("fsync-app", 3)  # on disk now (a flush does not wait for the background sync)
        disk = await wait_until(
            lambda: c.stats(), lambda s: s["disk"]["syncs"] and not s["disk"]["unsynced_bytes"], 20, "synced"
        )
        assert disk["disk"]["sync_failures"] == 0
        assert any(s.endswith("/3/data") for s in gate.synced())
        await c.close()
    finally:
        d.stop()


@within(60)
async def test_with_fsync_none_nothing_is_synced(tmp_path: Path) -> None:
    """The shim sees fsyncs where they happen: the tests above can fail."""
    d, gate = start(tmp_path)
    try:
        c = await AsyncClient.connect(d.addr)
        await push(c, 4, 0)
        await c.flush("fsync-app", 4)
        assert (await c.stats())["disk"]["syncs"] == 0
        await c.close()
    finally:
        d.stop()
    assert gate.synced() == []


@within(60)
async def test_a_writer_may_ask_for_fsync_at_commit_from_a_daemon_that_does_not(tmp_path: Path) -> None:
    d, gate = start(tmp_path)  # --fsync none
    try:
        c = await AsyncClient.connect(d.addr)
        await push(c, 5, 0)  # not asked: nothing synced
        assert (await c.stats())["disk"]["syncs"] == 0
        gate.arm()
        commit = asyncio.ensure_future(push(c, 5, 1, fsync="commit"))
        await gate.entered()
        await c.stats()
        assert not commit.done(), "the CommitAck came before the fsync the writer asked for"
        await gate.release()
        assert await commit == [200_000, 200_000 // 3]
        assert (await c.stats())["disk"]["syncs"] >= 2
        with pytest.raises(ValueError, match="fsync must be one of commit"):
            await c.open_writer("fsync-app", 5, 2, 2, 2, fsync="always")
        await c.close()
    finally:
        d.stop()


@within(60)
async def test_fsync_at_commit_needs_a_data_dir(tmp_path: Path) -> None:
    d = DaemonProcess(HOST, free_port([HOST]), "16M", ["--data-dir", "none"]).wait_ready()
    try:
        c = await AsyncClient.connect(d.addr)
        with pytest.raises(InvalidRequest, match="asks for fsync at commit, and this daemon has no data dir"):
            await c.open_writer("fsync-app", 6, 0, 0, 1, fsync="commit")
        await c.close()
    finally:
        d.stop()


def test_fsync_needs_a_data_dir() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "shuffled", "serve", "--data-dir", "none", "--fsync", "commit", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "fsync commit needs a data dir" in out.stderr
