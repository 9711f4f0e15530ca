"""Fuzzing a live daemon over real sockets: many connections, each a run of frames that are
random but well-formed (they drive the daemon's stream state machines into their per-stream
errors), ending in a mutated frame, random bytes or a truncation (its decoder's fatal paths).

Seeds are the golden vectors (proto/vectors/frames.json) and frames the codec encodes with
random fields. Used by tests/integration/test_fuzz_live.py (a bounded run) and, for long runs, as a
program that starts its own daemon:

    python3 -m tests.integration.fuzzing --frames 5000000 --seconds 1800
    python3 -m tests.integration.fuzzing --auth --frames 1000000   # before authentication
    python3 -m tests.integration.fuzzing --members --frames 1000000  # tenants and peers of two daemons

Every fuzz connection ends with this side half-closing; the daemon must then close it
within a bound, or it hung. Each connection's frames are generated up front and sent in
one write, so the daemon, not the fuzzer, sets the pace; only an answer to the daemon's
AuthChallenge waits for it.

With `members` (the cluster and the peer secret) every connection proves one of them, as a tenant
(a client with the cluster secret, which every application has) or as a peer daemon, and then sends
frames whose daemon-only and drain fields are fuzzed too: OpenMapOutput `replicas`, `replica_of`
and `app_key`, PartitionRequest `resume`, the admin `holds`, `drain_challenge` and `drain`
(`Generator.member`). `drain` is sent only there: a daemon without a secret would obey it.

Against a daemon with a secret, `strangers=True` makes every connection a party that
cannot prove the secret of the role it claims (`Generator.stranger`): Hellos with and
without nonces, as client or as daemon; AuthResponses garbled, empty, of the wrong type,
reflected, replayed, or right for the cluster secret where a daemon must prove the peer
secret; headers announcing megabytes before the handshake is done; truncated handshakes.
None may get a frame but AuthChallenge or Error (`Outcome.admitted`). `half_open` adds
many connections that stop in their handshake and stay open until the daemon closes
them. Everything stays on loopback and is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from shuffled.protocol import codec
from shuffled.protocol.auth import acceptor_proof, app_token, dialer_proof, new_nonce, token_digest
from shuffled.protocol.errors import AuthFailed, ErrorCode
from shuffled.protocol.frames import (
    ERROR_FIXED,
    HEADER,
    MAX_CONTROL_BODY,
    MAX_HANDSHAKE_BODY,
    REPLICA,
    AdminRequest,
    AuthChallenge,
    BufferKind,
    FrameType,
    Hello,
    OpenMapOutput,
    PartitionRequest,
    Role,
)
from shuffled.protocol.packed import group_bytes

VECTORS = Path(__file__).resolve().parents[2] / "proto" / "vectors" / "frames.json"
APPS = [f"fz-{i}" for i in range(4)]
#: seconds the daemon may take to close a connection after the fuzzer half-closed it
CLOSE_BOUND = 15.0
ADMIN_OPS = [
    "stats",
    "pool",
    "ping",
    "unregister_shuffle",
    "remove_application",
    "flush",
    "holds",
    "drain_challenge",
    "nonsense",
    "",
]
#: admin argument names, those of the daemon-only and drain operations included
ADMIN_KEYS = ["app", "shuffle", "propagate", "extra", "attempts", "nonce", "proof", "handoff", "timeout", "wait"]
#: the application secret fuzzed replica pushes bind applications with (so they can be removed after)
FUZZ_APP_SECRET = "fuzz-app-secret"
#: loopback addresses fuzzing peer daemons name themselves by (on the target's port)
PEER_HOSTS = [f"127.0.0.{i}" for i in range(90, 94)]
#: what a daemon with a secret may send a party that has not proven it: anything else got past the handshake
BEFORE_AUTH = frozenset({FrameType.AUTH_CHALLENGE, FrameType.ERROR})
#: lengths a header may announce before the handshake is done, all beyond what the daemon then accepts
BIG_LENGTHS = [MAX_HANDSHAKE_BODY + 1, 1 << 20, MAX_CONTROL_BODY, MAX_CONTROL_BODY + 1, 0xFFFFFFFF]


def _harmless(frame: object) -> bool:
    """Vector frames naming other hosts would make the daemon dial them (network tests stay on loopback),
    and a `drain` would stop a daemon without a secret."""
    if isinstance(frame, AdminRequest):
        return frame.op != "drain"
    return not isinstance(frame, PartitionRequest) or all(k == "" for k in frame.locations)


def load_seeds() -> list[bytes]:
    """Every vector, the daemon-only ones (`peer_vectors`) too, as far as it is harmless."""
    data = json.loads(VECTORS.read_text())
    peer = data["peer_vectors"]
    seeds = []
    for entry in data["vectors"] + data["decode_only"] + peer["vectors"]:
        raw = bytes.fromhex(entry["hex"])
        if all(_harmless(f) for f in codec.decode_all(raw)):
            seeds.append(raw)
    invalid = [bytes.fromhex(e["hex"]) for e in data["invalid"] + peer["invalid"]]
    return seeds + [raw for raw in invalid if b"example" not in raw]


def raw_frame(ftype: int, body: bytes, stream: int = 0) -> bytes:
    """A frame with any body, well-formed or not (the codec only encodes valid ones)."""
    return HEADER.pack(len(body), ftype, 0, 0, stream) + body


@dataclass
class Plan:
    """One fuzz connection: `data` goes out at once; `answer`, if set, says what to send when the daemon's
    AuthChallenge arrives (it needs the daemon's nonce); `stranger`: it must not get past the handshake."""

    data: bytes
    frames: int
    answer: Callable[[AuthChallenge], bytes] | None = None
    stranger: bool = False


@dataclass
class Generator:
    rng: random.Random
    seeds: list[bytes]
    node: str
    #: the cluster secret, which every tenant knows: strangers use it where it must not be enough
    secret: bytes | None = None
    #: another daemon a read may name (relayed over the peer link), "" for none
    relay: str = ""
    #: what this connection is: a client, or (`member`) a peer daemon
    role: Role = Role.CLIENT
    #: this connection proved a secret (`member`): `drain` is among its admin operations
    _next_id: int = 1
    _writers: list[int] = field(default_factory=list)
    _reads: list[int] = field(default_factory=list)
    #: a nonce this fuzzer says Hello with again and again, and the daemon's nonce of an earlier challenge
    #: answered with it: a proof for that challenge, replayed, must not pass a new one
    _replay_nonce: str = field(default_factory=new_nonce)
    _old_challenge: str | None = None
    proven: bool = False

    def _sid(self, own: float = 0.7, reads: bool = False) -> int:
        """A stream this connection opened (with probability `own`: a push, or a read with `reads`), or any id
        (AddCredit or a cancel naming an open push is fatal: a read frame for a push stream)."""
        opened = self._reads if reads else self._writers
        if opened and self.rng.random() < own:
            return self.rng.choice(opened)
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
                lambda: {"partition": r.randrange(4), "done": [self._value(depth + 1)]},
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
            where = r.choice(["", "", self.node, "127.0.0.9:1", "nonsense", self.relay])
            attempts = [r.randrange(16) for _ in range(r.randrange(4))]
            end = max(0, start + r.randrange(-1, 4))
            resume = self._resume(start) if r.random() < 0.25 else None
            req = PartitionRequest(self._new(), r.randrange(5), app, shuffle, start, end, {where: attempts})
            self._reads.append(req.receiver)
            if resume is None:
                return codec.encode(req)
            # The resume point goes out as a map of any shape: the codec writes only a well-formed Resume.
            keys = {"app": app, "shuffle": shuffle, "start": start, "end": end, "locations": {where: attempts}}
            body = req.credit.to_bytes(4, "big") + msgpack.packb({**keys, "resume": resume})
            return raw_frame(FrameType.PARTITION_REQUEST, body, req.receiver)
        if pick < 0.35:
            writer = self._new()
            self._writers.append(writer)
            parts = r.choice([1, 2, 4, 8, 0, 1 << 24, (1 << 24) + 1])
            # Values the decoder refuses (replicas 0, an app_key not in hex) end the connection: rarely here,
            # mutated frames at the end of a connection do that.
            replicas = r.choice([None, None, 1, 2, 4]) if r.random() < 0.98 else r.choice([0, 5])
            replica_of = app_key = None
            if self.role is Role.DAEMON or r.random() < 0.05:  # a replica push (§12.4); a client's is refused
                replica_of = r.choice([self.node, self.relay, r.choice(PEER_HOSTS) + ":1", "", "x" * 300])
                app_key = r.choice(["", "", self._app_key(app), None]) if r.random() < 0.98 else "A" * 64
            req_ = OpenMapOutput(
                writer, app, shuffle, r.randrange(8), r.randrange(16), parts, None, replicas, replica_of, app_key
            )
            return codec.encode(req_)
        if pick < 0.6:
            if r.random() < 0.5:  # a packed group (of any attempt, partition and size), or bytes that are none
                payload = group_bytes(r.randrange(16), [(r.randrange(9), r.randbytes(r.choice([1, 100, 4000])))])
            else:
                payload = r.randbytes(r.choice([0, 1, 100, 4000]))
            return codec.encode_push_data(self._sid(own=0.03), r.randrange(4), payload)
        if pick < 0.68:
            return codec.encode_commit(self._sid(), r.randrange(4))
        if pick < 0.74:
            return codec.encode_abort(self._sid())
        if pick < 0.8:
            return codec.encode_add_credit(self._sid(reads=True) or 1, r.randrange(1, 9))
        if pick < 0.86:
            return codec.encode_cancel(self._sid(reads=True) or 1)
        if pick < 0.9 and self.role is Role.DAEMON:  # from a client, a BufferResponse is fatal (§7): an ending
            if r.random() < 0.5:
                return codec.encode_buffer_response(
                    self._sid() or 1, r.randrange(4), 0, BufferKind.END_OF_PARTITION, b""
                )
            return codec.encode_buffer_response(
                self._sid() or 1, r.randrange(4), 0, BufferKind.DATA, group_bytes(1, [(0, r.randbytes(64))])
            )
        ops = ADMIN_OPS + ["drain"] * self.proven
        op = r.choice(ops)
        args = {k: self._admin_value(k) for k in r.sample(ADMIN_KEYS, r.randrange(5))}
        if op == "drain" and not r.random() < 0.9:  # with no proof; the others carry a made-up one
            args.pop("proof", None)
        return codec.encode_admin_request(self._new(), op, args)

    def _admin_value(self, key: str) -> Any:
        """Mostly the type an operation wants for `key` (so the request gets past its type checks), else any."""
        r = self.rng
        if r.random() < 0.3:
            return self._value()
        if key == "attempts":
            return [r.randrange(16) for _ in range(r.randrange(5))]
        if key in ("nonce", "proof"):
            return r.choice([new_nonce(), r.randbytes(32).hex(), "ab"])
        if key in ("handoff", "wait", "propagate"):
            return r.random() < 0.5
        if key in ("shuffle", "timeout"):
            return r.randrange(-1, 5)
        return r.choice(APPS) if key == "app" else self._value()

    def _resume(self, start: int) -> dict[str, Any]:
        """A resume point (§10.6): mostly well formed (copies refuse those that do not fit), sometimes not."""
        r = self.rng
        done = [r.randrange(16) for _ in range(r.randrange(3))]
        m: dict[str, Any] = {"done": done}
        if r.random() < 0.6:
            m |= {
                "attempt": r.randrange(16),
                "partition": r.choice([start, start, start + 1]),
                "bytes": r.choice([0, 100, 32768, 1 << 40]),
            }
        if r.random() < 0.02:  # the decoder's refusal ends the connection
            m[r.choice(["partition", "done", "attempt", "bytes", "x"])] = self._value()
        return m

    @staticmethod
    def _app_key(app: str) -> str:
        """The digest of the token FUZZ_APP_SECRET gives `app`: what a replica push carries instead of it."""
        return token_digest(app_token(FUZZ_APP_SECRET.encode(), app)).hex()

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
        self._next_id, self._writers, self._reads = 1, [], []
        self.role, self.proven = Role.CLIENT, False
        hello = codec.encode(Hello(Role.CLIENT, info={"name": "fuzz"}))
        if r.random() < 0.03:
            return self._mutate_bytes(hello), 1
        parts = [hello] + [self.valid() for _ in range(frames - 2)] + [self._ending()]
        return b"".join(parts), len(parts)

    def _ending(self) -> bytes:
        """A mutated frame, a truncated one (the connection then ends inside a frame), or a ping."""
        r = self.rng
        ending = r.random()
        if ending < 0.6:
            return self.mutated()
        if ending < 0.8:
            last = self.valid()
            return last[: r.randrange(len(last))]
        return codec.encode_admin_request(self._new(), "ping", {})

    def member(self, frames: int, members: tuple[bytes, bytes]) -> Plan:
        """A connection that proves a secret of the cluster (`members`: the cluster secret and the peer
        secret): a tenant (a client) or, one time in three, a peer daemon naming itself by an address of
        PEER_HOSTS. Its frames follow its AuthResponse without waiting for HelloAck."""
        r = self.rng
        self._next_id, self._writers, self._reads = 1, [], []
        self.role = Role.DAEMON if r.random() < 0.33 else Role.CLIENT
        self.proven = True
        nonce = new_nonce()
        info: dict[str, object] = {"nonce": nonce, "name": "fuzz"}
        if self.role is Role.DAEMON:
            port = self.node.rsplit(":", 1)[1]
            info |= {"node": f"{r.choice(PEER_HOSTS)}:{port}", "segment_size": 32 << 10, "features": [REPLICA]}
        secret = members[1] if self.role is Role.DAEMON else members[0]
        rest = b"".join([self.valid() for _ in range(frames - 2)] + [self._ending()])

        def answer(challenge: AuthChallenge) -> bytes:
            return codec.encode_auth_response(dialer_proof(secret, nonce, challenge.nonce)) + rest

        return Plan(codec.encode(Hello(self.role, info=info)), frames, answer)

    def stranger(self, frames: int) -> Plan:
        """A connection from a party that cannot prove the secret of the role it claims."""
        r = self.rng
        self._next_id, self._writers, self._reads = 1, [], []
        pick = r.random()
        if pick < 0.1:  # the plain generator: Hellos without a nonce, broken Hellos
            data, n = self.connection(frames)
            return Plan(data, n, stranger=True)
        role = Role.DAEMON if r.random() < 0.35 else Role.CLIENT
        nonce = self._nonce()
        hello = self._hello(role, nonce)
        # frames the daemon must never act on: they follow a handshake that fails
        after = [self.valid() for _ in range(r.randrange(0, 6))]
        if pick < 0.35:
            parts = [hello, self._garbled_response(), *after]
            return Plan(b"".join(parts), len(parts), stranger=True)
        if pick < 0.7:
            rest = b"".join(after)
            wrong = self._wrong_answer(role, nonce)
            return Plan(hello, 2 + len(after), lambda ch: wrong(ch) + rest, stranger=True)
        if pick < 0.92:  # a header announcing megabytes, at once or in the middle of the handshake
            header = HEADER.pack(r.choice(BIG_LENGTHS), r.choice(list(FrameType)), 0, 0, 0)
            parts = ([hello] if r.random() < 0.5 else []) + [header + r.randbytes(r.randrange(0, 2000))]
            return Plan(b"".join(parts), len(parts), stranger=True)
        cut = hello[: r.randrange(len(hello))]  # the connection ends inside its Hello
        return Plan(cut, 1, stranger=True)

    def _nonce(self) -> object:
        """Mostly a good nonce; sometimes one the daemon must refuse (too short, too long, not a string)."""
        r = self.rng
        if r.random() < 0.15:
            return self._replay_nonce
        if r.random() < 0.8:
            return new_nonce()
        return r.choice(["ab" * 8, "x" * 257, "", 12345, None, ["n"], b"\x00" * 32])

    def _hello(self, role: Role, nonce: object) -> bytes:
        """A client's Hello, or a daemon's (naming itself, its target, another daemon or nothing), with `nonce`."""
        r = self.rng
        info: dict[str, object] = {"nonce": nonce, "name": "fuzz"}
        if role is Role.DAEMON:
            info["node"] = r.choice([self.node, "127.0.0.9:7337", "", 7])
            info["segment_size"] = r.choice([32 << 10, 32 << 10, 4096, None])
        return codec.encode(Hello(role, info=info))

    def _garbled_response(self) -> bytes:
        """An AuthResponse sent without waiting for the challenge: no proof can be right, many are malformed."""
        r = self.rng
        proof = r.choice(
            [
                r.randbytes(32).hex(),
                "",
                "0" * 64,
                r.randbytes(31).hex(),
                "p" * (MAX_HANDSHAKE_BODY - 64),  # a body just within the handshake limit
                "é" * 64,  # not hex
            ]
        )
        bodies: list[bytes] = [
            msgpack.packb({"proof": proof}),
            msgpack.packb({"proof": r.choice([5, None, ["x"], {"p": 1}, b"\x01" * 32])}),
            msgpack.packb({}),
            msgpack.packb({"proof": proof, "extra": self._value()}),
            r.randbytes(r.randrange(0, 64)),
        ]
        ftype = FrameType.AUTH_RESPONSE if r.random() < 0.9 else r.choice([FrameType.AUTH_CHALLENGE, FrameType.HELLO])
        return raw_frame(ftype, r.choice(bodies))

    def _wrong_answer(self, role: Role, nonce: object) -> Callable[[AuthChallenge], bytes]:
        """What a party without the right secret can answer a challenge with. Chosen now, so the connections
        a seed generates do not depend on when the daemon's challenges arrive."""
        r = self.rng
        ours = nonce if isinstance(nonce, str) else ""
        tenant = self.secret or b"guess"  # the cluster secret, which every tenant knows
        pick = r.random()
        other = r.choice([codec.encode_auth_challenge(new_nonce(), "0" * 64), self._hello(role, new_nonce())])
        garbage = r.randbytes(32).hex()

        def answer(challenge: AuthChallenge) -> bytes:
            old = self._old_challenge
            if ours == self._replay_nonce:
                self._old_challenge = challenge.nonce
            if pick < 0.1:  # a challenge of its own, a second Hello: anything but AuthResponse fails too
                return other
            if pick < 0.25:
                proof = challenge.proof  # reflected: the daemon's own proof
            elif pick < 0.4:
                proof = dialer_proof(b"guess", ours, challenge.nonce)  # a wrong secret
            elif pick < 0.55:
                proof = garbage
            elif pick < 0.7:  # the acceptor's label: a proof the daemon makes, not one a dialer may send
                proof = acceptor_proof(tenant, ours, challenge.nonce)
            elif role is Role.DAEMON:  # the cluster secret, where a daemon must prove the peer secret
                proof = dialer_proof(tenant, ours, challenge.nonce)
            elif ours == self._replay_nonce and old is not None:  # right for an earlier challenge, replayed
                proof = dialer_proof(tenant, ours, old)
            else:
                proof = garbage
            return codec.encode_auth_response(proof)

        return answer

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
    #: connections the daemon sent an AuthChallenge (it checked their Hello and asked for a proof)
    challenged: int = 0
    #: strangers that got any frame but AuthChallenge or Error: past the handshake without the secret
    admitted: int = 0
    #: members (tenants and peers proving their secret) the daemon let past the handshake
    members_in: int = 0


def _scan(received: bytes) -> tuple[list[tuple[int, int, bytes]], bool]:
    """Walk the daemon's well-formed output: its frames (type, stream, body), and did one end the connection?"""
    i = 0
    frames = []
    fatal = False
    while i + HEADER.size <= len(received):
        length, ftype, _, _, stream = HEADER.unpack_from(received, i)
        fatal |= ftype == FrameType.ERROR and stream == 0
        frames.append((ftype, stream, received[i + HEADER.size : i + HEADER.size + length]))
        i += HEADER.size + length
    return frames, fatal


def _challenge(received: bytes) -> AuthChallenge | None:
    """The daemon's AuthChallenge, once it is all here."""
    for ftype, stream, body in _scan(received)[0]:
        if ftype == FrameType.AUTH_CHALLENGE:
            frame = codec.decode_control(FrameType.AUTH_CHALLENGE, stream, memoryview(body))
            assert isinstance(frame, AuthChallenge)
            return frame
    return None


async def _one(host: str, port: int, plan: Plan, out: Outcome) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    received = bytearray()
    challenged = asyncio.Event()

    async def drain() -> None:
        while chunk := await reader.read(1 << 16):
            received.extend(chunk)
            if not challenged.is_set() and _challenge(bytes(received)) is not None:
                challenged.set()

    reading = asyncio.create_task(drain())
    try:
        writer.write(plan.data)
        if plan.answer is not None:  # answered once the challenge is here; not at all if the daemon closed
            waiting = asyncio.create_task(challenged.wait())
            await asyncio.wait({reading, waiting}, timeout=CLOSE_BOUND, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            challenge = _challenge(bytes(received))
            if challenge is not None:
                writer.write(plan.answer(challenge))
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
    frames, fatal = _scan(bytes(received))
    out.replies += len(frames)
    out.fatal += fatal
    out.challenged += any(f[0] == FrameType.AUTH_CHALLENGE for f in frames)
    passed = any(f[0] not in BEFORE_AUTH for f in frames)
    out.admitted += plan.stranger and passed
    out.members_in += plan.answer is not None and not plan.stranger and passed


async def fuzz(
    addr: str,
    total_frames: int,
    seed: int,
    concurrency: int = 8,
    per_connection: int = 200,
    strangers: bool = False,
    secret: bytes | None = None,
    members: tuple[bytes, bytes] | None = None,
    relay: str = "",
) -> Outcome:
    """Send about `total_frames` fuzzed frames to the daemon at `addr` over many connections; `strangers`:
    every connection is a party without the secret of its role (`secret`: the cluster secret, which
    tenants know, used where it must not suffice); `members`: every connection proves the cluster or the
    peer secret (`Generator.member`), and reads may name `relay`."""
    host, port = addr.rsplit(":", 1)
    gen = Generator(random.Random(seed), load_seeds(), addr, secret, relay)
    out = Outcome()
    sem = asyncio.Semaphore(concurrency)
    tasks = []
    while out.frames < total_frames:
        n = gen.rng.randrange(2, 2 * per_connection)
        if members is not None:
            plan = gen.member(n, members)
        else:
            plan = gen.stranger(n) if strangers else Plan(*gen.connection(n))
        out.connections += 1
        out.frames += plan.frames
        out.bytes += len(plan.data)
        await sem.acquire()
        task = asyncio.create_task(_one(host, int(port), plan, out))
        task.add_done_callback(lambda _: sem.release())
        tasks.append(task)
    await asyncio.gather(*tasks)
    return out


@dataclass
class HalfOpen:
    """What `half_open` saw: connections refused as they connected (LIMIT_EXCEEDED), closed by the
    daemon's handshake timeout (TIMEOUT), and not closed within the bound (hung)."""

    held: int = 0
    refused: int = 0
    timed_out: int = 0
    hung: int = 0
    #: set once every connection is made (and the ones over the limit were refused)
    connected: asyncio.Event = field(default_factory=asyncio.Event)


async def half_open(addr: str, count: int, source: str, bound: float, seed: int, out: HalfOpen) -> None:
    """`count` connections from `source` (a loopback address) at once, each stopping in its handshake:
    nothing sent, part of a header, part of a Hello, or a Hello with a nonce whose challenge is never
    answered. Each must be refused at once or closed by the daemon within `bound` seconds."""
    host, port = addr.rsplit(":", 1)
    rng = random.Random(seed)
    hello = codec.encode(Hello(Role.CLIENT, info={"nonce": new_nonce()}))
    starts = [b"", hello[:5], hello[: len(hello) - 1], hello]
    made = 0

    async def one(start: bytes) -> None:
        nonlocal made
        try:
            reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
        finally:
            made += 1
            if made == count:
                out.connected.set()
        out.held += 1
        received = bytearray()
        try:
            writer.write(start)

            async def drain() -> None:
                while chunk := await reader.read(1 << 16):
                    received.extend(chunk)

            await asyncio.wait_for(drain(), bound)
        except TimeoutError:
            out.hung += 1
        except ConnectionError:
            pass
        finally:
            out.held -= 1
            writer.close()
        frames = _scan(bytes(received))[0]
        codes = [ERROR_FIXED.unpack_from(body)[0] for ftype, _, body in frames if ftype == FrameType.ERROR]
        out.refused += ErrorCode.LIMIT_EXCEEDED in codes
        out.timed_out += ErrorCode.TIMEOUT in codes

    await asyncio.gather(*(one(rng.choice(starts)) for _ in range(count)))


async def check_recycled(
    addr: str, apps: list[str], secret: str | None = None, app_secret: str | None = None
) -> dict[str, Any]:
    """After fuzzing: the pool holds exactly the stored data, and nothing once the apps are removed (with
    `app_secret`, the apps a fuzzed replica push bound to its tokens are removed with them).

    Returns the daemon's error counts; an INTERNAL one means a handler crashed, a bug.
    """
    from shuffled_client import AsyncClient
    from tests.cluster import pool_settled, wait_until

    if app_secret is not None:
        async with await AsyncClient.connect(addr, secret=secret, app_secret=app_secret) as owner:
            for app in apps:
                with contextlib.suppress(AuthFailed):  # bound to no token: removed below
                    await owner.remove_application(app)
    async with await AsyncClient.connect(addr, secret=secret) as c:
        await pool_settled(c, timeout=30)
        for app in apps:
            await c.remove_application(app)
        s = await pool_settled(c)
        assert s["pool"]["used"] == 0 and s["store"]["open_map_outputs"] == 0, s
        s = await wait_until(c.stats, lambda s: s["connections"]["clients"] == 1, 10, "only this client connected")
        assert "INTERNAL" not in s["errors"], s["errors"]
        return s["errors"]  # type: ignore[no-any-return]


#: the secret of the daemon `main --auth` starts (a test secret, not a real one)
FUZZ_SECRET = "fuzz-secret"


async def _round(addrs: list[str], frames: int, seed: int, mode: str) -> Outcome:
    """One round of `main`: with `auth`, strangers while 160 half-open connections from 127.0.0.77 are held;
    with `members`, tenants and peers of the first daemon, reads relayed to the second."""
    addr = addrs[0]
    if mode == "members":
        members = (FUZZ_SECRET.encode(), f"peer-{FUZZ_SECRET}".encode())
        return await fuzz(addr, frames, seed, members=members, relay=addrs[1])
    if mode != "auth":
        return await fuzz(addr, frames, seed)
    flood = HalfOpen()
    flooding = asyncio.create_task(half_open(addr, 160, "127.0.0.77", 3 + CLOSE_BOUND, seed, flood))
    await flood.connected.wait()
    out = await fuzz(addr, frames, seed, strangers=True, secret=FUZZ_SECRET.encode())
    await flooding
    out.hung += flood.hung
    return out


async def _recycled(addrs: list[str], mode: str) -> dict[str, Any]:
    """`check_recycled` on every daemon of the run; the first one's error counts."""
    if mode == "plain":
        return await check_recycled(addrs[0], APPS)
    apps = APPS if mode == "members" else []
    errors = await check_recycled(addrs[0], apps, FUZZ_SECRET, FUZZ_APP_SECRET)
    for addr in addrs[1:]:
        await check_recycled(addr, [], FUZZ_SECRET)
    return errors


def main() -> None:
    """A long run against daemons of its own; exits non-zero if a daemon died or hung, or (with --auth) a
    stranger got past the handshake."""
    import tempfile

    import psutil

    from tests.cluster import Cluster, secret_flags

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=2_000_000)
    parser.add_argument("--seconds", type=float, default=600.0, help="stop starting new rounds after this long")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--auth", action="store_true", help="a daemon with a secret, fuzzed before authentication")
    how.add_argument(
        "--members", action="store_true", help="two daemons with secrets and two copies, fuzzed by tenants and peers"
    )
    args = parser.parse_args()
    mode = "auth" if args.auth else "members" if args.members else "plain"
    with tempfile.TemporaryDirectory() as tmp:
        extra = [*secret_flags(Path(tmp), FUZZ_SECRET), "--handshake-timeout", "3"] if mode != "plain" else []
        extra += ["--replicas", "2"] if mode == "members" else []
        cluster = Cluster(2 if mode == "members" else 1, pool_size="64M", extra=extra)
    addrs = [d.addr for d in cluster.daemons]
    procs = [psutil.Process(d.pid) for d in cluster.daemons]
    total = Outcome()
    errors: dict[str, Any] = {}
    started = time.monotonic()
    try:
        seed = args.seed
        while total.frames < args.frames and time.monotonic() - started < args.seconds:
            out = asyncio.run(_round(addrs, min(100_000, args.frames - total.frames), seed, mode))
            for k in vars(total):
                setattr(total, k, getattr(total, k) + getattr(out, k))
            seed += 1
            alive = all(d.proc.poll() is None for d in cluster.daemons)
            rss = [p.memory_info().rss >> 20 for p in procs] if alive else []
            print(f"seed {seed - 1}: {out} daemons alive={alive} rss={rss} MiB", flush=True)
            if not alive or out.hung or out.admitted:
                sys.exit(1)
            errors = asyncio.run(_recycled(addrs, mode))
        print(f"errors sent by the daemon: {errors}")
    finally:
        cluster.stop()
    print(f"total {total} in {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
