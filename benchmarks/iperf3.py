"""`iperf3`: iperf3 over loopback, a second opinion on the bare-socket ceiling (skipped if iperf3 is missing).

iperf3 is C and does nothing but move bytes, so it shows what the kernel's
loopback can do at all; the ratio of the bare uvloop pair to it is the price of
Python and the event loop before shuffled adds anything. Same write size as the
bare pair (32 KiB), same loopback address.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time

from .bare import bare_throughput
from .common import (
    HOST_FOR_HELPERS,
    Context,
    ManagedProcess,
    MiB,
    ScenarioResult,
    Skip,
    bounded,
    free_port,
    median,
)


async def _wait_listening(server: ManagedProcess, port: int, timeout: float) -> None:
    """iperf3's own "listening" line is block-buffered on a pipe, so ask the kernel instead."""
    import psutil

    deadline = time.monotonic() + timeout
    proc = psutil.Process(server.pid)
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"iperf3 server exited with code {server.proc.returncode}:\n{server.tail()}")
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in proc.net_connections("tcp")):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"iperf3 server did not listen on port {port} within {timeout:.0f}s")


def _received_bytes_per_s(stdout: str) -> float:
    doc = json.loads(stdout)
    if doc.get("error"):
        raise RuntimeError(f"iperf3: {doc['error']}")
    received = doc["end"]["sum_received"]
    return float(received["bytes"]) / float(received["seconds"])


async def run(ctx: Context, result: ScenarioResult) -> None:
    exe = shutil.which("iperf3")
    if exe is None:
        result.notes.append("`apt-get install iperf3` enables this scenario")
        raise Skip("iperf3 not installed")
    nbytes = ctx.pick(1024 * MiB, 256 * MiB)
    bare = await bare_throughput(ctx)
    port = free_port(HOST_FOR_HELPERS)
    server = ManagedProcess("iperf3 server", [exe, "-s", "-B", HOST_FOR_HELPERS, "-p", str(port)], ready="listening")
    samples: list[float] = []
    try:
        await _wait_listening(server, port, 10.0)
        client = [exe, "-c", HOST_FOR_HELPERS, "-p", str(port), "-n", str(nbytes), "-l", "32K", "-J"]
        for _ in bounded(ctx.repeats, 120.0):
            done = await asyncio.to_thread(subprocess.run, client, capture_output=True, text=True, timeout=120)
            try:
                samples.append(_received_bytes_per_s(done.stdout) / MiB)
            except (ValueError, KeyError) as exc:
                raise RuntimeError(
                    f"unreadable iperf3 output ({exc}): {done.stdout[-400:]} {done.stderr[-400:]}"
                ) from None
            ctx.progress(f"iperf3 {samples[-1]:,.0f} MiB/s")
    finally:
        server.stop()
    result.add(
        "loopback TCP, 32 KiB writes",
        median(samples),
        "MiB/s",
        baseline_name="bare",
        baseline=bare.mib_s,
        samples=samples,
    )
    result.notes.append(
        f"{nbytes // MiB} MiB per iperf3 run, median of {len(samples)}; ratio > 1: iperf3 beats bare uvloop"
    )
