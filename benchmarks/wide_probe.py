"""A probe of wide shuffles, not a scenario: push and read MiB/s, memory efficiency and daemon RSS at several
partition counts with the same bytes per map output, through the Python client.

    python -m benchmarks.wide_probe [--widths 200,2000,10000] [--maps 32] [--map-mib 4] [--pool 256M]

For each width a fresh daemon (memory only, or `--data-dir DIR`) takes `--maps` map outputs of
`--map-mib` MiB each, every partition getting the same share, written a partition at a time as a
sorted map task does, `--writers` at once; then `--readers` readers read the shuffle back at once,
each a contiguous range of the partitions from every attempt. It uses only `open_writer`/`write`/
`commit` and `read`, so the same probe runs against older clients for a before/after in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from typing import Any

from shuffled.launch import DaemonProcess, free_port
from shuffled_client import AsyncClient

MiB = 1 << 20
APP = "wide-probe"


def cpu(pid: int) -> float:
    """CPU seconds a process used so far (user + system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Peak(threading.Thread):
    """Samples a process's RSS every 20 ms until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.02):
            with open(f"/proc/{self.pid}/statm") as f:
                self.peak = max(self.peak, int(f.read().split()[1]) * 4096)


async def probe(width: int, args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    port = free_port(["127.0.0.2"])
    profile = (
        (sys.executable, "-m", "cProfile", "-o", f"{args.profile}-{width}.prof") if args.profile else (sys.executable,)
    )
    daemon = DaemonProcess("127.0.0.2", port, args.pool, ["--data-dir", data_dir], interpreter=profile).wait_ready()
    sampler = Peak(daemon.pid)
    sampler.start()
    try:
        client = await AsyncClient.connect(daemon.addr)
        share = args.map_mib * MiB // width
        block = bytes(range(256)) * (share // 256 + 1)
        body = memoryview(block)[:share]
        maps = list(range(1, args.maps + 1))

        whole = memoryview(bytes(body) * width) if args.sorted else None

        async def one(attempt: int) -> None:
            writer = await client.open_writer(APP, 0, attempt, attempt, width)
            if whole is not None:  # the map output already grouped by partition, as a Spark index file has it
                await writer.write_sorted([share] * width, whole)
            else:
                for p in range(width):
                    await writer.write(p, body)
            lengths = await writer.commit()
            assert sum(lengths) == share * width

        t0, d0, c0 = time.perf_counter(), cpu(daemon.pid), cpu(os.getpid())
        queue = list(maps)

        async def worker() -> None:
            while queue:
                await one(queue.pop())

        await asyncio.gather(*(worker() for _ in range(args.writers)))
        push_s = time.perf_counter() - t0
        push_cpu = (cpu(daemon.pid) - d0, cpu(os.getpid()) - c0)
        stats = await client.stats()
        store = stats["store"]
        segment = stats["pool"]["segment_size"]
        held = store.get("memory_bytes", store["stored_bytes"])
        efficiency = held / max(1, store["stored_segments"] * segment)
        total = share * width * args.maps
        step = -(-width // args.readers)

        async def read(lo: int) -> int:
            n = 0
            async with client.read(APP, 0, lo, min(width, lo + step), {"": maps}) as reader:
                async for chunk in reader:
                    n += len(chunk.data)
            return n

        t0, d0, c0 = time.perf_counter(), cpu(daemon.pid), cpu(os.getpid())
        got = await asyncio.gather(*(read(lo) for lo in range(0, width, step)))
        read_s = time.perf_counter() - t0
        read_cpu = (cpu(daemon.pid) - d0, cpu(os.getpid()) - c0)
        assert sum(got) == total, f"read {sum(got)} bytes of {total}"
        await client.unregister_shuffle(APP, 0)
        await client.close()
        return {
            "push": total / MiB / push_s,
            "read": total / MiB / read_s,
            # CPU seconds per GiB moved: daemon, client
            "push_cpu": tuple(c * (1 << 30) / total for c in push_cpu),
            "read_cpu": tuple(c * (1 << 30) / total for c in read_cpu),
            "efficiency": efficiency,
            "rss_over_pool": (sampler.peak - daemon_pool(args.pool)) / MiB,
        }
    finally:
        sampler.done.set()
        daemon.stop()


def daemon_pool(size: str) -> int:
    units = {"K": 1 << 10, "M": MiB, "G": 1 << 30}
    return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", default="200,2000,10000")
    parser.add_argument("--maps", type=int, default=32)
    parser.add_argument("--map-mib", type=int, default=4)
    parser.add_argument("--pool", default="256M")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--sorted", action="store_true", help="push with write_sorted (v3 clients) instead of write")
    parser.add_argument("--profile", help="run the daemons under cProfile, writing PREFIX-<width>.prof")
    parser.add_argument("--data-dir", default="none", help="where the daemons spill (default: memory only)")
    args = parser.parse_args()
    print("partitions  push MiB/s (CPU s/GiB: daemon, client)  read MiB/s (the same)  efficiency  RSS-pool MiB")
    for width in map(int, args.widths.split(",")):
        with tempfile.TemporaryDirectory(dir=None if args.data_dir == "none" else args.data_dir) as tmp:
            r = asyncio.run(probe(width, args, "none" if args.data_dir == "none" else tmp))
        pc, rc = r["push_cpu"], r["read_cpu"]
        print(
            f"{width:10d}  {r['push']:10.1f} ({pc[0]:4.2f}, {pc[1]:4.2f})"
            f"  {r['read']:10.1f} ({rc[0]:4.2f}, {rc[1]:4.2f})  {r['efficiency']:10.2f}  {r['rss_over_pool']:12.0f}"
        )


if __name__ == "__main__":
    main()
