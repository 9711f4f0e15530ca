"""Encryption at rest: with `--at-rest-key-file` a canary pushed and spilled appears nowhere in the data dir
(without it, it does: the check can fail), reads and a restart give the bytes back, a flipped bit is
CORRUPT_DATA, a restart without the key or with another one refuses to start, and rotation keeps old data
readable. test_at_rest_objects.py does the same for objects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shuffled.launch import DaemonProcess
from shuffled_client import AsyncClient, CorruptData
from tests.aio import within
from tests.cluster import free_port

HOST = "127.0.0.1"
CANARY = b"at-rest-canary-5b2f" * 3000  # 57 KB: two pieces
APP = "sealed-app"


def _key(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    return path


def _start(data_dir: Path, *flags: str) -> DaemonProcess:
    return DaemonProcess(HOST, free_port([HOST]), "16M", ["--data-dir", str(data_dir), *flags]).wait_ready()


async def _push_and_flush(d: DaemonProcess, shuffle: int = 1) -> None:
    c = await AsyncClient.connect(d.addr)
    w = await c.open_writer(APP, shuffle, 0, 0, 2)
    await w.write(0, CANARY)
    await w.write(1, CANARY[:1000])
    await w.commit()
    assert (await c.flush(APP, shuffle))["flushed_bytes"] > len(CANARY)
    await c.close()


async def _read(d: DaemonProcess, shuffle: int = 1) -> bytes:
    c = await AsyncClient.connect(d.addr)
    try:
        async with c.read(APP, shuffle, 0, 2, {d.addr: [0]}) as reader:
            return await reader.read_all()
    finally:
        await c.close()


def _holds_canary(data_dir: Path) -> bool:
    needle = CANARY[:19]
    return any(needle in p.read_bytes() for p in data_dir.rglob("*") if p.is_file())


@within(60)
async def test_a_canary_is_nowhere_on_disk_and_reads_back(tmp_path: Path) -> None:
    key = _key(tmp_path / "key", "k" * 40)
    d = _start(tmp_path / "data", "--at-rest-key-file", str(key))
    try:
        await _push_and_flush(d)
        assert not _holds_canary(tmp_path / "data"), "the canary is on disk in plain text"
        assert await _read(d) == CANARY + CANARY[:1000]
    finally:
        d.stop()
    d = _start(tmp_path / "data", "--at-rest-key-file", str(key))  # restored from the journal
    try:
        assert await _read(d) == CANARY + CANARY[:1000]
    finally:
        d.stop()


@within(60)
async def test_without_a_key_the_canary_is_on_disk(tmp_path: Path) -> None:
    d = _start(tmp_path / "data")
    try:
        await _push_and_flush(d)
        assert _holds_canary(tmp_path / "data")
    finally:
        d.stop()


@within(60)
async def test_a_flipped_bit_is_corrupt_data(tmp_path: Path) -> None:
    key = _key(tmp_path / "key", "f" * 40)
    d = _start(tmp_path / "data", "--at-rest-key-file", str(key))
    try:
        await _push_and_flush(d)
        (data,) = (tmp_path / "data").glob("app-*/1/data")
        with open(data, "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0x04]))
        with pytest.raises(CorruptData, match="authentication tag"):
            await _read(d)
    finally:
        d.stop()


def _refused(data_dir: Path, *flags: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "shuffled", "serve", "--host", HOST, "--port", "0", "--data-dir", str(data_dir), *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    return out.stderr


@within(90)
async def test_a_restart_needs_the_key_and_rotation_keeps_old_keys(tmp_path: Path) -> None:
    old = _key(tmp_path / "old", "o" * 40)
    d = _start(tmp_path / "data", "--at-rest-key-file", str(old))
    try:
        await _push_and_flush(d)
    finally:
        d.stop()
    assert "no at-rest-key-file gives" in _refused(tmp_path / "data")
    new = _key(tmp_path / "new", "n" * 40)
    assert "at-rest-key-file does not hold" in _refused(tmp_path / "data", "--at-rest-key-file", str(new))
    rotated = _key(tmp_path / "rotated", "n" * 40 + "\n" + "o" * 40)
    d = _start(tmp_path / "data", "--at-rest-key-file", str(rotated))
    try:
        assert await _read(d) == CANARY + CANARY[:1000]  # sealed with the old key, opened with it
        await _push_and_flush(d, shuffle=2)  # a new shuffle is sealed with the new key
        assert await _read(d, shuffle=2) == CANARY + CANARY[:1000]
    finally:
        d.stop()
    assert "does not hold" in _refused(tmp_path / "data", "--at-rest-key-file", str(new))  # shuffle 1 needs old


def test_a_short_key_or_nowhere_to_write_is_refused(tmp_path: Path) -> None:
    short = _key(tmp_path / "short", "s" * 10)
    assert "fewer than 32 bytes" in _refused(tmp_path / "data", "--at-rest-key-file", str(short))
    key = _key(tmp_path / "key", "k" * 40)
    assert "needs a data dir or an object store" in _refused(Path("none"), "--at-rest-key-file", str(key))
