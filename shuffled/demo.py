"""`shuffled demo`: two real daemons, a push, a cross-daemon read, every byte checked."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time

from shuffled_client import AsyncClient

from .launch import DaemonProcess, free_port

HOSTS = ("127.0.0.1", "127.0.0.2")


def _start(host: str, port: int, peers: str, data_dir: str) -> DaemonProcess:
    """A ready daemon, its start-up lines echoed: the demo shows what a daemon says about itself."""
    daemon = DaemonProcess(host, port, "256M", ["--data-dir", data_dir, "--peers", peers]).wait_ready()
    for line in daemon.log[: daemon.log.index(daemon.ready_line) + 1]:
        print(f"  [{host}] {line.rstrip()}")
    return daemon


def _block(attempt: int, partition: int, size: int) -> bytes:
    seed = f"map-attempt {attempt} partition {partition}\n".encode()
    return (seed * (size // len(seed) + 1))[:size]


async def _run(addrs: list[str], maps: int, partitions: int, total: int) -> None:
    per_part = max(1, total // (2 * maps * partitions))
    clients = [await AsyncClient.connect(a) for a in addrs]
    attempts: dict[str, list[int]] = {a: [] for a in addrs}
    t0 = time.perf_counter()
    for d, client in enumerate(clients):
        for m in range(maps):
            attempt = 100 * (d + 1) + m
            writer = await client.open_writer("demo-app", 0, d * maps + m, attempt, partitions)
            for p in range(partitions):
                await writer.write(p, _block(attempt, p, per_part))
            lengths = await writer.commit()
            assert lengths == [per_part] * partitions
            attempts[addrs[d]].append(attempt)
    pushed = time.perf_counter() - t0
    print(
        f"pushed {2 * maps} map outputs x {partitions} partitions ({2 * maps * partitions * per_part / 1e6:.1f} MB) "
        f"in {pushed:.2f}s"
    )

    reader = clients[0]
    locations = {"": attempts[addrs[0]], addrs[1]: attempts[addrs[1]]}
    t0 = time.perf_counter()
    read_bytes = 0
    print(f"{'partition':>9} {'bytes':>12} {'local':>10} {'remote':>10}  check")
    for p in range(partitions):
        got: dict[int, bytearray] = {}
        async with reader.read("demo-app", 0, p, p + 1, locations) as stream:
            async for chunk in stream:
                got.setdefault(chunk.attempt, bytearray()).extend(chunk.data)
        ok = all(bytes(got.get(a, b"")) == _block(a, p, per_part) for atts in attempts.values() for a in atts)
        local = sum(len(got.get(a, b"")) for a in attempts[addrs[0]])
        remote = sum(len(got.get(a, b"")) for a in attempts[addrs[1]])
        read_bytes += local + remote
        print(f"{p:>9} {local + remote:>12} {local:>10} {remote:>10}  {'ok' if ok else 'MISMATCH'}")
        if not ok:
            raise SystemExit("demo: data mismatch")
    elapsed = time.perf_counter() - t0
    print(
        f"read {read_bytes / 1e6:.1f} MB through {addrs[0]} in {elapsed:.2f}s "
        f"({read_bytes / elapsed / 1e6:.0f} MB/s, half of it relayed from {addrs[1]})"
    )
    result = await reader.unregister_shuffle("demo-app", 0)
    stats = await reader.stats()
    print(
        f"unregistered: {result}; pool of {addrs[0]} now {stats['pool']['used']} segments used "
        f"of {stats['pool']['total']}"
    )
    for c in clients:
        await c.close()


def run_demo(maps: int, partitions: int, megabytes: int, spark: bool = False) -> int:
    port = free_port(list(HOSTS))
    addrs = [f"{h}:{port}" for h in HOSTS]
    daemons: list[DaemonProcess] = []
    # The demo's data goes away with it (a daemon's default data dir outlives it, for restarts).
    scratch = tempfile.TemporaryDirectory(prefix="shuffled-demo-")
    try:
        for h in HOSTS:
            daemons.append(_start(h, port, ",".join(addrs), os.path.join(scratch.name, h)))
        import uvloop

        uvloop.run(asyncio.wait_for(_run(addrs, maps, partitions, megabytes << 20), 300))
        print("demo ok")
        if spark:
            from .spark_demo import run_spark_demo

            run_spark_demo(addrs)
        return 0
    finally:
        for d in daemons:
            d.stop()
        scratch.cleanup()
