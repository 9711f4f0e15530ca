"""The Python client's map writer, against a real daemon, over TCP and through shared memory (where it packs
straight into the daemon's slots): whatever the order, sizes and kinds of the writes, and however often
the buffer fills, each partition reads back as its writes in the order they were made, and `commit()`
returns its lengths.

Hypothesis makes the writes: partitions ascending (packed from where they lie in the writer's buffer) or in
any order (gathered by partition first), sizes from empty to larger than the whole buffer (pushed straight
from the caller's data), as `bytes`, a `bytearray` the caller changes right after the write returns (the
writer must have copied it) or a `memoryview` slice. The buffers are small, so most writers flush many times
and a flush's groups cut partitions anywhere. In the end every segment is back in the daemon's pool.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shuffled.launch import DaemonProcess
from shuffled_client import AsyncClient
from tests.aio import run
from tests.cluster import pool_settled, start_daemon

SEGMENT = 4096
APP = "writer-app"
PARTITIONS = 6
_shuffles = itertools.count(1)

#: (partition, size, kind) of one write
Write = tuple[int, int, str]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str]]:
    """A daemon and its Unix socket's address (through which it offers shared memory)."""
    root = tmp_path_factory.mktemp("data")
    sock = root / "d.sock"
    flags = ["--data-dir", str(root), "--segment-size", str(SEGMENT), "--unix-socket", str(sock)]
    d = start_daemon("127.0.0.1", 0, "4M", [*flags, "--shm-dir", "/dev/shm"])
    try:
        yield d, f"unix:{sock}"
    finally:
        d.stop()


def _body(step: int, size: int) -> bytes:
    return bytes((step * 37 + i) % 251 for i in range(size))


@st.composite
def writes(draw: st.DrawFn) -> tuple[int, list[Write]]:
    buffer_size = draw(st.sampled_from([SEGMENT // 2, 3 * SEGMENT, 16 * SEGMENT]))
    sizes = st.sampled_from([0, 1, 100, SEGMENT - 3, SEGMENT + 9, 3 * SEGMENT, 20 * SEGMENT])
    kinds = st.sampled_from(["bytes", "bytearray", "memoryview"])
    partitions = draw(st.lists(st.integers(0, PARTITIONS - 1), min_size=1, max_size=24))
    if draw(st.booleans()):
        partitions.sort()  # a sorted writer's order: packed where it lies
    return buffer_size, [(p, draw(sizes), draw(kinds)) for p in partitions]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes())
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_every_partition_reads_back_as_written_in_order(
    daemon: tuple[DaemonProcess, str], transport: str, case: tuple[int, list[Write]]
) -> None:
    buffer_size, made = case
    shuffle = next(_shuffles)
    want = [bytearray() for _ in range(PARTITIONS)]

    async def body() -> None:
        process, local = daemon
        async with await AsyncClient.connect(process.addr if transport == "tcp" else local) as client:
            assert (client.session.region is not None) == (transport == "shm")
            before = (await client.stats())["traffic"]
            writer = await client.open_writer(APP, shuffle, 0, 1, PARTITIONS, buffer_size=buffer_size)
            for step, (partition, size, kind) in enumerate(made):
                data = _body(step, size)
                want[partition] += data
                if kind == "bytes":
                    await writer.write(partition, data)
                elif kind == "bytearray":
                    scratch = bytearray(data)
                    await writer.write(partition, scratch)
                    scratch[:] = bytes(len(scratch))  # the caller reuses its buffer: the writer copied it
                else:
                    padded = b"<" + data + b">"
                    await writer.write(partition, memoryview(padded)[1:-1])
            assert await writer.commit() == [len(w) for w in want]
            for partition in range(PARTITIONS):
                got = bytearray()
                async with client.read(APP, shuffle, partition, partition + 1, {"": [1]}) as reader:
                    async for chunk in reader:
                        got += chunk.data
                assert got == want[partition], f"partition {partition}"
            await client.unregister_shuffle(APP, shuffle)
            s = await pool_settled(client)
            assert s["pool"]["used"] == 0, s["pool"]
            placed, pushed = (s["traffic"][k] - before[k] for k in ("placed_buffers", "pushed_buffers"))
            assert placed == (pushed if transport == "shm" else 0), (placed, pushed)

    run(body(), 60)
