"""`spill`: push and read throughput when spilling to disk vs in memory; spill write rate vs `dd` on the same disk.

Two daemons get the same map outputs: one with a pool that holds the whole
shuffle, one with an eighth of that and a `--data-dir` in the run's temporary
directory, so most bytes go through spill files. Both are read back by local
clients, every partition at once. Before the spilled read, the spill files'
pages are dropped from the page cache (fsync, then posix_fadvise DONTNEED on
those files only), so it really reads the disk. `dd` then writes the same number
of bytes into the same directory in 1 MiB blocks through the page cache, as a
spill does (no fsync), and once more with conv=fdatasync. The spill write rate
is the bytes the daemon spilled over the time the pushes took (pushes wait while
it spills, so the two move together).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from pathlib import Path

from .common import (
    Context,
    CpuMeter,
    Goal,
    MiB,
    ScenarioResult,
    bounded,
    drain,
    median,
    mib_per_s,
    push,
    reader_client_pool,
    require,
    store_pool,
)

APP = "bench-spill"
#: encryption at rest costs at most a tenth of spilling's throughput
SEALED_GOAL = Goal("ratio", ">=", 0.9)
#: pushes whose commits wait for the device keep at least 0.7 of the rate of those that do not
SYNCED_GOAL = Goal("ratio", ">=", 0.7)
#: the spilling daemons compared, and their flags (the key file's path is filled in by `run`)
VARIANTS: dict[str, list[str]] = {
    "plain": [],
    "sealed": ["--at-rest-key-file", ""],
    "fsync commit": ["--fsync", "commit"],
}
PARTITIONS = 8
MAPS = 4


def _drop_page_cache(root: Path) -> int:
    """Write back and evict the cached pages of the files under `root`; returns how many files."""
    n = 0
    for path in root.rglob("data"):  # a shuffle's data file (app-*/<shuffle>/data)
        if not path.is_file():
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        n += 1
    return n


def _dd(target: Path, nbytes: int, sync: bool) -> float:
    """Seconds `dd` takes to write `nbytes` of zeros to `target` in 1 MiB blocks."""
    argv = ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={nbytes // MiB}", "status=none"]
    t0 = time.perf_counter()
    subprocess.run(argv + (["conv=fdatasync"] if sync else []), check=True, timeout=300)
    seconds = time.perf_counter() - t0
    target.unlink()
    return seconds


async def _shuffle(
    ctx: Context,
    pool: int,
    nbytes: int,
    data_dir: Path | None,
    notes: list[str],
    variant: tuple[str, list[str]] = ("plain", []),
) -> dict[str, float]:
    """Push MAPS map outputs over PARTITIONS partitions into one daemon (with a data dir: the `variant` named,
    with its flags), then read every partition back; what the daemon and the client spent in CPU per GiB
    goes to `notes`."""
    extra = ["--data-dir", str(data_dir), *variant[1]] if data_dir else []
    per = nbytes // MAPS // PARTITIONS
    out: dict[str, float] = {}
    where = f"spilling, {variant[0]}" if data_dir else "in memory"
    async with ctx.daemons(pool, extra=extra) as (d,):
        cpu = CpuMeter({"daemon": d.pid, "client": None})
        async with ctx.client(d.addr) as writer, ctx.client(d.addr, reader_client_pool(PARTITIONS)) as reader:
            t0 = time.perf_counter()
            with cpu.measure(f"push, {where}", nbytes):
                stored = await asyncio.gather(
                    *(push(writer, APP, 1, m + 1, [per] * PARTITIONS, map_index=m) for m in range(MAPS))
                )
            out["push_s"] = time.perf_counter() - t0
            require(sum(stored) == nbytes, f"stored {sum(stored)} bytes of {nbytes}")
            stats = await writer.stats()
            out["spilled"] = stats["disk"]["spilled_bytes"]
            if data_dir is not None:
                require(out["spilled"] > nbytes // 2, f"only {out['spilled']} of {nbytes} bytes spilled")
                _drop_page_cache(data_dir)
            locations = {"": list(range(1, MAPS + 1))}
            t0 = time.perf_counter()
            with cpu.measure(f"read, {where}", nbytes):
                got = await asyncio.gather(
                    *(drain(reader.read(APP, 1, p, p + 1, locations)) for p in range(PARTITIONS))
                )
            out["read_s"] = time.perf_counter() - t0
            require(sum(got) == nbytes, f"read {sum(got)} bytes of {nbytes}")
    notes.extend(cpu.notes())
    return out


async def run(ctx: Context, result: ScenarioResult) -> None:
    nbytes = ctx.pick(1024 * MiB, 128 * MiB)
    data_dir = ctx.tmp_dir / "spill-data"
    cpu_notes: list[str] = []
    memory = await _shuffle(ctx, store_pool(nbytes, PARTITIONS), nbytes, None, cpu_notes)
    ctx.progress(f"in memory: push {mib_per_s(nbytes, memory['push_s']):,.0f} MiB/s")
    key = ctx.tmp_dir / "at-rest-key"
    key.write_text(os.urandom(32).hex() + "\n")
    variants = {"plain": [], "sealed": ["--at-rest-key-file", str(key)], "fsync commit": ["--fsync", "commit"]}
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for i in bounded(ctx.repeats, ctx.pick(400.0, 90.0)):  # the variants in turn, rotated: drift hits all
        names = list(variants)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            where = data_dir / f"{name}-{i}".replace(" ", "-")
            pool = max(16 * MiB, nbytes // 8)
            runs[name].append(await _shuffle(ctx, pool, nbytes, where, cpu_notes, (name, variants[name])))
            shutil.rmtree(where, ignore_errors=True)
        latest = ", ".join(f"{v} {mib_per_s(nbytes, r[-1]['push_s']):,.0f}" for v, r in runs.items())
        ctx.progress(f"spilling: push MiB/s {latest}")
    spilled, sealed, synced = (
        {k: median([r[k] for r in runs[v]]) for k in ("push_s", "read_s", "spilled")} for v in variants
    )

    for what, field, spilling in (("push", "push_s", "spilling (pool = 1/8)"), ("read", "read_s", "from disk (cold)")):
        in_memory = mib_per_s(nbytes, memory[field])
        result.add(f"{what}, all in memory", in_memory, "MiB/s")
        result.add(
            f"{what}, {spilling}",
            mib_per_s(nbytes, spilled[field]),
            "MiB/s",
            baseline_name="in memory",
            baseline=in_memory,
        )
        for variant, against, measured, goal in (
            ("sealed at rest", "not sealed", sealed, SEALED_GOAL),
            ("--fsync commit", "--fsync none", synced, SYNCED_GOAL if what == "push" else None),
        ):
            result.add(
                f"{what}, {spilling}, {variant}",
                mib_per_s(nbytes, measured[field]),
                "MiB/s",
                baseline_name=against,
                baseline=mib_per_s(nbytes, spilled[field]),
                goal=goal,
            )
    if shutil.which("dd") is None:
        result.notes.append("dd not installed: no disk baseline")
    else:
        data_dir.mkdir(exist_ok=True)
        rates: dict[bool, list[float]] = {False: [], True: []}
        for _ in bounded(ctx.repeats, ctx.pick(60.0, 10.0)):
            for sync in (False, True):  # alternating keeps drift out of their comparison
                rates[sync].append(mib_per_s(nbytes, _dd(data_dir / "dd.bin", nbytes, sync)))
        dd_cached = median(rates[False])
        result.add("dd 1 MiB blocks, page cache", dd_cached, "MiB/s", samples=rates[False])
        result.add("dd 1 MiB blocks, fdatasync", median(rates[True]), "MiB/s", samples=rates[True])
        result.add(
            "spill write rate (during push)",
            mib_per_s(spilled["spilled"], spilled["push_s"]),
            "MiB/s",
            baseline_name="dd",
            baseline=dd_cached,
        )
    result.notes.append(
        f"{nbytes // MiB} MiB = {MAPS} map outputs x {PARTITIONS} partitions, 1 MiB writes, local reads of all "
        f"partitions at once; {spilled['spilled'] / MiB:,.0f} MiB spilled; data dir {data_dir.parent} "
        "(the spill files' pages are evicted before the cold read); dd: medians of "
        f"{len(rates[False]) if shutil.which('dd') else 0} runs each"
    )
    result.notes.extend(cpu_notes)
