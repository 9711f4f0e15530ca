"""A TCP proxy that injects network faults between two daemons: delay, throttle, cut, corrupt, blackhole.

A daemon dials the proxy's address as if it were the peer; the proxy forwards to
the real daemon. Each direction has its own `Faults`, changeable at any time.
Faults aimed at a frame ("cut 100 bytes into the 3rd BufferResponse", "flip the
type byte of the 2nd BufferResponse header") need to know where frames start, so
each direction follows the frame headers (12 bytes, length first; see
proto/PROTOCOL.md §4) as bytes pass. An incomplete header at the end of a read is
held back until the rest arrives, so a header is always whole when it is looked
at and a corruption never misses the byte it aims for.

With `frames=False` the proxy passes any TCP stream (an S3 server's HTTP) without looking for frames:
delay, throttle and blackhole work as before, and `cut_after` cuts a connection once that many bytes
went its way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field

from shuffled.protocol.frames import HEADER, FrameType

Action = str  # "cut" (reset both sides) or "blackhole" (drop everything from then on, both ways)


@dataclass
class Mark:
    """A point in a direction's byte stream: `offset` bytes into its `nth` frame of type `ftype` (1-based)."""

    ftype: FrameType
    nth: int
    offset: int
    action: Action


@dataclass
class Faults:
    delay: float = 0.0
    #: bytes per second, 0: unthrottled
    rate: int = 0
    #: drop every byte (the connection stays open): a network path that lost everything
    blackhole: bool = False
    #: xor a byte of a frame: (frame type, nth, byte index from the frame's start (header or payload), mask)
    corrupt: tuple[FrameType, int, int, int] | None = None
    mark: Mark | None = None
    #: cut a connection (both sides) once this many bytes went this way on it (with frames=False)
    cut_after: int | None = None
    #: set when the mark's action (or cut_after) happened
    fired: asyncio.Event = field(default_factory=asyncio.Event)
    #: frames seen per type (for tests to wait on)
    seen: Counter[int] = field(default_factory=Counter)
    #: bytes forwarded this way, on every connection (for tests to wait on: an upload under way)
    passed: int = 0


class _Pair:
    def __init__(self, proxy: FaultProxy, down_w: asyncio.StreamWriter, up_w: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.writers = (down_w, up_w)

    def cut(self) -> None:
        for w in self.writers:
            w.transport.abort()

    def blackhole(self) -> None:
        self.proxy.up.blackhole = self.proxy.down.blackhole = True


class FaultProxy:
    def __init__(self, host: str, target: str, frames: bool = True) -> None:
        self.host = host
        self.target = target
        #: follow shuffled frame headers (False: any TCP stream, as bytes)
        self.frames = frames
        self.up = Faults()  # dialer -> target
        self.down = Faults()  # target -> dialer
        self.accepted = 0
        self.pairs: list[_Pair] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        return f"{self.host}:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pair in self.pairs:
            pair.cut()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)

    def cut(self) -> None:
        for pair in self.pairs:
            pair.cut()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        host, port = self.target.rsplit(":", 1)
        try:
            t_reader, t_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.transport.abort()
            return
        pair = _Pair(self, writer, t_writer)
        self.pairs.append(pair)
        pump = self._pump if self.frames else self._pump_raw
        for src, dst, faults in ((reader, t_writer, self.up), (t_reader, writer, self.down)):
            task = asyncio.create_task(pump(src, dst, faults, pair))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, f: Faults, pair: _Pair) -> None:
        held = bytearray()
        base = 0  # stream offset of held[0]
        next_frame = 0  # stream offset of the next frame header
        mark_at: tuple[int, Action] | None = None
        corrupt_at: tuple[int, int] | None = None  # stream offset of the byte to flip, mask
        try:
            while data := await src.read(65536):
                if f.blackhole:
                    continue
                buf = held + data
                i = next_frame - base
                while i + HEADER.size <= len(buf):
                    length, ftype = buf[i : i + 4], buf[i + 4]
                    f.seen[ftype] += 1
                    if f.corrupt is not None and (f.corrupt[0], f.corrupt[1]) == (ftype, f.seen[ftype]):
                        corrupt_at = (base + i + f.corrupt[2], f.corrupt[3])
                    m = f.mark
                    if m is not None and (m.ftype, m.nth) == (ftype, f.seen[ftype]):
                        mark_at = (base + i + m.offset, m.action)
                    i += HEADER.size + int.from_bytes(length, "big")
                next_frame = base + i
                if corrupt_at is not None and corrupt_at[0] < base + len(buf):  # the byte is here (unsent)
                    buf[corrupt_at[0] - base] ^= corrupt_at[1]
                    corrupt_at = None
                send = i if i < len(buf) else len(buf)  # hold back a header that is not whole yet
                if mark_at is not None and mark_at[0] < base + send:
                    await self._forward(dst, f, bytes(buf[: mark_at[0] - base]))
                    f.fired.set()
                    if mark_at[1] == "cut":
                        pair.cut()
                        return
                    pair.blackhole()
                    mark_at = None
                    continue
                await self._forward(dst, f, bytes(buf[:send]))
                held = buf[send:]
                base += send
            if dst.can_write_eof() and not f.blackhole:  # a blackhole swallows the close too
                dst.write_eof()
        except (ConnectionError, OSError):
            pair.cut()

    async def _pump_raw(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, f: Faults, pair: _Pair) -> None:
        passed = 0
        try:
            while data := await src.read(65536):
                if f.blackhole:
                    continue
                if f.cut_after is not None and passed + len(data) >= f.cut_after:
                    await self._forward(dst, f, data[: f.cut_after - passed])
                    f.fired.set()
                    pair.cut()
                    return
                passed += len(data)
                await self._forward(dst, f, data)
            if dst.can_write_eof() and not f.blackhole:
                dst.write_eof()
        except (ConnectionError, OSError):
            pair.cut()

    @staticmethod
    async def _forward(dst: asyncio.StreamWriter, f: Faults, data: bytes) -> None:
        if not data:
            return
        if f.delay:
            await asyncio.sleep(f.delay)  # the fault itself, not synchronisation
        dst.write(data)
        f.passed += len(data)
        with contextlib.suppress(ConnectionError):
            await dst.drain()
        if f.rate:
            await asyncio.sleep(len(data) / f.rate)
