"""Against a real daemon: any split of any partitions' data across packed groups reads
back identically, for every range, from memory, from spill and after a restart.

Hypothesis makes the map outputs (empty partitions, a partition spanning many groups, writers that flushed
several times so their pieces form several ascending sequences, groups cut anywhere, even inside a run)
and pushes exactly those groups, interleaved, over TCP into one daemon process with 4 KiB segments. Every
range [lo, hi) is then read with the Python client, per run and in bulk (`groups()`), three times: from
memory (partly on disk: a `flush` midway through the pushes), after `flush` wrote it all to the data dir,
and after the daemon was restarted on that dir (stopped with SIGTERM or killed with -9). Every read must
hold exactly the bytes pushed per (partition, attempt), each pair's runs consecutive and each attempt's
pairs together in ascending order; in the end every segment is back in the pool.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shuffled.launch import free_port
from shuffled.net.streams import Payload
from shuffled_client import AsyncClient, MapWriter
from tests.aio import run
from tests.cluster import pool_settled, start_daemon
from tests.pieces import Output, check, group_runs, outputs

SEGMENT = 4096
FLAGS = ["--segment-size", str(SEGMENT)]
APP = "prop-app"
_shuffles = itertools.count()


class Daemon:
    """One daemon on a fixed address and data dir, restarted in place."""

    def __init__(self, root: str) -> None:
        self.port = free_port(["127.0.0.1"])
        self.flags = ["--data-dir", root, *FLAGS]
        self.process = start_daemon("127.0.0.1", self.port, "4M", self.flags)

    def restart(self, kill: bool) -> None:
        if kill:
            self.process.proc.send_signal(signal.SIGKILL)
            self.process.proc.wait(10)
        else:
            self.process.stop()
        self.process = start_daemon("127.0.0.1", self.port, "4M", self.flags)

    @property
    def addr(self) -> str:
        return self.process.addr


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(str(tmp_path_factory.mktemp("data")))
    try:
        yield d
    finally:
        d.process.stop()


async def push_groups(writer: MapWriter, groups: list[bytes]) -> None:
    """Push exactly these groups (the client's writers pack their own): one PushData each, under credit."""
    for group in groups:
        _, buf, _ = await writer._room()
        assert buf is not None, "over TCP a group goes into a segment of the client's pool"
        buf.memory[: len(group)] = group
        buf.length = len(group)
        writer.stream.push_data(Payload(buf))
        writer.session.wake(writer.stream)


async def read_every_range(client: AsyncClient, shuffle: int, partitions: int, outs: list[Output]) -> None:
    named = [o.attempt for o in outs]
    for lo in range(partitions):
        for hi in range(lo + 1, partitions + 1):
            runs = []
            async with client.read(APP, shuffle, lo, hi, {"": named}) as reader:
                async for chunk in reader:
                    runs.append((chunk.attempt, chunk.partition, bytes(chunk.data)))
            want = {(p, o.attempt): d for o in outs for p, d in o.data.items() if lo <= p < hi}
            check(runs, want)
            async with client.read(APP, shuffle, lo, hi, {"": named}) as reader:  # the bulk read: the same runs
                groups = [(g.attempt, g.partitions, g.lengths, bytes(g.data)) async for g in reader.groups()]
            check([run for group in groups for run in group_runs(*group)], want)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, list[Output], list[int], int, bool]:
    partitions = draw(st.integers(1, 7))
    outs = [draw(outputs(partitions, a, SEGMENT)) for a in range(1, draw(st.integers(1, 3)) + 1)]
    order = draw(st.permutations([o.attempt for o in outs for _ in o.groups]))
    return partitions, outs, order, draw(st.integers(0, len(order))), draw(st.booleans())


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios())
def test_any_split_reads_back_for_every_range_from_memory_spill_and_restart(
    daemon: Daemon, scenario: tuple[int, list[Output], list[int], int, bool]
) -> None:
    partitions, outs, order, midway, kill = scenario
    shuffle = next(_shuffles)

    async def body() -> None:
        async with await AsyncClient.connect(daemon.addr) as client:
            writers = {
                o.attempt: await client.open_writer(APP, shuffle, o.attempt, o.attempt, partitions) for o in outs
            }
            pending = {o.attempt: iter(o.groups) for o in outs}
            for step, a in enumerate(order):  # the attempts' groups interleaved, each attempt's in its order
                if step == midway:  # what landed so far goes to disk: the attempts' pieces interleave in the file
                    await client.flush(APP, shuffle)
                await push_groups(writers[a], [next(pending[a])])
            for o in outs:
                assert await writers[o.attempt].commit() == [len(o.data.get(p, b"")) for p in range(partitions)]
            await read_every_range(client, shuffle, partitions, outs)  # from memory
            await client.flush(APP, shuffle)
            assert (await client.stats())["store"]["stored_segments"] == 0
            await read_every_range(client, shuffle, partitions, outs)  # from the data file
        await asyncio.to_thread(daemon.restart, kill)
        async with await AsyncClient.connect(daemon.addr) as client:
            await read_every_range(client, shuffle, partitions, outs)  # from the journal's pieces
            await client.unregister_shuffle(APP, shuffle)
            s = await pool_settled(client)
            assert s["pool"]["used"] == 0 and s["disk"]["files"] == 0, s

    run(body(), 60)
