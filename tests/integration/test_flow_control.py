"""Flow-control properties on real daemons: no head-of-line blocking, bounded memory,
nothing leaked when a client process is killed mid-push or mid-read."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import time

from shuffled.config import DaemonConfig
from shuffled.protocol import codec
from shuffled.protocol.frames import AdminRequest, AdminResponse, CommitAck, CommitMapOutput, OpenMapOutput, PushCredit
from shuffled.protocol.packed import group_bytes
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import Cluster, cluster_fixture, payload, pool_settled, rss, wait_until
from tests.integration.test_bad_input import Raw
from tests.shuffles import push, read_range
from tests.units import MiB

APP = "app-flow"
DEFAULTS = DaemonConfig()


pair = cluster_fixture(2, pool_size="64M")


@within(120)
async def test_stalled_reader_does_not_block_others_on_the_shared_connection(pair: Cluster) -> None:
    """One reader stops after its first chunk; 32 others on the same A->B connection finish,
    and the stalled stream holds only its gate's buffers at B (credit, not TCP, stops it)."""

    da, db = pair.daemons
    a, b = await AsyncClient.connect(da.addr), await AsyncClient.connect(db.addr)
    sizes = [24 * MiB] + [1 * MiB] * 32
    await push(a, APP, 10, 1, sizes)
    loc = {da.addr: [1]}

    stalled = b.read(APP, 10, 0, 1, loc)
    first = await stalled.next_chunk()
    assert first is not None
    started = time.monotonic()
    others = await asyncio.gather(*(read_range(b, APP, 10, p, p + 1, loc) for p in range(1, 33)))
    elapsed = time.monotonic() - started
    for p, data in enumerate(others, start=1):
        assert data == payload(1, p, sizes[p])
    # While stalled, B holds at most one gate's buffers (exclusive + floating) for it.
    stats = await wait_until(b.stats, lambda s: s["streams"]["served"] == 1, what="only the stalled stream left")
    assert stats["pool"]["used"] <= DEFAULTS.exclusive_buffers + DEFAULTS.floating_buffers, stats
    print(f"32 streams x 1 MiB beside a stalled 24 MiB stream: {32 / elapsed:.1f} MiB/s")

    rest = bytearray(first.data)
    while (chunk := await stalled.next_chunk()) is not None:
        rest += chunk.data
    assert rest == payload(1, 0, sizes[0])
    await a.unregister_shuffle(APP, 10)
    for c in (a, b):
        assert (await pool_settled(c))["pool"]["used"] == 0
        await c.close()


@within(60)
async def test_relayed_read_announces_the_whole_backlog_to_the_client(pair: Cluster) -> None:
    """The relaying daemon tells its client the backlog the remote daemon announced, not only the few
    buffers it holds itself, so the client's window opens to its floating maximum at once."""

    da, db = pair.daemons
    a, b = await AsyncClient.connect(da.addr), await AsyncClient.connect(db.addr)
    await push(a, APP, 11, 1, [4 * MiB])  # 128 buffers, all queued at A at once
    async with b.read(APP, 11, 0, 1, {da.addr: [1]}) as reader:
        first = await reader.next_chunk()
        assert first is not None
        assert reader.credit.backlog >= 100, reader.credit.backlog
        rest = bytearray(first.data)
        while (chunk := await reader.next_chunk()) is not None:
            rest += chunk.data
    assert rest == payload(1, 0, 4 * MiB)
    await a.unregister_shuffle(APP, 11)
    for c in (a, b):
        assert (await pool_settled(c))["pool"]["used"] == 0
        await c.close()


@within(240)
async def test_memory_stays_bounded_moving_ten_times_the_pool(pair: Cluster) -> None:
    """Rounds of push → slow read across daemons → unregister: 10x the pool moves through,
    RSS of both daemons stays within pool + 100 MB, and every segment comes back."""

    da, db = pair.daemons
    a, b = await AsyncClient.connect(da.addr), await AsyncClient.connect(db.addr)
    pool = da.pool_size
    per_round = 40 * MiB
    rounds = (10 * pool) // per_round + 1
    peak = {da.pid: 0, db.pid: 0}
    sampling = True

    async def sample() -> None:
        while sampling:
            for pid in peak:
                peak[pid] = max(peak[pid], rss(pid))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    moved = 0
    for r in range(rounds):
        shuffle = 100 + r
        await push(a, APP, shuffle, r, [per_round // 4] * 4)

        async def slow_read(p: int, shuffle: int = shuffle, r: int = r) -> int:
            n = 0
            h = hashlib.sha256()
            async with b.read(APP, shuffle, p, p + 1, {da.addr: [r]}) as reader:
                async for chunk in reader:
                    for _ in range(3):  # a reader slower than the network
                        h.update(chunk.data)
                    n += len(chunk.data)
            return n

        moved += sum(await asyncio.gather(*(slow_read(p) for p in range(4))))
        await a.unregister_shuffle(APP, shuffle)
    sampling = False
    await sampler
    assert moved >= 10 * pool
    for c in (a, b):
        s = await pool_settled(c)
        assert s["pool"]["used"] == 0 and s["pool"]["free"] == s["pool"]["total"]
        await c.close()
    limit = pool + 100 * 1000 * 1000
    print(f"moved {moved / MiB:.0f} MiB; peak RSS A={peak[da.pid] / MiB:.0f} MiB B={peak[db.pid] / MiB:.0f} MiB")
    assert peak[da.pid] <= limit and peak[db.pid] <= limit, peak


_CHILD_PUSH = """
import asyncio, sys
from shuffled.config import DaemonConfig
from shuffled_client import AsyncClient
async def main():
    c = await AsyncClient.connect(sys.argv[1])
    w = await c.open_writer("app-flow", 20, 0, 1, 4)
    for i in range(160):
        await w.write(i % 4, b"x" * (64 << 10))
        if i == 80:
            print("pushing", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
asyncio.run(main())
"""

_CHILD_READ = """
import asyncio, sys
from shuffled.config import DaemonConfig
from shuffled_client import AsyncClient
async def main():
    c = await AsyncClient.connect(sys.argv[1])
    reader = c.read("app-flow", 21, 0, 1, {sys.argv[2]: [5]})
    await reader.next_chunk()
    print("reading", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
asyncio.run(main())
"""


async def _run_and_kill(code: str, args: list[str], marker: str) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), 30)
    assert line.decode().strip() == marker
    child.kill()
    await child.wait()


@within(120)
async def test_client_killed_mid_push_and_mid_read_leaks_nothing(pair: Cluster) -> None:
    da, db = pair.daemons
    a, b = await AsyncClient.connect(da.addr), await AsyncClient.connect(db.addr)

    # Mid-push: the open map output is aborted and its buffers freed.
    await _run_and_kill(_CHILD_PUSH, [da.addr], "pushing")
    s = await pool_settled(a)
    assert s["store"]["open_map_outputs"] == 0 and s["pool"]["used"] == 0

    # Mid-read through B of data held by A: B's gate and A's served stream go away.
    await push(a, APP, 21, 5, [16 * MiB])
    await _run_and_kill(_CHILD_READ, [db.addr, da.addr], "reading")
    await pool_settled(b)
    s = await pool_settled(a)
    assert s["pool"]["used"] == s["store"]["stored_segments"]
    assert s["store"]["memory_bytes"] >= 16 * MiB  # the pushed groups, directories included

    # Both daemons keep serving everyone else.
    assert await read_range(b, APP, 21, 0, 1, {da.addr: [5]}) == payload(5, 0, 16 * MiB)
    await a.remove_application(APP)
    for c in (a, b):
        assert (await pool_settled(c))["pool"]["used"] == 0
        await c.close()


@within(90)
async def test_loaded_relay_gives_floating_credit_and_stays_bounded(pair: Cluster) -> None:
    """B's pool holds stored data between its spill watermarks (normal under load): a read relayed
    through B still gets floating buffers there, within the pool's bounds (the read reserve stays free,
    usage stays below the high watermark), a push into B meanwhile completes, and every segment comes back."""

    da, db = pair.daemons
    a, b = await AsyncClient.connect(da.addr), await AsyncClient.connect(db.addr)
    # 1545 of B's 2048 segments (75.4 %): more than the old rule allowed floating buffers at (twice the
    # read reserve free, so below 75 %), and below where background spilling starts (half way from the
    # low watermark to the high one, 77.5 %), which would take stored data back under 70 %.
    await push(b, APP, 30, 1, [309 * DEFAULTS.segment_size] * 5)
    loaded = await pool_settled(b)
    total, reserve = loaded["pool"]["total"], loaded["pool"]["reserve"]
    stored = loaded["store"]["stored_segments"]
    start = (DEFAULTS.spill_low + DEFAULTS.spill_high) / 2
    assert total - 2 * reserve < stored < start * total and loaded["disk"]["spills"] == 0, loaded
    await push(a, APP, 31, 1, [4 * MiB])  # 128 buffers queued at A at once: a large backlog

    reader = b.read(APP, 31, 0, 1, {da.addr: [1]})
    first = await reader.next_chunk()  # then the client stops consuming: B's gate fills up
    assert first is not None
    held = await wait_until(b.stats, lambda s: s["pool"]["floating"] > 0, what="B's gate holds floating buffers")
    # Floating buffers stay below the start mark, so they alone never make B spill its stored data.
    assert held["pool"]["free"] >= reserve and held["pool"]["used"] < start * total, held
    assert held["disk"]["spills"] == 0, held
    assert held["pool"]["floating"] <= DEFAULTS.floating_buffers, held

    await asyncio.wait_for(push(b, APP, 32, 1, [8 * MiB]), 30)  # pushes still make progress
    rest = bytearray(first.data)
    while (chunk := await reader.next_chunk()) is not None:
        rest += chunk.data
    assert rest == payload(1, 0, 4 * MiB)
    for c, shuffles in ((a, [31]), (b, [30, 32])):
        for shuffle in shuffles:
            await c.unregister_shuffle(APP, shuffle)
        s = await pool_settled(c)
        assert s["pool"]["used"] == 0 and s["pool"]["floating"] == 0, s
        await c.close()


@within(60)
async def test_push_credit_is_told_in_batches_and_never_runs_short(pair: Cluster) -> None:
    """A writer on a daemon with memory to spare hears of new push credit a quarter window at a time: a
    PushCredit per 4 segments of a 16-segment window, not one per segment (each a system call on both sides).
    The writer pushes one buffer at a time and waits for an admin answer after each (the daemon handles a
    connection's frames in order), so every PushCredit the daemon made for a push is seen before that
    answer: one per push before. It never runs short of credit on the way (a push without credit would be
    refused), and every credit the daemon granted is told by the commit."""
    raw = await Raw.open(pair.daemons[0].addr)
    await raw.hello()
    await raw.send(codec.encode(OpenMapOutput(1, "batch-app", 1, 0, 1, 4)))
    first = await raw.frame()
    assert isinstance(first, PushCredit) and first.credit == 16, first
    known, told, pushes = first.credit, 1, 64
    for i in range(pushes):
        assert known > 0, f"push {i}: no credit left"
        await raw.send(codec.encode_push_data(1, i, group_bytes(1, [(i % 4, b"c" * 30_000)])))
        known -= 1
        await raw.send(codec.encode(AdminRequest(2 + i, "stats", {})))
        while not isinstance(frame := await raw.frame(), AdminResponse):
            assert isinstance(frame, PushCredit), frame
            known, told = known + frame.credit, told + 1
        assert 12 <= known <= 16, f"push {i}: the writer knows of {known} credits"
    assert told <= 2 + pushes // 4, f"{told} PushCredit frames for {pushes} pushes"
    await raw.send(codec.encode(CommitMapOutput(1, pushes)))
    while not isinstance(frame := await raw.frame(), CommitAck):
        assert isinstance(frame, PushCredit), frame
    raw.writer.close()
    c = await AsyncClient.connect(pair.daemons[0].addr)
    try:
        await c.remove_application("batch-app")
        await pool_settled(c)
    finally:
        await c.close()
