"""Fuzzing a live daemon over real sockets: many connections, each a run of frames that are
random but well-formed (they drive the daemon's stream state machines into their per-stream
errors), ending in a mutated frame, random bytes or a truncation (its decoder's fatal paths).

Seeds are the golden vectors (proto/vectors/frames.json) and frames the codec encodes with
random fields. Used by tests/test_fuzz_live.py (a bounded run) and, for long runs, as a
program that starts its own daemon:

    python3 -m tests.fuzzing --frames 5000000 --seconds 1800

Every fuzz connection ends with this side half-closing; the daemon must then close it
within a bound, or it hung. Each connection's frames are generated up front and sent in
one write, so the daemon, not the fuzzer, sets the pace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shuffled.protocol import codec
from shuffled.protocol.frames import HEADER, BufferKind, FrameType, Hello, OpenMapOutput, PartitionRequest, Role

VECTORS = Path(__file__).resolve().parent.parent / "proto" / "vectors" / "frames.json"
APPS = [f"fz-{i}" for i in range(4)]
#: seconds the daemon may take to close a connection after the fuzzer half-closed it
CLOSE_BOUND = 15.0
ADMIN_OPS = ["stats", "ping", "unregister_shuffle", "remove_application", "flush", "nonsense", ""]


def _loopback_only(frame: object) -> bool:
    """Vector frames naming other hosts would make the daemon dial them: network tests stay on loopback."""
    return not isinstance(frame, PartitionRequest) or all(k == "" for k in frame.locations)


def load_seeds() -> list[bytes]:
    data = json.loads(VECTORS.read_text())
    seeds = []
    for entry in data["vectors"] + data["decode_only"]:
        raw = bytes.fromhex(entry["hex"])
        if all(_loopback_only(f) for f in codec.decode_all(raw)):
            seeds.append(raw)
    return seeds + [bytes.fromhex(e["hex"]) for e in data["invalid"] if b"example" not in bytes.fromhex(e["hex"])]


@dataclass
class Generator:
    rng: random.Random
    seeds: list[bytes]
    node: str
    _next_id: int = 1
    _writers: list[int] = field(default_factory=list)

    def _sid(self, own: float = 0.7) -> int:
        """A stream this connection opened (with probability `own`), or any id."""
        if self._writers and self.rng.random() < own:
            return self.rng.choice(self._writers)
        if self.rng.random() < 0.001:
            return 0  # reserved: fatal
        return self.rng.choice([1, 2, 7, 0xFFFFFFFF, self.rng.randrange(1, 1 << 32)])

    def _new(self) -> int:
        self._next_id += 1
        return self._next_id

    def _value(self, depth: int = 0) -> Any:
        r = self.rng
        kinds: list[Callable[[], Any]] = [
            lambda: r.randrange(-(1 << 63), 1 << 64),
            lambda: r.choice([0, 1, -1, 255, 1 << 24]),
            lambda: r.choice([*APPS, "", "x" * 300]),
            lambda: r.random() < 0.5,
            lambda: None,
            lambda: r.random(),
        ]
        if depth < 2:
            kinds += [
                lambda: [self._value(depth + 1) for _ in range(r.randrange(4))],
                lambda: {r.choice(["app", "shuffle", "propagate", "x"]): self._value(depth + 1) for _ in range(3)},
            ]
        return r.choice(kinds)()

    def valid(self) -> bytes:
        """A well-formed frame a client may send, with random values; mostly not fatal."""
        r = self.rng
        app = r.choice(APPS)
        shuffle = r.randrange(4)
        pick = r.random()
        if pick < 0.2:
            start = r.randrange(8)
            where = r.choice(["", "", self.node, "127.0.0.9:1", "nonsense"])
            attempts = [r.randrange(16) for _ in range(r.randrange(4))]
            req = PartitionRequest(
                self._new(), r.randrange(5), app, shuffle, start, max(0, start + r.randrange(-1, 4)), {where: attempts}
            )
            return codec.encode(req)
        if pick < 0.35:
            writer = self._new()
            self._writers.append(writer)
            parts = r.choice([1, 2, 4, 8, 0, 1 << 24, (1 << 24) + 1])
            return codec.encode(OpenMapOutput(writer, app, shuffle, r.randrange(8), r.randrange(16), parts))
        if pick < 0.6:
            payload = r.randbytes(r.choice([0, 1, 100, 4000]))
            return codec.encode_push_data(self._sid(own=0.03), r.randrange(4), r.randrange(9), payload)
        if pick < 0.68:
            return codec.encode_commit(self._sid(), r.randrange(4))
        if pick < 0.74:
            return codec.encode_abort(self._sid())
        if pick < 0.8:
            return codec.encode_add_credit(self._sid() or 1, r.randrange(1, 9))
        if pick < 0.86:
            return codec.encode_cancel(self._sid() or 1)
        if pick < 0.9:
            if r.random() < 0.5:
                return codec.encode_buffer_response(
                    self._sid() or 1, r.randrange(4), 0, 0, BufferKind.END_OF_PARTITION, 0, b""
                )
            return codec.encode_buffer_response(
                self._sid() or 1, r.randrange(4), 0, 0, BufferKind.DATA, 1, r.randbytes(64)
            )
        args = {k: self._value() for k in r.sample(["app", "shuffle", "propagate", "extra"], r.randrange(4))}
        return codec.encode_admin_request(self._new(), r.choice(ADMIN_OPS), args)

    def mutated(self) -> bytes:
        """A seed or a random frame, broken in one of the ways a decoder must survive."""
        r = self.rng
        base = bytearray(r.choice(self.seeds) if r.random() < 0.5 else self.valid())
        if len(base) < HEADER.size:
            return bytes(base)  # a truncated header already (an invalid vector)
        how = r.randrange(7)
        if how == 0:  # flip bits anywhere
            for _ in range(r.randrange(1, 4)):
                base[r.randrange(len(base))] ^= 1 << r.randrange(8)
        elif how == 1:  # header fields: length, type, flags, reserved
            i = r.choice([0, 1, 2, 3, 4, 5, 6, 7])
            base[i] = r.randrange(256)
        elif how == 2:  # length off by a little
            n = int.from_bytes(base[:4], "big") + r.choice([-3, -1, 1, 2, 100])
            base[:4] = max(0, n).to_bytes(4, "big")
        elif how == 3:  # bytes inserted into the body
            i = r.randrange(HEADER.size, len(base) + 1)
            base[i:i] = r.randbytes(r.randrange(1, 9))
        elif how == 4:  # random bytes
            base = bytearray(r.randbytes(r.randrange(1, 200)))
        elif how == 5:  # a body byte replaced (msgpack type tags, fixed fields)
            if len(base) > HEADER.size:
                base[r.randrange(HEADER.size, len(base))] = r.randrange(256)
        else:  # two frames spliced
            other = self.valid()
            base = base[: r.randrange(len(base) + 1)] + bytearray(other[r.randrange(len(other)) :])
        return bytes(base)

    def connection(self, frames: int) -> tuple[bytes, int]:
        """One connection's bytes and its frame count: Hello (sometimes broken), valid frames, a bad ending."""
        r = self.rng
        self._next_id, self._writers = 1, []
        hello = codec.encode(Hello(Role.CLIENT, info={"name": "fuzz"}))
        if r.random() < 0.03:
            return self._mutate_bytes(hello), 1
        parts = [hello] + [self.valid() for _ in range(frames - 2)]
        ending = r.random()
        if ending < 0.6:
            parts.append(self.mutated())
        elif ending < 0.8:  # truncated: the connection then ends inside a frame
            last = self.valid()
            parts.append(last[: r.randrange(len(last))])
        else:
            parts.append(codec.encode_admin_request(self._new(), "ping", {}))
        return b"".join(parts), len(parts)

    def _mutate_bytes(self, data: bytes) -> bytes:
        b = bytearray(data)
        b[self.rng.randrange(len(b))] ^= 1 << self.rng.randrange(8)
        return bytes(b)


@dataclass
class Outcome:
    connections: int = 0
    frames: int = 0
    bytes: int = 0
    #: connections the daemon ended with an Error on stream 0 (its decoder or a fatal rule fired)
    fatal: int = 0
    #: frames the daemon sent back (stream errors, admin answers, push credit...): requests it handled
    replies: int = 0
    #: connections the daemon did not close within CLOSE_BOUND after the fuzzer half-closed
    hung: int = 0


def _scan(received: bytes) -> tuple[int, bool]:
    """Walk the daemon's well-formed output: how many frames, and did one end the connection?"""
    i = frames = 0
    fatal = False
    while i + HEADER.size <= len(received):
        length, ftype, _, _, stream = HEADER.unpack_from(received, i)
        fatal |= ftype == FrameType.ERROR and stream == 0
        frames += 1
        i += HEADER.size + length
    return frames, fatal


async def _one(host: str, port: int, data: bytes, out: Outcome) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    received = bytearray()

    async def drain() -> None:
        while chunk := await reader.read(1 << 16):
            received.extend(chunk)

    reading = asyncio.create_task(drain())
    try:
        writer.write(data)
        await writer.drain()
        writer.write_eof()
    except ConnectionError:
        pass  # the daemon closed first (e.g. after a fatal error it lingered out)
    try:
        await asyncio.wait_for(reading, CLOSE_BOUND)
    except TimeoutError:
        out.hung += 1
    except ConnectionError:
        pass
    finally:
        writer.close()
    replies, fatal = _scan(bytes(received))
    out.replies += replies
    out.fatal += fatal


async def fuzz(addr: str, total_frames: int, seed: int, concurrency: int = 8, per_connection: int = 200) -> Outcome:
    """Send about `total_frames` fuzzed frames to the daemon at `addr` over many connections."""
    host, port = addr.rsplit(":", 1)
    gen = Generator(random.Random(seed), load_seeds(), addr)
    out = Outcome()
    sem = asyncio.Semaphore(concurrency)
    tasks = []
    while out.frames < total_frames:
        data, n = gen.connection(gen.rng.randrange(2, 2 * per_connection))
        out.connections += 1
        out.frames += n
        out.bytes += len(data)
        await sem.acquire()
        task = asyncio.create_task(_one(host, int(port), data, out))
        task.add_done_callback(lambda _: sem.release())
        tasks.append(task)
    await asyncio.gather(*tasks)
    return out


async def check_recycled(addr: str, apps: list[str], secret: str | None = None) -> dict[str, Any]:
    """After fuzzing: the pool holds exactly the stored data, and nothing once the apps are removed.

    Returns the daemon's error counts; an INTERNAL one means a handler crashed, a bug.
    """
    from shuffled_client import AsyncClient
    from tests.cluster import pool_settled

    async with await AsyncClient.connect(addr, secret=secret) as c:
        await pool_settled(c, timeout=30)
        for app in apps:
            await c.remove_application(app)
        s = await pool_settled(c)
        assert s["pool"]["used"] == 0 and s["store"]["open_map_outputs"] == 0, s
        assert s["connections"]["clients"] == 1, s["connections"]
        assert "INTERNAL" not in s["errors"], s["errors"]
        return s["errors"]  # type: ignore[no-any-return]


def main() -> None:
    """A long run against a daemon of its own; exits non-zero if the daemon died or hung."""
    from tests.cluster import Cluster

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=2_000_000)
    parser.add_argument("--seconds", type=float, default=600.0, help="stop starting new rounds after this long")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    cluster = Cluster(1, pool_size="64M")
    d = cluster.daemons[0]
    total = Outcome()
    errors: dict[str, Any] = {}
    started = time.monotonic()
    try:
        seed = args.seed
        while total.frames < args.frames and time.monotonic() - started < args.seconds:
            out = asyncio.run(fuzz(d.addr, min(100_000, args.frames - total.frames), seed))
            for k in vars(total):
                setattr(total, k, getattr(total, k) + getattr(out, k))
            seed += 1
            alive = d.proc.poll() is None
            print(f"seed {seed - 1}: {out} daemon alive={alive}", flush=True)
            if not alive or out.hung:
                sys.exit(1)
            errors = asyncio.run(check_recycled(d.addr, APPS))
        print(f"errors sent by the daemon: {errors}")
    finally:
        cluster.stop()
    print(f"total {total} in {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
