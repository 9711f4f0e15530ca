"""`python -m benchmarks.shm_probe`: what a push through shared memory would save the daemon, measured without it.

Not a scenario (no daemon runs); it answers the first questions of a shared-memory path before the protocol
grows one: how much of a local push's cost is the socket, and whether the daemon should copy a pushed buffer out
of the writer's memory or check its CRC32C where it lies. A writer process and a receiving process (the
daemon's side) move `--mib` MiB of 32 KiB buffers over a Unix socket, with plain blocking sockets so the
numbers are the kernel's and the copies', not an event loop's:

* **socket**: each buffer behind a 16-byte header, the receiver reads it into one of its own segments and
  checks its CRC32C (what the daemon does with a PushData today);
* **shm, copy**: the writer fills a slot of a region both processes map (a file under /dev/shm) and sends a
  16-byte descriptor (slot, length, CRC32C); the receiver copies the slot into its own segment, checks the
  CRC32C of the copy and gives the slot back (a count of slots freed, in order): the writer cannot change
  what was stored;
* **shm, in place**: as copy, but the receiver checks the CRC32C in the slot and keeps nothing (the slot
  would be a pool segment of the application's region: no copy, but the writer can still change it, so a
  reader would have to check again);

each with descriptors sent one at a time and in batches of 8 (what a writer with several buffers ready can
do with one `sendmsg`). In every case the writer first copies each buffer from its own memory into the one
it sends from, as the client's packer fills a segment. Prints MiB/s at the receiver, the CPU seconds per GiB
of the receiver and of the writer, each the median of `--repeats` runs taken in turn, with the range.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import signal
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

import crc32c

from .common import MiB
from .zerocopy import RUN_LIMIT, _cpu, finish, helper, print_rows

MODULE = "benchmarks.shm_probe"
CHUNK = 32 << 10
#: slots of the shared region (2 MiB: a push window's worth)
SLOTS = 64
#: the receiver's own segments it copies into (reused in turn)
SEGMENTS = 64
#: slot u32, length u32, crc u32, sequence u32; the socket path's header has the same size
DESCRIPTOR = struct.Struct(">IIII")
FREED = struct.Struct(">I")
METHODS = {
    "socket": ("socket", 1),
    "socket, 8 buffers per sendmsg": ("socket", 8),
    "shm, copy": ("copy", 1),
    "shm, copy, 8 descriptors per send": ("copy", 8),
    "shm, in place": ("inplace", 1),
    "shm, in place, 8 descriptors per send": ("inplace", 8),
}


def _recv_exactly(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the writer went away")
        got += n


def _receive(path: str, region_path: str, mode: str, count: int) -> None:
    """The daemon's side: takes `count` buffers, checks each one's CRC32C; prints its wall and CPU seconds."""
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen(1)
        print("ready", flush=True)
        conn, _ = server.accept()
    segments = memoryview(bytearray(SEGMENTS * CHUNK))
    region = None
    if mode != "socket":
        with open(region_path, "r+b") as f:
            region = memoryview(mmap.mmap(f.fileno(), SLOTS * CHUNK))
    head = memoryview(bytearray(DESCRIPTOR.size * 64))
    t0 = cpu0 = 0.0
    done = 0
    while done < count:
        if mode == "socket":
            _recv_exactly(conn, head[: DESCRIPTOR.size])
            _, length, crc, seq = DESCRIPTOR.unpack_from(head)
            seg = segments[(seq % SEGMENTS) * CHUNK :][:length]
            _recv_exactly(conn, seg)
            if crc32c.crc32c(seg) != crc:
                raise ValueError(f"buffer {seq}: CRC32C mismatch")
            done += 1
        else:
            assert region is not None
            n = conn.recv_into(head)
            if n == 0:
                raise ConnectionError("the writer went away")
            if n % DESCRIPTOR.size:  # a descriptor split across reads: read its rest
                rest = DESCRIPTOR.size - n % DESCRIPTOR.size
                _recv_exactly(conn, head[n : n + rest])
                n += rest
            for at in range(0, n, DESCRIPTOR.size):
                slot, length, crc, seq = DESCRIPTOR.unpack_from(head, at)
                src = region[slot * CHUNK : slot * CHUNK + length]
                if mode == "copy":
                    seg = segments[(seq % SEGMENTS) * CHUNK :][:length]
                    seg[:] = src
                    src = seg
                if crc32c.crc32c(src) != crc:
                    raise ValueError(f"buffer {seq}: CRC32C mismatch")
            freed = n // DESCRIPTOR.size
            conn.sendall(FREED.pack(freed))
            done += freed
        if t0 == 0.0:
            t0, cpu0 = time.perf_counter(), _cpu()
    seconds, cpu = time.perf_counter() - t0, _cpu() - cpu0
    print(json.dumps({"buffers": done, "seconds": seconds, "cpu": cpu}), flush=True)
    conn.close()


def _write(path: str, region_path: str, mode: str, count: int, batch: int) -> None:
    """The writer: `count` buffers copied from its own memory, sent or placed in slots; prints its CPU seconds."""
    source = memoryview(os.urandom(CHUNK))
    out = memoryview(bytearray(batch * CHUNK))
    heads = bytearray(DESCRIPTOR.size * batch)
    region = None
    if mode != "socket":
        with open(region_path, "r+b") as f:
            region = memoryview(mmap.mmap(f.fileno(), SLOTS * CHUNK))
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(path)
        cpu0 = _cpu()
        free, sent, freed = SLOTS, 0, memoryview(bytearray(FREED.size * SLOTS))
        while sent < count:
            n = min(batch, count - sent)
            if mode == "socket":
                parts: list[memoryview | bytes] = []
                for k in range(n):
                    buf = out[k * CHUNK : (k + 1) * CHUNK]
                    buf[:] = source
                    DESCRIPTOR.pack_into(heads, k * DESCRIPTOR.size, 0, CHUNK, crc32c.crc32c(buf), sent + k)
                    parts += (memoryview(heads)[k * DESCRIPTOR.size : (k + 1) * DESCRIPTOR.size], buf)
                if conn.sendmsg(parts) != n * (DESCRIPTOR.size + CHUNK):  # a blocking Unix socket sends it all
                    raise ConnectionError("a sendmsg sent only part of its buffers")
            else:
                assert region is not None
                while free < n:  # wait for slots back
                    got = conn.recv_into(freed)
                    if got == 0:
                        raise ConnectionError("the receiver went away")
                    free += sum(struct.unpack(f">{got // FREED.size}I", freed[:got]))
                for k in range(n):
                    slot = (sent + k) % SLOTS
                    buf = region[slot * CHUNK : (slot + 1) * CHUNK]
                    buf[:] = source
                    DESCRIPTOR.pack_into(heads, k * DESCRIPTOR.size, slot, CHUNK, crc32c.crc32c(buf), sent + k)
                conn.sendall(memoryview(heads)[: n * DESCRIPTOR.size])
                free -= n
            sent += n
        cpu = _cpu() - cpu0
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(1 << 16):  # the receiver's last frees, then its close
            pass
    print(json.dumps({"cpu": cpu}), flush=True)


def run_once(tmp: Path, method: str, count: int) -> tuple[float, float, float]:
    """MiB/s at the receiver, the receiver's and the writer's CPU seconds per GiB."""
    mode, batch = METHODS[method]
    sock = str(tmp / "probe.sock")
    with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="shuffled-probe-") as region:
        region.truncate(SLOTS * CHUNK)
        region.flush()
        args = ("--path", sock, "--region", region.name, "--mode", mode, "--count", str(count))
        recv = helper("recv", *args, module=MODULE)
        try:
            assert recv.stdout is not None
            if recv.stdout.readline().strip() != "ready":
                raise RuntimeError("the receiver did not start")
            write = helper("write", *args, "--batch", str(batch), module=MODULE)
            got = finish(recv)
            wrote = finish(write)
        finally:
            recv.kill()
            os.unlink(sock)
    if got["buffers"] != count:
        raise ConnectionError(f"the receiver took {got['buffers']} buffers, {count} were sent")
    gib = count * CHUNK / (1 << 30)
    return count * CHUNK / got["seconds"] / MiB, got["cpu"] / gib, wrote["cpu"] / gib


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shm_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="run", choices=["run", "recv", "write"])
    parser.add_argument("--mib", type=int, default=1024, help="bytes moved per run, MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--path", default="")
    parser.add_argument("--region", default="")
    parser.add_argument("--mode", choices=["socket", "copy", "inplace"], default="socket")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args(argv)
    if args.role != "run":
        signal.alarm(RUN_LIMIT)  # a helper never outlives a stalled run
        if args.role == "recv":
            _receive(args.path, args.region, args.mode, args.count)
        else:
            _write(args.path, args.region, args.mode, args.count, args.batch)
        return 0
    count = args.mib * MiB // CHUNK
    rows: dict[str, list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="shuffled-shm-probe-") as tmp:
        for _ in range(args.repeats):
            for method in METHODS:
                rows.setdefault(method, []).append(run_once(Path(tmp), method, count))
    print(f"{args.mib} MiB of 32 KiB buffers per run, median of {args.repeats} (range)")
    print_rows(rows, ("method", "MiB/s", "receiver CPU s/GiB", "writer CPU s/GiB"), (40, 22, 20, 20))
    return 0


if __name__ == "__main__":
    sys.exit(main())
