"""`python -m benchmarks.zerocopy`: what sendfile and splice would save the daemon, measured without the daemon.

Not a scenario (it measures system calls, not shuffled); it answers whether
the daemon should move bytes with `os.sendfile`/`os.splice` instead of reading them into pool
segments and writing those. Two parts, each with plain blocking sockets over loopback TCP so
the numbers are the kernel's and not an event loop's:

* **serve**: one process sends a page-cached file of 32 KiB chunks, each behind a 40-byte
  frame header (a BufferResponse), to a receiver process, the way a daemon serves spilled
  chunks: `preadv` 16 chunks into 16 segments and `writev` headers and payloads (what the
  daemon does, with and without the CRC32C check it makes at read); `sendfile` per chunk
  after a `send(MSG_MORE)` of its header; `splice` file → pipe → socket with the header
  written into the pipe first.
* **relay**: sender → relay → receiver (three processes); the relay either reads into a
  32 KiB buffer and writes it (what any relay that looks at the bytes must do) or splices
  socket → pipe → socket (what a relay could do if nothing needed inspecting or rewriting).

Prints a table: MiB/s seen by the receiver, CPU seconds per GiB of the sender (serve) or of the
relay, and of the receiver (on one host the reader pays its share on the same cores), each the
median of `--repeats` runs taken in turn (so noise hits all methods alike), with the range.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .common import HOST_FOR_HELPERS, MiB, median

CHUNK = 32 << 10
#: chunks per preadv/writev, as the daemon's disk feed batches them (and per TCP_CORK for sendfile)
BATCH = 16
#: a BufferResponse prefix (frame header + fixed fields)
HEADER = b"\x00" * 40
RECV_SIZE = 256 << 10
#: seconds any process of the probe may take for one run before SIGALRM ends it (a stall must not hang it;
#: socket timeouts would make the sockets non-blocking, which sendfile and splice here must not see)
RUN_LIMIT = 120


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------- helper processes


def _receive(nbytes: int) -> None:
    """Reads until `nbytes` arrived; prints the wall time from the first byte."""
    with socket.create_server((HOST_FOR_HELPERS, 0)) as server:
        print(server.getsockname()[1], flush=True)
        conn, _ = server.accept()
        buf = memoryview(bytearray(RECV_SIZE))
        got = conn.recv_into(buf)
        t0 = time.perf_counter()
        cpu0 = _cpu()
        while got < nbytes:
            n = conn.recv_into(buf)
            if n == 0:
                raise ConnectionError(f"sender went away after {got} of {nbytes} bytes")
            got += n
        seconds = time.perf_counter() - t0
        print(json.dumps({"bytes": got, "seconds": seconds, "cpu": _cpu() - cpu0}), flush=True)
        conn.close()


def _send_memory(port: int, nbytes: int) -> None:
    """Writes `nbytes` of one 32 KiB buffer."""
    buf = memoryview(bytes(range(256)) * (CHUNK // 256))
    with socket.create_connection((HOST_FOR_HELPERS, port)) as conn:
        for _ in range(nbytes // CHUNK):
            conn.sendall(buf)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)


def _relay(port: int, nbytes: int, method: str) -> None:
    """Accepts one connection and forwards `nbytes` of it to `port`; prints its CPU seconds."""
    with (
        socket.create_server((HOST_FOR_HELPERS, 0)) as server,
        socket.create_connection((HOST_FOR_HELPERS, port)) as out,
    ):
        print(server.getsockname()[1], flush=True)
        conn, _ = server.accept()
        cpu0 = _cpu()
        moved = 0
        if method == "splice":
            r, w = os.pipe()
            while moved < nbytes:
                n = os.splice(conn.fileno(), w, 1 << 16)
                if n == 0:
                    break
                while n:
                    sent = os.splice(r, out.fileno(), n)
                    n -= sent
                    moved += sent
        else:
            buf = memoryview(bytearray(CHUNK))
            while moved < nbytes:
                n = conn.recv_into(buf)
                if n == 0:
                    break
                out.sendall(buf[:n])
                moved += n
        print(json.dumps({"cpu": _cpu() - cpu0}), flush=True)
        conn.close()


# --------------------------------------------------------------------------- serve: file -> socket


def _serve_preadv(fd: int, sock: socket.socket, size: int, check: bool) -> None:
    import crc32c

    segments = [bytearray(CHUNK) for _ in range(BATCH)]
    views = [memoryview(s) for s in segments]
    for offset in range(0, size, CHUNK * BATCH):
        os.preadv(fd, segments, offset)
        if check:
            for s in views:
                crc32c.crc32c(s)
        parts: list[bytes | memoryview] = []
        for s in views:
            parts += (HEADER, s)
        if sock.sendmsg(parts) != BATCH * (len(HEADER) + CHUNK):  # a blocking socket takes all of it
            raise ConnectionError("short sendmsg")


def _serve_sendfile(fd: int, sock: socket.socket, size: int, cork: bool) -> None:
    """With `cork`, TCP_CORK holds each batch of 16 frames back until it is complete, as one writev would."""
    out = sock.fileno()
    for offset in range(0, size, CHUNK):
        if cork and offset % (CHUNK * BATCH) == 0:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        sock.send(HEADER, socket.MSG_MORE)
        done = 0
        while done < CHUNK:
            done += os.sendfile(out, fd, offset + done, CHUNK - done)
        if cork and (offset // CHUNK) % BATCH == BATCH - 1:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)


def _serve_splice(fd: int, sock: socket.socket, size: int, check: bool) -> None:
    r, w = os.pipe()
    out = sock.fileno()
    try:
        for offset in range(0, size, CHUNK):
            os.write(w, HEADER)
            done = 0
            while done < CHUNK:
                done += os.splice(fd, w, CHUNK - done, offset_src=offset + done)
            left = len(HEADER) + CHUNK
            while left:
                left -= os.splice(r, out, left)
    finally:
        os.close(r)
        os.close(w)


#: name -> (function, its flag: check the CRC32C for preadv, cork for sendfile)
SERVE: dict[str, tuple[Callable[[int, socket.socket, int, bool], None], bool]] = {
    "preadv + writev (the daemon's way, no check)": (_serve_preadv, False),
    "preadv + CRC32C + writev (the daemon today)": (_serve_preadv, True),
    "sendfile per chunk, header send(MSG_MORE)": (_serve_sendfile, False),
    "the same, TCP_CORK per 16 chunks": (_serve_sendfile, True),
    "splice file→pipe→socket, header into the pipe": (_serve_splice, False),
}


def helper(*args: str, module: str = "benchmarks.zerocopy") -> subprocess.Popen[str]:
    """A probe's helper process (`python -m <module> <role> ...`), its output read line by line."""
    return subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, text=True, bufsize=1)


def finish(proc: subprocess.Popen[str]) -> dict[str, float]:
    """The JSON line a helper prints when it is done; RuntimeError if it failed instead."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if proc.wait(RUN_LIMIT) != 0 or not line:
        raise RuntimeError(f"a probe process failed ({proc.args!r})")
    result: dict[str, float] = json.loads(line)
    return result


def _rate(result: dict[str, float], expected: int) -> float:
    if result["bytes"] != expected:
        raise ConnectionError(f"the receiver got {result['bytes']} bytes, {expected} were sent")
    return result["bytes"] / result["seconds"] / MiB


def serve_once(path: Path, size: int, method: str) -> tuple[float, float, float]:
    """MiB/s at the receiver, the sender's and the receiver's CPU seconds per GiB."""
    expected = size // CHUNK * (CHUNK + len(HEADER))
    recv = helper("recv", "--bytes", str(expected))
    assert recv.stdout is not None
    port = int(recv.stdout.readline())
    send, check = SERVE[method]
    fd = os.open(path, os.O_RDONLY)
    try:
        with socket.create_connection((HOST_FOR_HELPERS, port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the daemon has it
            cpu0 = _cpu()
            send(fd, sock, size, check)
            cpu = _cpu() - cpu0
            result = finish(recv)
    finally:
        os.close(fd)
    gib = size / (1 << 30)
    return _rate(result, expected), cpu / gib, result["cpu"] / gib


def relay_once(size: int, method: str) -> tuple[float, float, float]:
    """MiB/s at the receiver, the relay's and the receiver's CPU seconds per GiB."""
    recv = helper("recv", "--bytes", str(size))
    assert recv.stdout is not None
    port = recv.stdout.readline().strip()
    relay = helper("relay", "--port", port, "--bytes", str(size), "--method", method)
    assert relay.stdout is not None
    relay_port = relay.stdout.readline().strip()
    send = helper("send", "--port", relay_port, "--bytes", str(size))
    result = finish(recv)
    cpu = finish(relay)["cpu"]
    send.wait(60)
    gib = size / (1 << 30)
    return _rate(result, size), cpu / gib, result["cpu"] / gib


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.zerocopy", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="run", choices=["run", "recv", "send", "relay"])
    parser.add_argument("--mib", type=int, default=1024, help="bytes moved per run, MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bytes", type=int, default=0)
    parser.add_argument("--method", choices=["copy", "splice"], default="copy")
    parser.add_argument("--dir", default=None, help="where the file to serve goes (default: the temp dir)")
    args = parser.parse_args(argv)
    if args.role != "run":
        signal.alarm(RUN_LIMIT)
    if args.role == "recv":
        _receive(args.bytes)
        return 0
    if args.role == "send":
        _send_memory(args.port, args.bytes)
        return 0
    if args.role == "relay":
        _relay(args.port, args.bytes, args.method)
        return 0

    size = args.mib * MiB  # a whole number of BATCH * CHUNK
    rows: dict[str, list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="shuffled-zerocopy-", dir=args.dir) as tmp:
        path = Path(tmp) / "chunks"
        with path.open("wb") as f:
            block = os.urandom(MiB)
            for _ in range(size // MiB):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())  # clean pages: no writeback during the runs
        for _ in range(args.repeats):
            for method in SERVE:
                signal.alarm(RUN_LIMIT)
                rows.setdefault(f"serve: {method}", []).append(serve_once(path, size, method))
            for method, name in (("copy", "read + write 32 KiB"), ("splice", "splice socket→pipe→socket")):
                signal.alarm(RUN_LIMIT)
                rows.setdefault(f"relay: {name}", []).append(relay_once(size, method))
            signal.alarm(0)
    print(f"{size // MiB} MiB per run, median of {args.repeats} (range); CPU s/GiB of the sender (serve) or relay")
    print_rows(rows, ("method", "MiB/s", "CPU s/GiB", "receiver CPU"), (52, 20, 16, 16))
    return 0


def print_rows(
    rows: dict[str, list[tuple[float, float, float]]], heads: tuple[str, ...], widths: tuple[int, ...]
) -> None:
    """A probe's table: a row per method, its rate and two CPU columns as the median of its runs (range)."""
    print(f"{heads[0]:<{widths[0]}} " + " ".join(f"{h:>{w}}" for h, w in zip(heads[1:], widths[1:], strict=True)))
    for name, samples in rows.items():
        cells = []
        for i, fmt in enumerate(("{:,.0f}", "{:.2f}", "{:.2f}")):
            values = [s[i] for s in samples]
            cells.append(f"{fmt.format(median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})")
        print(f"{name:<{widths[0]}} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths[1:], strict=True)))


if __name__ == "__main__":
    sys.exit(main())
