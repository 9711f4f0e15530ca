"""`push`: map output from a client into its local daemon, over the Unix socket and over TCP.

This is the executor→sidecar hop of every shuffle, and the only one a Unix
socket can serve. One daemon listens on both. The first push into the fresh
daemon is reported on its own: it is the one that faults the pool's pages in
(the pool is an mmap touched on first use). After it, each repeat pushes the
same bytes over TCP and then over the Unix socket (alternating keeps drift out of
their comparison), unregistering in between so the pool never fills. Ratios are
to the bare-socket baseline.

Then replication (PROTOCOL.md §12.4): two pairs of peered daemons, one keeping one
copy (`--replicas 1`) and one forwarding every push to its peer (`--replicas 2`),
pushed into alternately; the replicated rate is reported against the other, with each
daemon's CPU seconds per GiB. First all on this machine's cores, where the replica's
ingest competes with the pusher and its daemon; then as on two hosts (root only):
the pusher and its daemon share one CPU quota of one core, the replica's daemon has
another (cgroup CFS quotas). The goal (at least 0.6 of one copy) is judged
on the hosts, where a deployment runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from .bare import bare_throughput
from .common import (
    Context,
    CpuMeter,
    Goal,
    MiB,
    ScenarioResult,
    bounded,
    cpu_cap_unavailable,
    cpu_capped,
    drain,
    median,
    mib_per_s,
    push,
    require,
    store_pool,
)

APP = "bench-push"
#: the CPU of one simulated host when the replicated push is measured as on hosts (two fit this machine)
HOST_CORES = 1.0


#: the goal, 1 GB/s (decimal), in this table's unit
GOAL = Goal("value", ">=", 1e9 / MiB)
#: through shared memory against the Unix socket: twice the rate, a quarter of the daemon's CPU per GiB and
#: 0.7 of the client's
SHM_GOAL = Goal("ratio", ">=", 2.0)
SHM_CPU_GOALS = {"daemon": Goal("ratio", "<=", 0.25), "client": Goal("ratio", "<=", 0.7)}


async def run(ctx: Context, result: ScenarioResult) -> None:
    nbytes = ctx.pick(512 * MiB, 64 * MiB)
    bare = await bare_throughput(ctx)
    rates: dict[str, list[float]] = {"TCP": [], "Unix socket": [], "shared memory": []}
    async with ctx.daemons(store_pool(nbytes), unix=True, extra=["--shm-dir", "/dev/shm"]) as (a,):
        cpu = CpuMeter({"daemon": a.pid, "client": None})
        local = f"unix:{a.ready_field('unix')}"
        async with (
            ctx.client(a.addr) as tcp,
            ctx.client(local, shared_memory=False) as unix,
            ctx.client(local) as shm,
        ):
            if shm.session.region is None:
                raise RuntimeError("the daemon offered no shared memory to a client of its Unix socket")
            shuffle = 1
            t0 = time.perf_counter()
            await push(tcp, APP, shuffle, shuffle, [nbytes])
            cold = mib_per_s(nbytes, time.perf_counter() - t0)
            await tcp.unregister_shuffle(APP, shuffle)
            ctx.progress(f"first push (cold pool) {cold:,.0f} MiB/s")
            for _ in bounded(ctx.repeats, ctx.pick(120.0, 15.0)):
                for kind, client in (("TCP", tcp), ("Unix socket", unix), ("shared memory", shm)):
                    shuffle += 1
                    t0 = time.perf_counter()
                    with cpu.measure(f"push over {kind}", nbytes):
                        await push(client, APP, shuffle, shuffle, [nbytes])
                    rates[kind].append(mib_per_s(nbytes, time.perf_counter() - t0))
                    await client.unregister_shuffle(APP, shuffle)
                ctx.progress(", ".join(f"{kind} {r[-1]:,.0f} MiB/s" for kind, r in rates.items()))

    result.add(
        "first push over TCP, cold pool", cold, "MiB/s", baseline_name="bare", baseline=bare.mib_s, samples=[cold]
    )
    for kind, samples in rates.items():
        result.add(
            f"push over {kind}, warm pool",
            median(samples),
            "MiB/s",
            baseline_name="bare",
            baseline=bare.mib_s,
            goal=GOAL,
            samples=samples,
        )
    unix_rate = median(rates["Unix socket"])
    _against_the_socket(result, cpu, rates, "push", "")
    result.notes.append(
        f"{nbytes // MiB} MiB per push into one partition, 1 MiB writes, medians of {len(rates['TCP'])}; "
        f"Unix/TCP = {unix_rate / median(rates['TCP']):.2f}"
    )
    result.notes.extend(cpu.notes())
    await _read_in_place(ctx, result, nbytes)
    await _replicated(ctx, result, nbytes)
    await _fsynced(ctx, result, nbytes)


async def _read_in_place(ctx: Context, result: ScenarioResult, nbytes: int) -> None:
    """The reducer→sidecar hop: one stored partition read by a client of the daemon's Unix socket through the
    socket and in place in shared memory (PROTOCOL.md §6.3), alternately, with each side's CPU per GiB."""
    rates: dict[str, list[float]] = {"Unix socket": [], "shared memory": []}
    async with ctx.daemons(store_pool(nbytes), unix=True, extra=["--shm-dir", "/dev/shm"]) as (a,):
        cpu = CpuMeter({"daemon": a.pid, "client": None})
        local = f"unix:{a.ready_field('unix')}"
        async with ctx.client(local, shared_memory=False) as unix, ctx.client(local) as shm:
            if shm.session.in_place is None:
                raise RuntimeError("the daemon offered no reads in place to a client of its Unix socket")
            await push(unix, APP, 0, 0, [nbytes])
            for _ in bounded(ctx.repeats, ctx.pick(120.0, 15.0)):
                for kind, client in (("Unix socket", unix), ("shared memory", shm)):
                    t0 = time.perf_counter()
                    with cpu.measure(f"read over {kind}", nbytes):
                        got = await drain(client.read(APP, 0, 0, 1, {"": [0]}))
                    require(got == nbytes, f"read {got} of {nbytes} bytes")
                    rates[kind].append(mib_per_s(nbytes, time.perf_counter() - t0))
                ctx.progress(", ".join(f"read {kind} {r[-1]:,.0f} MiB/s" for kind, r in rates.items()))
            placed = (await shm.stats())["traffic"]["read_placed_buffers"]
            require(placed > 0, "no buffer was read in place")
    _against_the_socket(result, cpu, rates, "read", "of a local read ")
    result.notes.append(f"local read: {nbytes // MiB} MiB in one partition, medians of {len(rates['Unix socket'])}")
    result.notes.extend(cpu.notes())


def _against_the_socket(result: ScenarioResult, cpu: CpuMeter, rates: dict[str, list[float]], op: str, of: str) -> None:
    """The rows that judge shared memory against the Unix socket for `op` ("push" or "read", as `cpu` labels
    them): its rate, then each side's CPU per GiB (`of` names the op in those rows)."""
    what = "push" if op == "push" else "local read"
    result.add(
        f"{what} through shared memory, against the Unix socket",
        median(rates["shared memory"]),
        "MiB/s",
        baseline_name="Unix socket",
        baseline=median(rates["Unix socket"]),
        goal=SHM_GOAL,
        samples=rates["shared memory"],
    )
    for who, goal in SHM_CPU_GOALS.items():
        per_gib = cpu.per_gib(who)
        result.add(
            f"{who} CPU per GiB {of}through shared memory, against the Unix socket",
            per_gib[f"{op} over shared memory"],
            "s/GiB",
            baseline_name="Unix socket",
            baseline=per_gib[f"{op} over Unix socket"],
            goal=goal,
        )


#: the goal for pushes acknowledged only once on the device (`--fsync commit`) against none synced
FSYNC_GOAL = Goal("ratio", ">=", 0.7)
#: map outputs of a map stage pushed at once, and the bytes of each
FSYNC_WRITERS, FSYNC_MAP = 4, 4 * MiB


async def _fsynced(ctx: Context, result: ScenarioResult, nbytes: int) -> None:
    """A map stage's worth of map outputs (FSYNC_WRITERS at once) into a daemon with `--fsync none` and one
    with `--fsync commit`, alternately: the cost of a CommitAck that waits for the device."""
    maps = max(FSYNC_WRITERS, nbytes // FSYNC_MAP)
    pool = store_pool(maps * FSYNC_MAP)
    rates: dict[str, list[float]] = {"none": [], "commit": []}
    async with (
        ctx.daemons(pool, extra=["--fsync", "none"]) as (plain,),
        ctx.daemons(pool, extra=["--fsync", "commit"]) as (synced,),
    ):
        async with ctx.client(plain.addr) as to_plain, ctx.client(synced.addr) as to_synced:
            clients = {"none": to_plain, "commit": to_synced}
            for client in clients.values():  # fault the pools in, untimed
                await push(client, APP, 0, 0, [maps * FSYNC_MAP])
                await client.unregister_shuffle(APP, 0)
            shuffle = 0
            for _ in bounded(ctx.repeats, ctx.pick(120.0, 20.0)):
                for mode, client in clients.items():
                    shuffle += 1
                    t0 = time.perf_counter()
                    for first in range(0, maps, FSYNC_WRITERS):
                        await asyncio.gather(
                            *(
                                push(client, APP, shuffle, m, [FSYNC_MAP], map_index=m)
                                for m in range(first, first + FSYNC_WRITERS)
                            )
                        )
                    rates[mode].append(mib_per_s(maps * FSYNC_MAP, time.perf_counter() - t0))
                    await client.unregister_shuffle(APP, shuffle)
                ctx.progress(f"fsync none {rates['none'][-1]:,.0f} MiB/s, commit {rates['commit'][-1]:,.0f} MiB/s")
            syncs = (await to_synced.stats())["disk"]
    none, commit = rates["none"], rates["commit"]
    result.add("push, --fsync none", median(none), "MiB/s", samples=none)
    result.add(
        "push, --fsync commit",
        median(commit),
        "MiB/s",
        baseline_name="--fsync none",
        baseline=median(none),
        goal=FSYNC_GOAL,
        samples=commit,
    )
    result.notes.append(
        f"fsync: {maps} map outputs of {FSYNC_MAP // MiB} MiB, {FSYNC_WRITERS} at once, per round; the commit "
        f"daemon made {syncs['syncs']} syncs ({syncs['fsyncs']} fsyncs) for {len(commit) * maps} commits"
    )


#: the goal for a push with two copies against one
REPLICATED_GOAL = Goal("ratio", ">=", 0.6)


async def _replicated(ctx: Context, result: ScenarioResult, nbytes: int) -> None:
    pool = 2 * store_pool(nbytes)  # the peer holds the other pair member's copies too
    rates: dict[int, list[float]] = {1: [], 2: []}
    hosts: dict[int, list[float]] = {1: [], 2: []}
    meters: dict[int, CpuMeter] = {}
    async with (
        ctx.daemons(pool, pool, peers=True, extra=["--replicas", "1"]) as single,
        ctx.daemons(pool, pool, peers=True, extra=["--replicas", "2"]) as double,
    ):
        pairs = {1: single, 2: double}
        for copies, (a, b) in pairs.items():
            meters[copies] = CpuMeter({"primary": a.pid, "replica": b.pid, "client": None})
        async with ctx.client(single[0].addr) as one, ctx.client(double[0].addr) as two:
            clients = {1: one, 2: two}
            for client in clients.values():  # dial the peers and fault the pools in, untimed
                await push(client, APP, 0, 0, [nbytes])
                await client.unregister_shuffle(APP, 0)
            shuffle = 0

            async def one_round(rates: dict[int, list[float]], measured: bool) -> None:
                nonlocal shuffle
                for copies, client in clients.items():
                    shuffle += 1
                    a, b = pairs[copies]
                    # host A: the pusher (this process) and its daemon; host B: the replica's daemon
                    capped = cpu_capped([[os.getpid(), a.pid], [b.pid]], HOST_CORES) if not measured else None
                    with capped or contextlib.nullcontext():
                        t0 = time.perf_counter()
                        what = f"push with {copies} cop{'y' if copies == 1 else 'ies'}"
                        with meters[copies].measure(what, nbytes) if measured else contextlib.nullcontext():
                            await push(client, APP, shuffle, shuffle, [nbytes])
                        rates[copies].append(mib_per_s(nbytes, time.perf_counter() - t0))
                    await client.unregister_shuffle(APP, shuffle)
                label = "" if measured else f" (hosts of {HOST_CORES:g} core)"
                ctx.progress(f"1 copy {rates[1][-1]:,.0f} MiB/s, 2 copies {rates[2][-1]:,.0f} MiB/s{label}")

            for _ in bounded(ctx.repeats, ctx.pick(120.0, 15.0)):
                await one_round(rates, measured=True)
            why = cpu_cap_unavailable()
            for _ in bounded(ctx.repeats if why is None else 0, ctx.pick(120.0, 15.0)):
                await one_round(hosts, measured=False)
    one_copy = median(rates[1])
    result.add("push with 1 copy (peered daemons)", one_copy, "MiB/s", samples=rates[1])
    result.add(
        "push with 2 copies, all on one machine",
        median(rates[2]),
        "MiB/s",
        baseline_name="1 copy",
        baseline=one_copy,
        samples=rates[2],
    )
    for meter in meters.values():
        result.notes.extend(meter.notes())
    if why is not None:
        result.notes.append(f"no per-host CPU caps ({why}): the replicated push was not measured as on hosts")
        return
    one_copy = median(hosts[1])
    result.add(f"push with 1 copy, hosts of {HOST_CORES:g} core", one_copy, "MiB/s", samples=hosts[1])
    result.add(
        f"push with 2 copies, hosts of {HOST_CORES:g} core",
        median(hosts[2]),
        "MiB/s",
        baseline_name="1 copy",
        baseline=one_copy,
        goal=REPLICATED_GOAL,
        samples=hosts[2],
    )
    result.notes.append(
        f"hosts of {HOST_CORES:g} core: the pusher and its daemon share one CPU quota of {HOST_CORES:g} core, the "
        "replica's daemon has another (cgroup CFS quotas), as on two hosts; on one machine the replica's ingest "
        "competes with the pusher for the same two cores, which a deployment does not do"
    )
