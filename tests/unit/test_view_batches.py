"""A server's reader takes a view's payloads a batch at a time (`ReadView.take`): the batches are exactly
the payloads taken one a call, as far as the room goes, and the bytes a batch counts are its runs'. A
failure (or a bug) in the middle of a batch reaches the reader at its next call, after the payloads before
it went to the sink (they are the client's to read), and every segment comes back.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffled.buffers import Chunk, GlobalPool
from shuffled.protocol.errors import InternalError, PartitionNotFound, ShuffledError
from shuffled.server.serving.view_reader import ViewReader
from shuffled.server.storage.disk import Disk
from shuffled.server.storage.loader import PieceLoader
from shuffled.server.storage.plan import make_plan
from shuffled.server.storage.shuffles import MapOutput
from shuffled.server.storage.store import Store
from shuffled.server.storage.view import ReadView
from tests.aio import within
from tests.pieces import push, split, unpack

SEG = 4096
PARTITIONS = 5
#: partition -> bytes: an empty partition, small ones (copied into frames) and one spanning several pieces
DATA = {p: bytes([p]) * n for p, n in enumerate([900, 0, 5, 5 * SEG // 2, 40]) if n}


def _store(root: Path) -> tuple[GlobalPool, Store, Disk]:
    pool = GlobalPool(64 * SEG, SEG, reserve=24)
    store = Store(SEG, can_spill=True)
    out = store.open_map_output("app", 0, 1, 1, PARTITIONS)
    for group in split(1, sorted(DATA.items()), SEG):
        push(pool, store, out, group)
    store.commit(out)
    return pool, store, Disk(str(root))


def _view(pool: GlobalPool, store: Store, disk: Disk) -> ReadView:
    return ReadView(make_plan(store, "app", 0, 0, PARTITIONS, [1], digest=b""), pool, PieceLoader(disk))


def _bytes(chunks: list[Chunk]) -> list[bytes]:
    got = [bytes(c.buffer.data()) for c in chunks]
    for c in chunks:
        c.buffer.release()
    return got


def _runs(payloads: list[bytes]) -> int:
    return sum(len(run) for payload in payloads for *_, run in unpack(payload))


@settings(max_examples=30, deadline=None)
@given(rooms=st.lists(st.integers(0, 6), min_size=1, max_size=12))
def test_a_batch_is_what_next_gives_call_after_call(rooms: list[int]) -> None:
    with tempfile.TemporaryDirectory() as root:
        _batches_as_single_payloads(Path(root), rooms)


def _batches_as_single_payloads(root: Path, rooms: list[int]) -> None:
    pool, store, disk = _store(root)
    one = _view(pool, store, disk)
    singly: list[bytes] = []
    while single := one.take(1, 1)[0]:
        singly += _bytes(single)
    assert one.finished
    batched: list[bytes] = []
    view = _view(pool, store, disk)
    for room in [*rooms, 1 << 10]:
        chunks, data = view.take(room)
        assert len(chunks) <= room + 1, "a batch stays within the room (the read's last frame may go beyond it)"
        got = _bytes(chunks)
        assert data == _runs(got)
        batched += got
    assert view.finished and batched == singly
    assert pool.used == store.memory_segments, "every frame's segment came back"
    disk.close()


@within(30)
@pytest.mark.parametrize(
    ("failure", "raised", "why"),
    [
        (RuntimeError("boom"), InternalError, "RuntimeError: boom"),
        (PartitionNotFound("gone"), PartitionNotFound, "gone"),
    ],
    ids=["bug", "failure"],
)
async def test_a_failure_in_a_batch_comes_after_the_payloads_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: Exception, raised: type[ShuffledError], why: str
) -> None:
    pool, store, disk = _store(tmp_path)
    chunks, _ = _view(pool, store, disk).take(1 << 10)
    everything = _bytes(chunks)
    calls = 0
    piece = MapOutput.buffer

    def failing(out: MapOutput, index: int) -> object:
        nonlocal calls
        calls += 1
        if calls == 3:  # the last of three pieces
            raise failure
        return piece(out, index)

    monkeypatch.setattr(MapOutput, "buffer", failing)
    batches: list[tuple[list[bytes], int]] = []
    ended: asyncio.Future[ShuffledError] = asyncio.get_running_loop().create_future()
    reader = ViewReader(
        _view(pool, store, disk),
        lambda got, data: batches.append((_bytes(got), data)),
        lambda: 1 << 10,
        lambda: ended.set_exception(AssertionError("the read finished")),
        ended.set_result,
    )
    reader.start()
    exc = await ended
    assert isinstance(exc, raised) and why in str(exc)
    assert raised is not InternalError or exc.__cause__ is failure, "a bug's failure names it"
    assert all(data == _runs(batch) for batch, data in batches), "a batch counts the bytes of its runs"
    sent = [payload for batch, _ in batches for payload in batch]
    assert sent and sent == everything[: len(sent)], "the payloads before the failure went out first"
    assert pool.used == store.memory_segments, "the frame in progress came back"
    disk.close()
