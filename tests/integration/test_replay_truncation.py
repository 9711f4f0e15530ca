"""A restart never serves data the disk does not hold: a data dir written by a daemon with `--fsync commit`
and then killed is cut at every journal record boundary (and inside records), and the data file at every
piece boundary (and inside pieces); each time, replay serves only attempts whose every piece lies in the
file with the CRC32C its record names, fewer as the cut comes earlier, and all of them uncut."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from shuffled.launch import DaemonProcess
from shuffled.protocol.integrity import checksum
from shuffled.server.storage.disk import DATA, JOURNAL, Disk, LoadedShuffle
from shuffled.server.storage.replay import load
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import free_port, payload

HOST = "127.0.0.1"
ATTEMPTS = 5
_RECORD = struct.Struct(">II")


async def _written(tmp_path: Path) -> Path:
    """A data dir holding ATTEMPTS committed attempts of one shuffle, its daemon killed (nothing persisted
    at stop: only what the commits wrote)."""
    data_dir = tmp_path / "written"
    d = DaemonProcess(HOST, free_port([HOST]), "16M", ["--data-dir", str(data_dir), "--fsync", "commit"])
    d.wait_ready()
    try:
        c = await AsyncClient.connect(d.addr)
        for attempt in range(ATTEMPTS):
            w = await c.open_writer("cut", 1, attempt, attempt, 2)
            await w.write(0, payload(attempt, 0, 70_000 + 10_000 * attempt))
            await w.write(1, payload(attempt, 1, 30_000))
            await w.commit()
        await c.close()
    finally:
        d.proc.kill()
        d.stop()
    return data_dir


def _served(root: Path) -> dict[int, int]:
    """What replay serves from `root` (attempt -> pieces), after checking every piece against the file."""
    disk = Disk(str(root))
    try:
        shuffles: list[LoadedShuffle] = load(disk)
    finally:
        disk.close()
    served: dict[int, int] = {}
    for shuffle in shuffles:
        data = (Path(shuffle.directory) / DATA).read_bytes()
        for attempt, found in shuffle.committed.items():
            for offset, size, crc in zip(found.offsets, found.sizes, found.crcs, strict=True):
                piece = data[offset : offset + size]
                assert len(piece) == size, f"attempt {attempt} names bytes past the end of the file"
                assert checksum(piece) == crc, f"attempt {attempt} names bytes the file does not hold"
            served[attempt] = len(found.sizes)
    return served


def _boundaries(journal: bytes) -> list[int]:
    ends, pos = [0], 0
    while pos < len(journal):
        length, _ = _RECORD.unpack_from(journal, pos)
        pos += _RECORD.size + length
        ends.append(pos)
    return ends


def _cut(written: Path, into: Path, name: str = JOURNAL, size: int | None = None) -> Path:
    """A copy of the data dir with file `name` cut to `size` bytes (None: whole)."""
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(written, into)
    if size is not None:
        (path,) = into.glob(f"app-*/*/{name}")
        with open(path, "r+b") as f:
            f.truncate(size)
    return into


@within(120)
async def test_replay_serves_only_what_the_cut_files_hold(tmp_path: Path) -> None:
    written = await _written(tmp_path)
    full = _served(_cut(written, tmp_path / "cut"))
    assert sorted(full) == list(range(ATTEMPTS))

    (journal_path,) = written.glob(f"app-*/*/{JOURNAL}")
    journal = journal_path.read_bytes()
    ends = _boundaries(journal)
    assert ends[-1] == len(journal) and len(ends) > ATTEMPTS
    before: set[int] = set()
    for end in ends:
        for size in (end, end + 5):  # at the boundary, and a torn record after it
            served = set(_served(_cut(written, tmp_path / "cut", JOURNAL, min(size, len(journal)))))
            assert before <= served, f"cutting the journal at {size} serves less than cutting it earlier"
        before = served
    assert before == set(full)

    ends_of = _ends(written)  # attempt -> where its last piece ends in the data file
    cuts = sorted({0, *ends_of.values()})
    assert len(cuts) > ATTEMPTS, "the attempts were not written through at their commits: nothing to cut"
    for end in cuts:
        for size in (end, max(0, end - 7)):  # at an attempt's end, and inside its last piece
            served = set(_served(_cut(written, tmp_path / "cut", DATA, size)))
            assert served == {a for a, e in ends_of.items() if e <= size}, f"data file cut at {size}"


def _ends(written: Path) -> dict[int, int]:
    disk = Disk(str(_cut(written, written.parent / "ends")))
    try:
        return {
            attempt: max(o + s for o, s in zip(found.offsets, found.sizes, strict=True))
            for shuffle in load(disk)
            for attempt, found in shuffle.committed.items()
        }
    finally:
        disk.close()
