"""`hol`: 64 readers through B from A; does one reader that stops consuming slow down the other 63?

Before credit-based flow control, a consumer that stopped reading filled the
shared connection's socket buffers and stalled every stream on it (head-of-line
blocking). Here one reader takes its first chunk and then holds it, never asking
for the next, until the other 63 have finished. With credit, the senders stop
only that stream once its credit is spent, so the others should keep at least 90%
of the throughput they have when nobody stalls. Both kinds of round run in the
same run against the same daemons, alternating, after one warm-up round. The
others must complete, and the stalled reader must finish once it resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from shuffled_client import AsyncClient

from .common import (
    SEGMENTS_PER_READER,
    BenchmarkFailure,
    Context,
    CpuMeter,
    Goal,
    MiB,
    Plot,
    ScenarioResult,
    bounded,
    drain,
    median,
    mib_per_s,
    push,
    reader_client_pool,
    relay_pool,
    require,
    store_pool,
    timed_read,
    warm_up_peer,
)

APP = "bench-hol"
SHUFFLE = 1
ATTEMPT = 1
READERS = 64
#: the partition whose reader stalls (in the other rounds it is read normally, and left out of the aggregate)
STALLED = 0


class _Round:
    """One round: the aggregate of readers 1..63, their finish times, and how the stalled reader fared."""

    def __init__(self) -> None:
        self.rate = 0.0
        self.finish: list[float] = []
        self.held_for = 0.0
        #: segments of the relay daemon's pool in use while the stalled reader held its chunk
        self.relay_segments = 0


async def _stalling_read(
    client: AsyncClient, locations: dict[str, list[int]], held: asyncio.Event, release: asyncio.Event
) -> int:
    n = 0
    async with client.read(APP, SHUFFLE, STALLED, STALLED + 1, locations) as reader:
        async for chunk in reader:
            n += len(chunk.data)
            if not held.is_set():
                held.set()
                await release.wait()  # `chunk` stays held: this reader asks for nothing more
    return n


async def _round(
    client: AsyncClient, locations: dict[str, list[int]], per: int, stall: bool, limit: float, cpu: CpuMeter
) -> _Round:
    with cpu.measure("one reader stalled" if stall else "nobody stalls", per * READERS):
        return await _measured_round(client, locations, per, stall, limit)


async def _measured_round(
    client: AsyncClient, locations: dict[str, list[int]], per: int, stall: bool, limit: float
) -> _Round:
    out = _Round()
    held, release = asyncio.Event(), asyncio.Event()
    t0 = time.perf_counter()
    special = asyncio.create_task(
        _stalling_read(client, locations, held, release)
        if stall
        else drain(client.read(APP, SHUFFLE, STALLED, STALLED + 1, locations))
    )
    try:
        others = asyncio.gather(
            *(timed_read(client, APP, SHUFFLE, p, locations, t0) for p in range(READERS) if p != STALLED)
        )
        try:
            done = await asyncio.wait_for(others, limit)
        except TimeoutError:
            raise BenchmarkFailure(
                f"the other {READERS - 1} readers did not finish within {limit:.0f}s"
                + (" while one reader stalled: head-of-line blocking" if stall else "")
            ) from None
        t_done = time.perf_counter()
        got = sum(n for n, _ in done)
        require(got == per * (READERS - 1), f"the other readers got {got} bytes, {per * (READERS - 1)} were pushed")
        out.finish = sorted(t for _, t in done)
        out.rate = mib_per_s(got, out.finish[-1])
        if stall:
            require(held.is_set(), "the stalling reader never received its first chunk, so nothing was held")
            stats = await asyncio.wait_for(client.stats(), limit)
            out.relay_segments = int(stats["pool"]["used"])
            release.set()
            out.held_for = t_done - t0
        try:
            n = await asyncio.wait_for(special, limit)
        except TimeoutError:
            raise BenchmarkFailure(f"reader {STALLED} did not finish within {limit:.0f}s after resuming") from None
        require(n == per, f"reader {STALLED} got {n} bytes, {per} were pushed")
    finally:
        release.set()
        if not special.done():
            special.cancel()
            with contextlib.suppress(BaseException):
                await special
    return out


async def run(ctx: Context, result: ScenarioResult) -> None:
    total = ctx.pick(512 * MiB, 64 * MiB)
    per = total // READERS
    limit = ctx.pick(120.0, 20.0)
    free: list[_Round] = []
    stalled: list[_Round] = []
    async with ctx.daemons(store_pool(total, READERS), relay_pool(READERS)) as (a, b):
        async with ctx.client(a.addr) as ca, ctx.client(b.addr, pool_size=reader_client_pool(READERS)) as cb:
            await warm_up_peer(ca, cb, a.addr)
            await push(ca, APP, SHUFFLE, ATTEMPT, [per] * READERS)
            locations = {a.addr: [ATTEMPT]}
            await _measured_round(cb, locations, per, False, limit)  # warm-up: pools, connections, caches
            cpu = CpuMeter({"A": a.pid, "B": b.pid, "client": None})
            for _ in bounded(ctx.repeats, ctx.pick(180.0, 20.0)):
                free.append(await _round(cb, locations, per, False, limit, cpu))
                stalled.append(await _round(cb, locations, per, True, limit, cpu))
                ctx.progress(
                    f"others' aggregate: {free[-1].rate:,.0f} MiB/s free, {stalled[-1].rate:,.0f} MiB/s with a stall"
                )

    base = median([r.rate for r in free])
    result.add(f"{READERS - 1} others, nobody stalls", base, "MiB/s", samples=[r.rate for r in free])
    result.add(
        f"{READERS - 1} others, 1 reader stalled",
        median([r.rate for r in stalled]),
        "MiB/s",
        baseline_name="nobody stalls",
        baseline=base,
        goal=Goal("ratio", ">=", 0.9),
        samples=[r.rate for r in stalled],
    )
    result.notes.append(
        f"{READERS} partitions of {per / MiB:.3g} MiB; the stalled reader held its first chunk for "
        f"{median([r.held_for for r in stalled]):.2f}s (until the others finished), then read the rest; "
        f"meanwhile B had {max(r.relay_segments for r in stalled)} segments of its pool in use "
        f"(credit bounds it to {SEGMENTS_PER_READER} for the stalled stream)"
    )
    result.notes.extend(cpu.notes())
    last_free, last_stalled = free[-1], stalled[-1]
    ranks = list(range(1, READERS))
    result.plots.append(
        Plot(
            "hol",
            f"Finish time of the {READERS - 1} other readers (sorted), last round",
            "reader (by finish time)",
            "seconds since the round started",
            lines={"nobody stalls": (ranks, last_free.finish), "one reader stalled": (ranks, last_stalled.finish)},
        )
    )
