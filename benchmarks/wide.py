"""`wide`: one shuffle pushed and read at 200, 2,000 and 10,000 partitions with the same bytes per map output,
through one daemon, by the Python client and by the JVM client.

One daemon (256 MiB pool, a data dir) takes 32 map outputs of 4 MiB, every partition the same share (20 KiB
at 200 partitions, 2 KiB at 2,000, 419 bytes at 10,000), four writers at once; then eight readers at once
read the shuffle back, each a range of equal width of the partitions from every attempt (as AQE's
coalesced reads are). The Python client (this process) pushes with `write_sorted` (the map output already
grouped by partition, as a Spark index file has it) and with `write` a partition at a time, and reads the
`write_sorted` shuffle per run (`async for chunk`) and in bulk (`groups()`). The JVM client (`WideBench`
in the test jar, driven a step at a time) writes a partition at a time with `MapOutputWriter.write` (the
plugin's sorted path) and reads per run with `PartitionReader.next`. Each round runs every path at every
width, the widths in turn forward and backward (an untimed round first warms the JIT and the pool up); the
table has the medians of 11 rounds.

Reported: MiB/s with its ratio to the same path at 200 partitions (of the medians), and for 10,000 partitions
the median of each round's ratio, whose steps are seconds apart (goal: at least 0.8 for the paths that work
per buffer: `write_sorted`, `groups()` and the JVM client; `write` and the per-run read cost the Python
client a call and an object per block, which these widths make a few hundred bytes); the memory
efficiency after each push (the bytes the store holds in memory over the bytes of the segments holding
them; goal at least 0.8); the daemon's peak RSS over its pool at each width; and in the notes the CPU
seconds per GiB of the daemon and of the client for every path and width.

With ``SHUFFLED_BENCH_WIDE_LOCAL=1`` the daemon also listens on a Unix socket, and each round the Python
client's bulk paths (`write_sorted`, `groups()`) run there too, once through the socket and once through
shared memory (PROTOCOL.md §6.3: pushes into slots, reads in place), the reducer→sidecar hop at every width;
the rows then add shared memory against the Unix socket at each width, judged round by round.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial

from shuffled.launch import DaemonProcess
from shuffled_client import AsyncClient, MapWriter

from .common import (
    Context,
    CpuMeter,
    Goal,
    ManagedProcess,
    MiB,
    Plot,
    RssSampler,
    ScenarioResult,
    median,
    mib_per_s,
    reader_client_pool,
    require,
)

APP = "bench-wide"
WIDTHS = (200, 2_000, 10_000)
POOL = 256 * MiB
WRITERS = 4
#: readers at once, each a range of equal width
RANGES = 8
SORTED, WRITE, GROUPS, RUNS = (
    "Python push, write_sorted",
    "Python push, write",
    "Python read, groups()",
    "Python read, per run",
)
JVM_PUSH, JVM_READ = "JVM push", "JVM read"
#: the local transports of SHUFFLED_BENCH_WIDE_LOCAL=1, each with its client's `shared_memory`
LOCAL_VARIABLE = "SHUFFLED_BENCH_WIDE_LOCAL"
LOCAL = {"Unix socket": False, "shared memory": True}
#: shared memory's rate against the Unix socket's, as `push` judges it
SHM_GOAL = Goal("ratio", ">=", 2.0)
#: the paths whose work is per buffer, held to the goal
BULK = (SORTED, GROUPS, JVM_PUSH, JVM_READ)
#: measured rounds of a full run: a step moves 128 MiB in a fraction of a second, which the other work on a
#: shared machine moves by tens of percent, so the medians need more samples than the usual five
ROUNDS = 11
GOAL = Goal("value", ">=", 0.8)
EFFICIENCY_GOAL = Goal("value", ">=", 0.8)
#: a JVM step (a push or a read of every map output) answers within this
JVM_STEP_TIMEOUT = 300.0
#: --quick may build the plugin and test jars first (the scenarios before it need none) and starts a JVM
QUICK_TIME_LIMIT = 90.0


class Wide:
    """One run of the scenario: the daemon, the shape of every map output, and what each step measured."""

    def __init__(
        self,
        ctx: Context,
        daemon: DaemonProcess,
        client: AsyncClient,
        jvm: ManagedProcess | None,
        shape: tuple[int, int],
        local: dict[str, AsyncClient],
    ) -> None:
        self.ctx = ctx
        self.daemon = daemon
        self.client = client
        self.jvm = jvm
        #: clients of the daemon's Unix socket by transport (SHUFFLED_BENCH_WIDE_LOCAL=1), else none
        self.local = local
        self.maps, self.map_bytes = shape
        self.pattern = memoryview(os.urandom(self.map_bytes))
        self.shuffles = itertools.count(1)
        #: CPU per step: the daemon's and the client's (this process, or the JVM's)
        self.cpu = {"Python": CpuMeter({"daemon": daemon.pid, "client": None})}
        if jvm is not None:
            self.cpu["JVM"] = CpuMeter({"daemon": daemon.pid, "client": jvm.pid})
        #: (path, width) -> MiB/s of each measured round
        self.rates: dict[tuple[str, int], list[float]] = {}
        #: (push path, width) -> memory efficiency after each measured push
        self.efficiency: dict[tuple[str, int], list[float]] = {}
        #: width -> the daemon's peak RSS over its pool (MiB) in any step at that width
        self.rss: dict[int, float] = {}

    def total(self, width: int) -> int:
        """Bytes of every map output at `width` partitions (each partition gets the same whole bytes)."""
        return self.map_bytes // width * width * self.maps

    async def step(self, path: str, width: int, measured: bool, body: Callable[[], Awaitable[float | None]]) -> None:
        """Run one push or read; when `measured`, record its rate (from the seconds `body` returns, else the
        wall time), its CPU and the daemon's RSS."""
        who = "JVM" if path.startswith("JVM") else "Python"
        nbytes = self.total(width)
        with (
            self.cpu[who].measure(f"{path}, {width:,} partitions", nbytes if measured else 0),
            RssSampler({"daemon": self.daemon.pid}, 0.02) as rss,
        ):
            t0 = time.perf_counter()
            took = await body()
            seconds = time.perf_counter() - t0 if took is None else took
        if not measured:
            return
        self.rates.setdefault((path, width), []).append(mib_per_s(nbytes, seconds))
        over = rss.peak("daemon") - self.daemon.pool_size / MiB
        self.rss[width] = max(self.rss.get(width, -math.inf), over)
        self.ctx.progress(f"{path}, {width:,} partitions: {mib_per_s(nbytes, seconds):,.0f} MiB/s")

    async def local_round(self, width: int, measured: bool, shm_first: bool) -> None:
        """The bulk paths through each local transport (in the order `shm_first` says, alternated by round):
        `write_sorted`, then `groups()` of what it pushed."""
        order = list(self.local.items())  # LOCAL's order: the socket first
        for transport, client in reversed(order) if shm_first else order:
            shuffle = next(self.shuffles)
            push = partial(self.python_push, shuffle, width, self.sorted_fill(width), client)
            read = partial(self.python_read, shuffle, width, True, client)
            await self.step(f"{SORTED}, {transport}", width, measured, push)
            await self.step(f"{GROUPS}, {transport}", width, measured, read)
            await client.unregister_shuffle(APP, shuffle)

    async def stored(self, path: str, width: int, measured: bool) -> None:
        """After a push: what the store holds in memory over the bytes of the segments it holds them in."""
        stats = await self.client.stats()
        store, segment = stats["store"], stats["pool"]["segment_size"]
        held = store["stored_segments"] * segment
        if measured and held:  # nothing held: it was all spilled (not with these sizes)
            self.efficiency.setdefault((path, width), []).append(store["memory_bytes"] / held)

    # -- the Python client

    def sorted_fill(self, width: int) -> Callable[[MapWriter], Awaitable[None]]:
        """A map output at `width` partitions written whole with `write_sorted` (grouped by partition, as a
        Spark index file has it)."""
        share = self.map_bytes // width
        lengths, whole = [share] * width, self.pattern[: share * width]

        async def write_sorted(w: MapWriter) -> None:
            await w.write_sorted(lengths, whole)

        return write_sorted

    async def python_round(self, width: int, measured: bool, runs_first: bool) -> None:
        share = self.map_bytes // width
        whole = self.pattern[: share * width]
        blocks = [bytes(whole[p * share : (p + 1) * share]) for p in range(width)]  # as a serializer makes them

        async def write(w: MapWriter) -> None:
            for p, block in enumerate(blocks):
                await w.write(p, block)

        shuffle = next(self.shuffles)
        await self.step(SORTED, width, measured, partial(self.python_push, shuffle, width, self.sorted_fill(width)))
        await self.stored(SORTED, width, measured)
        for bulk in (not runs_first, runs_first):
            path = GROUPS if bulk else RUNS
            await self.step(path, width, measured, partial(self.python_read, shuffle, width, bulk))
        await self.client.unregister_shuffle(APP, shuffle)
        shuffle = next(self.shuffles)
        await self.step(WRITE, width, measured, partial(self.python_push, shuffle, width, write))
        await self.stored(WRITE, width, measured)
        await self.client.unregister_shuffle(APP, shuffle)

    async def python_push(
        self, shuffle: int, width: int, fill: Callable[[MapWriter], Awaitable[None]], client: AsyncClient | None = None
    ) -> None:
        through = client or self.client
        queue = list(range(self.maps, 0, -1))
        want = [self.map_bytes // width] * width

        async def writer() -> None:
            while queue:
                attempt = queue.pop()
                w = await through.open_writer(APP, shuffle, attempt - 1, attempt, width)
                await fill(w)
                got = await w.commit()
                require(got == want, f"attempt {attempt} committed {sum(got)} bytes, wrote {sum(want)}")

        await asyncio.gather(*(writer() for _ in range(WRITERS)))

    async def python_read(self, shuffle: int, width: int, bulk: bool, client: AsyncClient | None = None) -> None:
        through = client or self.client
        attempts = list(range(1, self.maps + 1))
        step = -(-width // RANGES)

        async def one(lo: int) -> int:
            n = 0
            async with through.read(APP, shuffle, lo, min(width, lo + step), {"": attempts}) as reader:
                if bulk:
                    async for group in reader.groups():
                        n += len(group.data)
                else:
                    async for chunk in reader:
                        n += len(chunk.data)
            return n

        got = sum(await asyncio.gather(*(one(lo) for lo in range(0, width, step))))
        require(got == self.total(width), f"read {got} bytes of {self.total(width)}")

    # -- the JVM client

    async def jvm_round(self, width: int, measured: bool) -> None:
        shuffle = next(self.shuffles)
        jvm = self.jvm
        assert jvm is not None

        async def ask(command: str) -> float:
            answer = (await jvm.ask(command, JVM_STEP_TIMEOUT)).split()
            require(int(answer[1]) == self.total(width), f"WideBench {command}: {answer}")
            return float(answer[-1])

        await self.step(JVM_PUSH, width, measured, lambda: ask(f"push {shuffle} {width}"))
        await self.stored(JVM_PUSH, width, measured)
        await self.step(JVM_READ, width, measured, lambda: ask(f"read {shuffle} {width} {RANGES}"))
        await self.client.unregister_shuffle(APP, shuffle)


def _wide_bench(daemon: DaemonProcess, maps: int, map_bytes: int) -> ManagedProcess | str:
    """The JVM client's process (started, not yet ready), or why there is none."""
    try:
        from shuffled import spark_jar

        jars = spark_jar.build_jar(), spark_jar.build_test_classes()
        java = spark_jar.find_tool("java")
    except Exception as exc:  # no JDK or no pyspark: the Python paths still run
        return f"no JVM client ({exc})"
    argv = [java, "-Xmx1g", "-cp", spark_jar.classpath(*jars), "io.shuffled.client.WideBench"]
    argv += [daemon.addr, APP, str(maps), str(map_bytes), str(WRITERS)]
    return ManagedProcess("WideBench", argv, r"^ready$", commands=True)


async def run(ctx: Context, result: ScenarioResult) -> None:
    shape = maps, map_bytes = ctx.pick(32, 8), ctx.pick(4 * MiB, MiB)
    local = os.environ.get(LOCAL_VARIABLE) == "1"
    extra = ["--shm-dir", "/dev/shm"] if local else []
    async with (
        ctx.daemons(POOL, unix=local, extra=extra) as (daemon,),
        ctx.client(daemon.addr, reader_client_pool(RANGES)) as client,
        contextlib.AsyncExitStack() as clients,
    ):
        at = f"unix:{daemon.ready_field('unix')}" if local else ""
        locals_ = {
            name: await clients.enter_async_context(ctx.client(at, reader_client_pool(RANGES), shared_memory=shm))
            for name, shm in LOCAL.items()
            if local
        }
        in_place = locals_.get("shared memory")
        require(in_place is None or in_place.session.in_place is not None, "no reads in place at the Unix socket")
        jvm = await asyncio.to_thread(_wide_bench, daemon, maps, map_bytes)
        try:
            if isinstance(jvm, str):
                result.notes.append(jvm)
            else:
                await jvm.wait_ready(60)
            wide = Wide(ctx, daemon, client, None if isinstance(jvm, str) else jvm, shape, locals_)
            rounds = [False] * ctx.pick(1, 0) + [True] * ctx.pick(ROUNDS, 1)  # a warm-up round, then the measured
            for i, measured in enumerate(rounds):
                for width in WIDTHS[:: 1 if i % 2 else -1]:  # each width first, last or between as often
                    await wide.python_round(width, measured, runs_first=i % 2 == 0)
                    await wide.local_round(width, measured, shm_first=i % 2 == 1)
                    if wide.jvm is not None:
                        await wide.jvm_round(width, measured)
            if in_place is not None:
                placed = (await in_place.stats())["traffic"]["read_placed_buffers"]
                require(placed > 0, "no buffer was read in place")
                result.notes.append("the daemon's RSS includes the pages of its local clients' shared memory")
        finally:
            if not isinstance(jvm, str):
                jvm.stop()
    _report(wide, result)


def _report(wide: Wide, result: ScenarioResult) -> None:
    locally = [f"{p}, {t}" for p in (SORTED, GROUPS) for t in LOCAL]
    paths = [p for p in (SORTED, WRITE, GROUPS, RUNS, JVM_PUSH, JVM_READ, *locally) if (p, WIDTHS[0]) in wide.rates]
    narrow, widest = WIDTHS[0], WIDTHS[-1]
    plot = Plot("wide", "One daemon, the same bytes at every width", "partitions", "MiB/s", logx=True)
    for path in paths:
        base = median(wide.rates[path, narrow])
        for width in WIDTHS:
            samples = wide.rates[path, width]
            result.add(
                f"{path}, {width:,} partitions",
                median(samples),
                "MiB/s",
                baseline_name=f"{narrow} partitions" if width != narrow else "",
                baseline=base if width != narrow else None,
                samples=samples,
            )
        plot.lines[path] = (list(WIDTHS), [median(wide.rates[path, w]) for w in WIDTHS])
    for path in paths:  # the goal, judged round by round: the steps of a round are seconds apart
        ratios = [w / n for w, n in zip(wide.rates[path, widest], wide.rates[path, narrow], strict=True)]
        result.add(
            f"{path}, {widest:,} / {narrow} partitions in the same round",
            median(ratios),
            "ratio",
            goal=GOAL if path in BULK else None,
            samples=ratios,
        )
    for path in (SORTED, GROUPS) if wide.local else ():  # judged round by round, as the widths are
        for width in WIDTHS:
            ratios = [
                m / u
                for m, u in zip(
                    wide.rates[f"{path}, shared memory", width], wide.rates[f"{path}, Unix socket", width], strict=True
                )
            ]
            result.add(
                f"{path}, {width:,} partitions, shared memory / Unix socket in the same round",
                median(ratios),
                "ratio",
                goal=SHM_GOAL,
                samples=ratios,
            )
    for width in WIDTHS:
        per_path = {p: min(s) for (p, w), s in wide.efficiency.items() if w == width}
        result.add(
            f"memory efficiency, {width:,} partitions",
            min(per_path.values()),
            "ratio",
            goal=EFFICIENCY_GOAL,
            samples=list(per_path.values()),
        )
    for width in WIDTHS:
        result.add(f"daemon peak RSS over its pool, {width:,} partitions", wide.rss[width], "MiB")
    result.plots.append(plot)
    result.notes.append(
        f"{wide.maps} map outputs of {wide.map_bytes / MiB:g} MiB, {WRITERS} writers, {RANGES} readers of a range "
        f"each, {POOL // MiB} MiB pool; memory efficiency is the lowest after any push at that width ("
        + "; ".join(
            f"{p} {min(s):.3f} at {w:,}" for (p, w), s in sorted(wide.efficiency.items(), key=lambda kv: kv[0][1])
        )
        + ")"
    )
    for meter in wide.cpu.values():
        result.notes.extend(meter.notes())
