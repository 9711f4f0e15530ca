"""`bare`: a bare uvloop sender and receiver over loopback TCP, the ceiling the other scenarios are compared with.

Two processes, like two daemons. The sender writes 32 KiB `bytes` objects (the
daemon's segment size) and honours pause_writing/resume_writing; the receiver is
an `asyncio.BufferedProtocol` reading into one preallocated 32 KiB buffer, the way
the daemon reads payloads into 32 KiB pool segments. No framing, no pool, no
credit: what is left is the event loop and the kernel, so shuffled's ratio to it
is the share of the machine's loopback capacity the daemon actually delivers.

A bare *relay* (sender → relay → receiver, three processes) is the ceiling of a
two-hop path such as a read relayed by a second daemon: the relay reads each chunk
into a fresh 32 KiB buffer and writes that memory onward (no copy), pausing its
reading while the onward transport is above its high watermark.

The same module also serves the latency baseline: an echo server that a client
in the benchmark process pings with small messages.

Run as `python -m benchmarks.bare recv|send|relay|echo ...` it is one of those
helper processes; it prints `ready <port>` once listening and its result as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import sys
import time

from .common import (
    BASELINE_MAX_AGE,
    HOST_FOR_HELPERS,
    Baseline,
    Context,
    ManagedProcess,
    MiB,
    ScenarioResult,
    bounded,
    helper_process,
    median,
    require,
)

WRITE_SIZE = 32 << 10
RECV_BUFFER = 32 << 10
#: echo pings excluded from the statistics (connection warm-up)
ECHO_WARMUP = 20


# --------------------------------------------------------------------------- helper-process side


class _Receiver(asyncio.BufferedProtocol):
    """Counts bytes landing in reused buffers; times from connection to the last expected byte.

    With `spread` > 1, each read lands in the next of that many 32 KiB buffers, round robin, the way a
    daemon serving many streams reads into many pool segments rather than one that stays in the CPU cache.
    """

    def __init__(self, expected: int, done: asyncio.Future[tuple[int, float]], spread: int = 1) -> None:
        self._region = memoryview(bytearray(spread * RECV_BUFFER))
        self._spread = spread
        self._next = 0
        self.expected = expected
        self.done = done
        self.got = 0
        self.t0 = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t0 = time.perf_counter()

    def get_buffer(self, sizehint: int) -> memoryview:
        offset = self._next * RECV_BUFFER
        self._next = (self._next + 1) % self._spread
        return self._region[offset : offset + RECV_BUFFER]

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        if self.got >= self.expected and not self.done.done():
            self.done.set_result((self.got, time.perf_counter() - self.t0))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"sender went away after {self.got} bytes"))


class _Sender(asyncio.Protocol):
    """Transport flow control as a future: writing waits while the transport is above its high watermark."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.resumed: asyncio.Future[None] | None = None
        self.lost: asyncio.Future[None] = loop.create_future()
        #: the relay's inbound transport, paused while this one is above its high watermark
        self.source: asyncio.ReadTransport | None = None

    def pause_writing(self) -> None:
        self.resumed = asyncio.get_running_loop().create_future()
        if self.source is not None:
            self.source.pause_reading()

    def resume_writing(self) -> None:
        if self.resumed is not None and not self.resumed.done():
            self.resumed.set_result(None)
        self.resumed = None
        if self.source is not None:
            self.source.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        if self.resumed is not None and not self.resumed.done():
            self.resumed.set_exception(ConnectionError("receiver went away"))


class _Relay(asyncio.BufferedProtocol):
    """Forwards what it reads without copying: each read lands in a new buffer whose memory is written onward
    (uvloop holds written memory until the kernel took it, so a buffer is never reused)."""

    def __init__(self, out: asyncio.WriteTransport, out_proto: _Sender) -> None:
        self.out = out
        self.out_proto = out_proto
        self._buf = memoryview(bytearray(RECV_BUFFER))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.out_proto.source = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buf

    def buffer_updated(self, nbytes: int) -> None:
        self.out.write(self._buf[:nbytes])
        self._buf = memoryview(bytearray(RECV_BUFFER))

    def connection_lost(self, exc: Exception | None) -> None:
        self.out.close()


class _Echo(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self._buf = memoryview(bytearray(64 << 10))
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        _nodelay(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buf

    def buffer_updated(self, nbytes: int) -> None:
        assert self.transport is not None
        self.transport.write(bytes(self._buf[:nbytes]))


def _nodelay(transport: asyncio.BaseTransport) -> None:
    """Small-message latency needs Nagle off, as the daemon has it."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _receive(host: str, nbytes: int, timeout: float, spread: int) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[int, float]] = loop.create_future()
    server = await loop.create_server(lambda: _Receiver(nbytes, done, spread), host, 0)
    print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
    got, seconds = await asyncio.wait_for(done, timeout)
    print(json.dumps({"bytes": got, "seconds": seconds}), flush=True)
    server.close()


async def _send(host: str, port: int, nbytes: int, timeout: float, spread: int) -> None:
    """Writes 32 KiB pieces of one buffer, or (`spread` > 1) of that many buffers in turn (see _Receiver)."""
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_connection(_Sender, host, port)
    region = memoryview(bytes(range(256)) * (spread * WRITE_SIZE // 256))
    sent = 0
    piece_no = 0
    async with asyncio.timeout(timeout):
        while sent < nbytes:
            offset = piece_no * WRITE_SIZE
            piece_no = (piece_no + 1) % spread
            transport.write(region[offset : offset + min(WRITE_SIZE, nbytes - sent)])
            sent += min(WRITE_SIZE, nbytes - sent)
            if proto.resumed is not None:
                await proto.resumed
        await proto.lost  # the receiver hangs up once it has everything


async def _relay(host: str, to_port: int, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    out, out_proto = await loop.create_connection(_Sender, host, to_port)
    server = await loop.create_server(lambda: _Relay(out, out_proto), host, 0)
    print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(out_proto.lost, timeout)  # the receiver hangs up once it has everything
    server.close()


async def _serve_echo(host: str, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Echo, host, 0)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
    try:
        await asyncio.wait_for(stop.wait(), timeout)
    except TimeoutError:
        pass
    server.close()


def main(argv: list[str] | None = None) -> int:
    import uvloop

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bare", description="bare uvloop helper process")
    parser.add_argument("role", choices=["recv", "send", "relay", "echo"])
    parser.add_argument("--host", default=HOST_FOR_HELPERS)
    parser.add_argument("--port", type=int, default=0, help="where to send (send, relay)")
    parser.add_argument("--bytes", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds")
    parser.add_argument("--spread", type=int, default=1, help="32 KiB buffers used in turn (send, recv)")
    args = parser.parse_args(argv)
    if args.role == "recv":
        uvloop.run(_receive(args.host, args.bytes, args.timeout, args.spread))
    elif args.role == "send":
        uvloop.run(_send(args.host, args.port, args.bytes, args.timeout, args.spread))
    elif args.role == "relay":
        uvloop.run(_relay(args.host, args.port, args.timeout))
    else:
        uvloop.run(_serve_echo(args.host, args.timeout))
    return 0


# --------------------------------------------------------------------------- benchmark side


async def measure_throughput(nbytes: int, timeout: float, relay: bool = False, spread: int = 1) -> float:
    """One transfer of `nbytes` from a fresh sender process to a fresh receiver (through a fresh relay process
    if `relay`; each end using `spread` buffers in turn); bytes/s as the receiver saw it."""
    started: list[ManagedProcess] = []

    def start(*args: str) -> ManagedProcess:
        started.append(helper_process("bare", *args, "--timeout", str(timeout)))
        return started[-1]

    try:
        recv = start("recv", "--bytes", str(nbytes), "--spread", str(spread))
        port = (await recv.wait_ready()).group(1)
        if relay:
            port = (await start("relay", "--port", port).wait_ready()).group(1)
        send = start("send", "--port", port, "--bytes", str(nbytes), "--spread", str(spread))
        result = json.loads(await recv.next_line(timeout))
        await send.wait_exit(timeout)
    finally:
        for proc in started:
            proc.stop()
    require(result["bytes"] >= nbytes, f"bare receiver got {result['bytes']} of {nbytes} bytes")
    return float(result["bytes"]) / float(result["seconds"])


async def bare_throughput(ctx: Context) -> Baseline:
    """The bare uvloop pair's bytes/s, measured in this run and again if it is stale: the baseline every
    scenario that reports a ratio shares."""
    if ctx.bare is None or time.monotonic() - ctx.bare.measured_at > BASELINE_MAX_AGE:
        ctx.progress("measuring the bare-socket baseline")
        ctx.record_bare(await measure_baseline(ctx))
        assert ctx.bare is not None
        ctx.progress(f"bare baseline {ctx.bare.mib_s:,.0f} MiB/s")
    return ctx.bare


async def measure_baseline(ctx: Context, relay: bool = False, spread: int = 1) -> Baseline:
    """The median of `ctx.repeats` transfers (each with new processes, so no warm state carries over)."""
    nbytes = ctx.pick(1024 * MiB, 256 * MiB)
    samples = [await measure_throughput(nbytes, 60.0, relay, spread) for _ in bounded(ctx.repeats, 60.0)]
    name = "bare relay" if relay else "bare" if spread == 1 else f"bare, {spread} buffers"
    return Baseline(name, median(samples), time.monotonic(), samples)


class _Pinger(asyncio.Protocol):
    def __init__(self, size: int) -> None:
        self.size = size
        self.got = 0
        self.reply: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got >= self.size and self.reply is not None and not self.reply.done():
            self.got -= self.size
            self.reply.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.reply is not None and not self.reply.done():
            self.reply.set_exception(ConnectionError("echo server went away"))


async def measure_echo(size: int, count: int, seconds: float) -> list[float]:
    """Round trips (µs) of `size`-byte messages to an echo process: the floor for a request/response."""
    server = helper_process("bare", "echo", "--timeout", str(seconds + 30))
    try:
        port = int((await server.wait_ready()).group(1))
        loop = asyncio.get_running_loop()
        transport, proto = await loop.create_connection(lambda: _Pinger(size), HOST_FOR_HELPERS, port)
        message = b"x" * size
        samples: list[float] = []
        try:
            for i in bounded(count + ECHO_WARMUP, seconds):
                proto.reply = loop.create_future()
                t0 = time.perf_counter_ns()
                transport.write(message)
                await asyncio.wait_for(proto.reply, 5.0)
                if i >= ECHO_WARMUP:
                    samples.append((time.perf_counter_ns() - t0) / 1000)
        finally:
            transport.close()
    finally:
        server.stop()
    return samples


async def run(ctx: Context, result: ScenarioResult) -> None:
    baseline = await measure_baseline(ctx)
    ctx.record_bare(baseline)
    result.add("loopback TCP, 32 KiB writes", baseline.mib_s, "MiB/s", samples=[s / MiB for s in baseline.samples])
    result.notes.append(
        f"two uvloop processes on {HOST_FOR_HELPERS}, {WRITE_SIZE >> 10} KiB writes, BufferedProtocol receiver "
        f"with a {RECV_BUFFER >> 10} KiB buffer; median of {len(baseline.samples)}"
    )


if __name__ == "__main__":
    sys.exit(main())
