"""Builds proto/vectors/frames.json, the golden wire-format vectors, from the Python codec.

Regenerate only when the wire format changes deliberately, and review the diff line
by line: the checked-in frames.json is the source of truth (tests/unit/test_vectors.py and
other implementations test against it), this script is only a convenience for
writing it. A change to an existing vector's "hex" is a wire-format change.

    python proto/vectors/generate.py           # rewrite frames.json
    python proto/vectors/generate.py --check   # exit 1 if frames.json is not what this script builds

Valid vectors are frame objects encoded by shuffled.protocol.codec, their data
payloads packed groups (shuffled.protocol.packed). Invalid and decode-only inputs
cannot come from the encoder, so they are packed by hand here.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import sys
from enum import IntEnum
from pathlib import Path
from typing import Any

import msgpack

from shuffled.protocol import auth
from shuffled.protocol import frames as F
from shuffled.protocol.codec import encode
from shuffled.protocol.compression import compress_block
from shuffled.protocol.errors import ErrorCode
from shuffled.protocol.integrity import checksum
from shuffled.protocol.packed import group_bytes
from shuffled.protocol.resume import Resume

OUT = Path(__file__).with_name("frames.json")

U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1


def to_json(frame: F.Frame) -> dict[str, Any]:
    """A frame as the JSON object tests rebuild it from: type name, then the dataclass fields in order."""
    out: dict[str, Any] = {"type": frame.TYPE.name}
    optional = {k.name for k in getattr(frame.BODY, "keys", ()) if k.optional}
    for f in dataclasses.fields(frame):
        value = getattr(frame, f.name)
        if f.name == "length" and isinstance(frame, F.BufferResponse | F.PushData):
            continue  # implied by the payload
        if f.name in optional and value is None:
            continue  # an optional key the frame does not carry
        if f.name == "payload":
            out["payload_hex"] = bytes(value or b"").hex()
        elif isinstance(value, F.Role | F.BufferKind):
            out[f.name] = value.name
        elif isinstance(value, Resume):
            out[f.name] = value.to_wire()
        elif isinstance(value, IntEnum):
            out[f.name] = int(value)  # error codes travel as numbers
        else:
            out[f.name] = value
    return out


def data(frame: F.BufferResponse | F.PushData) -> F.BufferResponse | F.PushData:
    frame.length = len(frame.payload)
    is_event = isinstance(frame, F.BufferResponse) and frame.kind != F.BufferKind.DATA
    frame.crc = 0 if is_event else checksum(frame.payload)
    return frame


Runs = list[tuple[int, bytes]]


def groups(*parts: tuple[int, Runs]) -> bytes:
    """A payload of one or more packed groups, each (attempt, [(partition, data), ...])."""
    return b"".join(group_bytes(attempt, runs) for attempt, runs in parts)


def push(writer: int, sequence: int, attempt: int, runs: Runs) -> F.PushData:
    return F.PushData(writer, sequence, 0, groups((attempt, runs)))


def buffer(receiver: int, sequence: int, backlog: int, *parts: tuple[int, Runs]) -> F.BufferResponse:
    return F.BufferResponse(receiver, sequence, backlog, F.BufferKind.DATA, 0, groups(*parts))


# --------------------------------------------------------------------------- valid frames

LOCAL_ONLY = F.PartitionRequest(
    receiver=1,
    credit=2,
    app="app-20240101-0001",
    shuffle=3,
    start=5,
    end=6,
    locations={"": [42, 43]},
)

SEVERAL_LOCATIONS = F.PartitionRequest(
    receiver=12,
    credit=2,
    app="app-20240101-0001",
    shuffle=7,
    start=0,
    end=200,
    locations={
        "": [1, 2, 3],
        "10.0.0.2:7337": [U64_MAX, U64_MAX - 1, 1 << 63],
        "[fd00::3]:7337": [(1 << 63) - 1, U32_MAX + 1, 9],
    },
)

#: every msgpack integer width, a str8 string, an array16 list, an empty attempt list
INT_WIDTHS = F.PartitionRequest(
    receiver=U32_MAX,
    credit=U32_MAX,
    app="application_1700000000000_0042_attempt_1",
    shuffle=65536,
    start=127,
    end=128,
    locations={
        "host-a.example.com:7337": [0, 127, 128, 255, 256, 65535, 65536, U32_MAX, U32_MAX + 1, U64_MAX],
        "host-b.example.com:7337": list(range(1000, 1017)),
        "host-c.example.com:7337": [],
    },
)

STATS_RESULT: dict[str, Any] = {
    "node": "10.0.0.1:7337",
    "pool": {"segment_size": 32768, "total": 8192, "free": 8000, "used": 192, "reserve": 1024, "local_pools": 3},
    "store": {
        "applications": 1,
        "shuffles": 2,
        "stored_segments": 180,
        "stored_bytes": 5898240,
        "open_map_outputs": 1,
        "commits": 40,
        "aborts": 0,
    },
    "connections": {"clients": 4, "peers": 2},
    "streams": {"served": 1, "pushing": 1, "remote_channels": 2, "inflight_buffers": 0},
}

#: the authentication example of PROTOCOL.md §6.1 and §6.2: inputs and the proofs/token they give
AUTH_SECRET = b"correct horse battery staple"
DIALER_NONCE = "00112233445566778899aabbccddeeff"
ACCEPTOR_NONCE = "ffeeddccbbaa99887766554433221100"
APP_SECRET = b"app-secret-1"
AUTH_APP = "app-20240101-0001"
ACCEPTOR_PROOF = auth.acceptor_proof(AUTH_SECRET, DIALER_NONCE, ACCEPTOR_NONCE)
DIALER_PROOF = auth.dialer_proof(AUTH_SECRET, DIALER_NONCE, ACCEPTOR_NONCE)
APP_TOKEN = auth.app_token(APP_SECRET, AUTH_APP)
#: the `drain` proofs of PROTOCOL.md §13: the caller's nonce is DIALER_NONCE, the daemon's ACCEPTOR_NONCE
PEER_SECRET = b"only daemons know this"
DRAIN_NODE = "10.0.0.1:7337"
DRAIN_CLIENT = "10.0.0.9:51234"
DRAIN_CHALLENGE_PROOF = auth.drain_challenge_proof(PEER_SECRET, DIALER_NONCE, ACCEPTOR_NONCE, DRAIN_NODE, DRAIN_CLIENT)
DRAIN_PROOF = auth.drain_proof(PEER_SECRET, DIALER_NONCE, ACCEPTOR_NONCE, True, 60)

VALID: list[tuple[str, F.Frame]] = [
    ("Hello from a client", F.Hello(F.Role.CLIENT, info={"name": "spark-executor-7"})),
    ("Hello from a client, with a nonce", F.Hello(F.Role.CLIENT, info={"name": "exec-1", "nonce": DIALER_NONCE})),
    ("Hello from a daemon", F.Hello(F.Role.DAEMON, info={"node": "10.0.0.2:7337", "segment_size": 32768})),
    (
        "Hello from a daemon, with a nonce",
        F.Hello(F.Role.DAEMON, info={"node": "10.0.0.2:7337", "segment_size": 32768, "nonce": DIALER_NONCE}),
    ),
    ("AuthChallenge", F.AuthChallenge(ACCEPTOR_NONCE, ACCEPTOR_PROOF)),
    ("AuthResponse", F.AuthResponse(DIALER_PROOF)),
    ("AuthResponse without a secret", F.AuthResponse("")),
    ("HelloAck", F.HelloAck(F.Role.DAEMON, info={"node": "10.0.0.1:7337", "segment_size": 32768})),
    (
        "Error on stream 0 (fatal for the connection)",
        F.ErrorResponse(0, ErrorCode.CREDIT_VIOLATION, "data buffer received on a channel with no credit"),
    ),
    (
        "Error on a stream",
        F.ErrorResponse(12, ErrorCode.PARTITION_NOT_FOUND, "map attempts not committed here for app-1/7: 42"),
    ),
    ("Error with an empty message", F.ErrorResponse(3, ErrorCode.SHUTTING_DOWN, "")),
    ("Error with a non-ASCII message", F.ErrorResponse(4, ErrorCode.INVALID_REQUEST, "unknown app 'café' ✗")),
    ("Close", F.Close()),
    ("PartitionRequest, local data only", LOCAL_ONLY),
    ("PartitionRequest, several locations, attempt ids near 2^64-1", SEVERAL_LOCATIONS),
    ("PartitionRequest, every msgpack int width, str8, array16, empty list", INT_WIDTHS),
    (
        "PartitionRequest, no locations",
        F.PartitionRequest(receiver=2, credit=2, app="a", shuffle=0, start=0, end=0, locations={}),
    ),
    (
        "PartitionRequest with an application token",
        F.PartitionRequest(
            receiver=4, credit=2, app=AUTH_APP, shuffle=3, start=0, end=1, locations={"": [42]}, token=APP_TOKEN
        ),
    ),
    ("AddCredit", F.AddCredit(1, 3)),
    ("AddCredit, largest values", F.AddCredit(U32_MAX, U32_MAX)),
    (
        "BufferResponse, data: one group of one run",
        data(buffer(1, 0, 4, (42, [(5, bytes.fromhex("00010203fffe") + b"shuffle")]))),
    ),
    (
        "BufferResponse, data: one group of several runs",
        data(buffer(1, 1, 3, (42, [(5, b"k1=v1\n"), (6, b"k2=v2\nk3=v3\n"), (9, b"\x00")]))),
    ),
    (
        "BufferResponse, data: several groups",
        data(buffer(1, 2, 0, (42, [(7, b"seven"), (8, b"eight")]), (43, [(5, b"five")]), (U64_MAX, [(6, b"six")]))),
    ),
    (
        "BufferResponse, data, largest sequence, attempt and partition",
        data(buffer(9, U32_MAX, U32_MAX, (U64_MAX, [((1 << 24) - 1, b"\x80")]))),
    ),
    (
        "BufferResponse, END_OF_PARTITION event",
        data(F.BufferResponse(1, 2, 0, F.BufferKind.END_OF_PARTITION, 0, b"")),
    ),
    ("CancelPartitionRequest", F.CancelPartitionRequest(12)),
    (
        "OpenMapOutput",
        F.OpenMapOutput(writer=5, app="app-20240101-0001", shuffle=3, map_index=17, attempt=4711, partitions=200),
    ),
    (
        "OpenMapOutput, attempt id 2^64-1",
        F.OpenMapOutput(writer=6, app="app-20240101-0001", shuffle=3, map_index=0, attempt=U64_MAX, partitions=1),
    ),
    (
        "OpenMapOutput with an application token",
        F.OpenMapOutput(writer=7, app=AUTH_APP, shuffle=3, map_index=1, attempt=4712, partitions=2, token=APP_TOKEN),
    ),
    (
        "OpenMapOutput asking for 2 copies",
        F.OpenMapOutput(
            writer=8, app="app-20240101-0001", shuffle=3, map_index=2, attempt=4713, partitions=200, replicas=2
        ),
    ),
    (
        "OpenMapOutput with an application token, asking for 4 copies",
        F.OpenMapOutput(
            writer=9, app=AUTH_APP, shuffle=3, map_index=3, attempt=4714, partitions=2, token=APP_TOKEN, replicas=4
        ),
    ),
    (
        "OpenMapOutput asking for durability in the object store",
        F.OpenMapOutput(
            writer=10,
            app="app-20240101-0001",
            shuffle=3,
            map_index=4,
            attempt=4715,
            partitions=200,
            durability="object-store",
        ),
    ),
    (
        "OpenMapOutput with an application token, 2 copies and no durability",
        F.OpenMapOutput(
            writer=11,
            app=AUTH_APP,
            shuffle=3,
            map_index=5,
            attempt=4716,
            partitions=2,
            token=APP_TOKEN,
            replicas=2,
            durability="none",
        ),
    ),
    (
        "OpenMapOutput asking for its CommitAck to follow an fsync",
        F.OpenMapOutput(
            writer=12, app="app-20240101-0001", shuffle=3, map_index=6, attempt=4717, partitions=200, fsync="commit"
        ),
    ),
    ("PushCredit", F.PushCredit(5, 16)),
    ("PushData, one run", data(push(5, 0, 4711, [(199, b"key=value\n" * 3)]))),
    (
        "PushData, several runs, partitions with no data left out",
        data(push(5, 1, 4711, [(0, b"a"), (2, b"bb"), (3, b"ccc"), (150, b"dddd"), (199, b"eeeee")])),
    ),
    ("PushData, the last partition continued", data(push(5, 2, 4711, [(199, b"ee")]))),
    ("PushData, largest sequence", data(push(5, U32_MAX, U64_MAX, [((1 << 24) - 1, b"\x00")]))),
    (
        "Hello from a client, asking for shared memory",
        F.Hello(F.Role.CLIENT, info={"name": "executor-3", "features": [F.SHM]}),
    ),
    (
        "HelloAck to a client, giving it shared memory",
        F.HelloAck(
            F.Role.DAEMON,
            info={
                "node": "10.0.0.1:7337",
                "segment_size": 32768,
                "features": [F.SHM],
                "shm": {"path": "/dev/shm/shuffled-4242-0a1b2c3d/6c9f0e1d2a3b4c5d6e7f8091a2b3c4d5", "size": 268435456},
            },
        ),
    ),
    (
        "Hello from a client, asking for shared memory and reads in place",
        F.Hello(F.Role.CLIENT, info={"name": "executor-3", "features": [F.SHM, F.SHM_READ]}),
    ),
    (
        "HelloAck to a client, giving it shared memory and reads in place",
        F.HelloAck(
            F.Role.DAEMON,
            info={
                "node": "10.0.0.1:7337",
                "segment_size": 32768,
                "features": [F.SHM, F.SHM_READ],
                "shm": {
                    "path": "/dev/shm/shuffled-4242-0a1b2c3d/0f1e2d3c4b5a69788796a5b4c3d2e1f0",
                    "size": 268435456,
                    "reads": {
                        "path": "/dev/shm/shuffled-4242-0a1b2c3d/9a8b7c6d5e4f30211203f4e5d6c7b8a9",
                        "size": 16777216,
                    },
                },
            },
        ),
    ),
    ("BufferPlaced", F.BufferPlaced(7, [0, 3, 0x1F2E3D4C, 8192, 32768])),
    ("BufferPlaced, largest values", F.BufferPlaced(7, [U32_MAX, U32_MAX, U32_MAX, U32_MAX, 1])),
    (
        "BufferPlaced, three buffers",
        F.BufferPlaced(7, [4, 2, 0xA1B2C3D4, 8192, 32768, 5, 1, 0x1F2E3D4C, 8200, 100, 6, 0, 0, 8193, 1]),
    ),
    ("ReturnSlots, one slot", F.ReturnSlots(0, [8192])),
    ("ReturnSlots, several slots", F.ReturnSlots(0, [8200, 8192, 8193, U32_MAX])),
    ("PushSlots, one slot", F.PushSlots(5, [0])),
    ("PushSlots, several slots", F.PushSlots(5, [17, 3, 8191, U32_MAX])),
    ("PushPlaced", F.PushPlaced(5, [0, 0x1F2E3D4C, 17, 32768])),
    ("PushPlaced, largest values", F.PushPlaced(5, [U32_MAX, U32_MAX, U32_MAX, 1])),
    ("PushPlaced, three groups", F.PushPlaced(5, [7, 0x1F2E3D4C, 17, 32768, 8, 0xA1B2C3D4, 3, 100, 9, 0, 8191, 1])),
    ("CommitMapOutput", F.CommitMapOutput(5, 38)),
    (
        "CommitAck, several lengths including some over 2^32",
        F.CommitAck(5, [0, 1, 32768, U32_MAX, U32_MAX + 1, 5 * (1 << 40) + 3, U64_MAX]),
    ),
    ("CommitAck, one partition", F.CommitAck(6, [0])),
    ("AbortMapOutput", F.AbortMapOutput(5)),
    ("AbortAck", F.AbortAck(5)),
    ("AdminRequest, stats", F.AdminRequest(1, "stats", {})),
    (
        "AdminRequest, unregister_shuffle",
        F.AdminRequest(2, "unregister_shuffle", {"app": "app-20240101-0001", "shuffle": 3, "propagate": True}),
    ),
    (
        "AdminRequest, remove_application (as forwarded to a peer)",
        F.AdminRequest(3, "remove_application", {"app": "app-20240101-0001", "propagate": False}),
    ),
    (
        "AdminRequest, remove_application with an application token",
        F.AdminRequest(4, "remove_application", {"app": AUTH_APP, "propagate": True, "token": APP_TOKEN}),
    ),
    ("AdminRequest, drain_challenge", F.AdminRequest(5, "drain_challenge", {"nonce": DIALER_NONCE})),
    (
        "AdminResponse, drain_challenge",
        F.AdminResponse(
            5, {"nonce": ACCEPTOR_NONCE, "node": DRAIN_NODE, "client": DRAIN_CLIENT, "proof": DRAIN_CHALLENGE_PROOF}
        ),
    ),
    (
        "AdminRequest, drain with its proof, waiting for the end",
        F.AdminRequest(6, "drain", {"handoff": True, "timeout": 60, "wait": True, "proof": DRAIN_PROOF}),
    ),
    (
        "AdminResponse, unregister_shuffle with peers",
        F.AdminResponse(
            2,
            {
                "freed_segments": 180,
                "peers": {
                    "10.0.0.2:7337": "ok",
                    "10.0.0.3:7337": "PEER_UNAVAILABLE: cannot reach daemon 10.0.0.3:7337",
                },
            },
        ),
    ),
    ("AdminResponse, stats", F.AdminResponse(1, STATS_RESULT)),
]

#: the digest a replica push carries instead of the token (§7.8): SHA-256 of the example token
APP_KEY = auth.token_digest(APP_TOKEN).hex()

#: frames only daemons send each other (§15: client implementations may skip them)
PEER: list[tuple[str, F.Frame]] = [
    (
        "Hello from a daemon, offering features",
        F.Hello(
            F.Role.DAEMON,
            info={"node": "10.0.0.2:7337", "segment_size": 32768, "features": [F.REPLICA], "nonce": DIALER_NONCE},
        ),
    ),
    (
        "HelloAck to a daemon, offering features",
        F.HelloAck(F.Role.DAEMON, info={"node": "10.0.0.1:7337", "segment_size": 32768, "features": [F.REPLICA]}),
    ),
    (
        "OpenMapOutput, a replica push",
        F.OpenMapOutput(
            writer=3,
            app=AUTH_APP,
            shuffle=3,
            map_index=1,
            attempt=4712,
            partitions=2,
            replicas=2,
            replica_of="10.0.0.1:7337",
            app_key=APP_KEY,
        ),
    ),
    (
        "OpenMapOutput, a replica push of an application without a token",
        F.OpenMapOutput(
            writer=4,
            app="app-1",
            shuffle=0,
            map_index=0,
            attempt=7,
            partitions=1,
            replica_of="10.0.0.1:7337",
            app_key="",
        ),
    ),
    (
        "PartitionRequest resuming inside a pair",
        F.PartitionRequest(
            receiver=5,
            credit=2,
            app=AUTH_APP,
            shuffle=3,
            start=4,
            end=6,
            locations={"": [41, 42, 43]},
            token=APP_TOKEN,
            resume=Resume((41,), 42, 5, 98304),
        ),
    ),
    (
        "PartitionRequest resuming between attempts",
        F.PartitionRequest(
            receiver=6,
            credit=2,
            app="app-1",
            shuffle=0,
            start=2,
            end=3,
            locations={"": [U64_MAX, 8]},
            resume=Resume((U64_MAX,)),
        ),
    ),
    (
        "PartitionRequest resuming at the start of a pair, largest values",
        F.PartitionRequest(
            receiver=7,
            credit=2,
            app="app-1",
            shuffle=0,
            start=0,
            end=U32_MAX,
            locations={"": [U64_MAX, 8]},
            resume=Resume((), U64_MAX, U32_MAX - 1, U64_MAX),
        ),
    ),
]


#: the worked example in PROTOCOL.md (one read of 3 buffers under 2 initial credits); names start with "example:"
EXAMPLE: list[tuple[str, F.Frame]] = [
    ("example: client Hello", F.Hello(F.Role.CLIENT, info={"name": "exec-1"})),
    ("example: daemon HelloAck", F.HelloAck(F.Role.DAEMON, info={"node": "10.0.0.1:7337", "segment_size": 32768})),
    (
        "example: PartitionRequest",
        F.PartitionRequest(receiver=1, credit=2, app="app-1", shuffle=0, start=3, end=5, locations={"": [7, 8]}),
    ),
    ("example: buffer 0", data(buffer(1, 0, 2, (7, [(3, b"abc"), (4, b"de")])))),
    ("example: buffer 1", data(buffer(1, 1, 1, (7, [(4, b"fg")])))),
    ("example: AddCredit", F.AddCredit(1, 3)),
    ("example: buffer 2", data(buffer(1, 2, 0, (8, [(3, b"h")])))),
    ("example: end of partition", data(F.BufferResponse(1, 3, 0, F.BufferKind.END_OF_PARTITION, 0, b""))),
]
#: the stored group of attempt 7 that "example: buffer 1" serves a part of (§14)
EXAMPLE_STORED = groups((7, [(4, b"fg"), (5, b"x")]))


# --------------------------------------------------------------------------- hand-packed inputs


def header(length: int, ftype: int, stream: int = 0, flags: int = 0, reserved: int = 0) -> bytes:
    return struct.pack(">IBBHI", length, ftype, flags, reserved, stream)


def frame(ftype: int, stream: int, body: bytes) -> bytes:
    return header(len(body), ftype, stream) + body


def packb(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def hello_body(magic: bytes = F.MAGIC, version: int = F.VERSION, role: int = F.Role.CLIENT) -> bytes:
    return struct.pack(">4sHBB", magic, version, role, 0) + packb({"name": "x"})


def buffer_response(stream: int, kind: int, payload: bytes) -> bytes:
    return buffer_response_crc(stream, kind, payload, 0)


def buffer_response_crc(stream: int, kind: int, payload: bytes, crc: int) -> bytes:
    fixed = struct.pack(">IIHHI", 0, 0, kind, 0, crc)
    return frame(F.FrameType.BUFFER_RESPONSE, stream, fixed + payload)


OPEN_FIELDS = {"app": "a", "shuffle": 1, "map_index": 0, "attempt": 1, "partitions": 2}
REQUEST_FIELDS = {"app": "a", "shuffle": 1, "start": 0, "end": 1, "locations": {"": [1]}}
P = ErrorCode.PROTOCOL


def request_with_resume(resume: Any, start: int = 0, end: int = 1) -> bytes:
    """A PartitionRequest for attempt 1 with this `resume` map, keys as given."""
    fields = {**REQUEST_FIELDS, "start": start, "end": end, "resume": resume}
    return frame(F.FrameType.PARTITION_REQUEST, 1, b"\0\0\0\2" + packb(fields))


#: (name, bytes, wire error code the receiver reports on stream 0, reason, detected only at end of input)
INVALID: list[tuple[str, bytes, int, str, bool]] = [
    ("unknown frame type", header(0, 0x07, 1), P, "0x07 is not a frame type", False),
    ("frame type 0", header(0, 0x00), P, "0x00 is not a frame type", False),
    ("nonzero flags", header(4, F.FrameType.ADD_CREDIT, 1, flags=0x01) + b"\0\0\0\1", P, "flags must be 0", False),
    (
        "nonzero header reserved field",
        header(4, F.FrameType.ADD_CREDIT, 1, reserved=0x0100) + b"\0\0\0\1",
        P,
        "the header's reserved u16 must be 0",
        False,
    ),
    ("AddCredit with credit 0", frame(F.FrameType.ADD_CREDIT, 1, b"\0\0\0\0"), P, "credit must be > 0", False),
    ("PushCredit with credit 0", frame(F.FrameType.PUSH_CREDIT, 1, b"\0\0\0\0"), P, "credit must be > 0", False),
    ("PushSlots naming no slot", frame(F.FrameType.PUSH_SLOTS, 1, b""), P, "one or more u32 slots", False),
    ("PushSlots of 6 bytes", frame(F.FrameType.PUSH_SLOTS, 1, b"\0\0\0\1\0\0"), P, "a whole number of u32s", False),
    ("PushPlaced naming no group", frame(F.FrameType.PUSH_PLACED, 1, b""), P, "one or more 16-byte entries", False),
    (
        "BufferPlaced naming no buffer",
        frame(F.FrameType.BUFFER_PLACED, 1, b""),
        P,
        "one or more 20-byte entries",
        False,
    ),
    (
        "BufferPlaced body of 16 bytes",
        frame(F.FrameType.BUFFER_PLACED, 1, b"\0" * 16),
        P,
        "a whole number of 20-byte entries",
        False,
    ),
    ("ReturnSlots naming no slot", frame(F.FrameType.RETURN_SLOTS, 0, b""), P, "one or more u32 slots", False),
    (
        "PushPlaced body of 12 bytes",
        frame(F.FrameType.PUSH_PLACED, 1, b"\0" * 12),
        P,
        "a whole number of 16-byte entries",
        False,
    ),
    (
        "PushPlaced body of 20 bytes",
        frame(F.FrameType.PUSH_PLACED, 1, b"\0" * 20),
        P,
        "a whole number of 16-byte entries",
        False,
    ),
    (
        "AddCredit body of 3 bytes",
        frame(F.FrameType.ADD_CREDIT, 1, b"\0\0\1"),
        P,
        "body must be exactly 4 bytes",
        False,
    ),
    (
        "CommitMapOutput body of 5 bytes",
        frame(F.FrameType.COMMIT_MAP_OUTPUT, 1, b"\0\0\0\0\1"),
        P,
        "body must be exactly 4 bytes",
        False,
    ),
    (
        "BufferResponse END_OF_PARTITION with a payload",
        buffer_response(1, F.BufferKind.END_OF_PARTITION, b"x"),
        P,
        "an event carries no payload",
        False,
    ),
    (
        "BufferResponse END_OF_PARTITION with a nonzero crc",
        buffer_response_crc(1, F.BufferKind.END_OF_PARTITION, b"", 1),
        P,
        "an event's crc is 0",
        False,
    ),
    (
        "AuthChallenge without a proof",
        frame(F.FrameType.AUTH_CHALLENGE, 0, packb({"nonce": ACCEPTOR_NONCE})),
        P,
        "nonce and proof are required strings",
        False,
    ),
    (
        "AuthResponse with a binary proof",
        frame(F.FrameType.AUTH_RESPONSE, 0, packb({"proof": b"\x01"})),
        P,
        "proof is a str, never bin",
        False,
    ),
    (
        "PartitionRequest with a non-string token",
        frame(F.FrameType.PARTITION_REQUEST, 1, b"\0\0\0\2" + packb({**REQUEST_FIELDS, "token": 5})),
        P,
        "token, when present, is a str",
        False,
    ),
    (
        "BufferResponse of unknown kind",
        buffer_response(1, 2, b""),
        P,
        "kind must be 0 (DATA) or 1 (END_OF_PARTITION)",
        False,
    ),
    ("Hello with bad magic", frame(F.FrameType.HELLO, 0, hello_body(magic=b"SHFE")), P, "magic must be SHFD", False),
    (
        "Hello version 2",
        frame(F.FrameType.HELLO, 0, hello_body(version=2)),
        ErrorCode.UNSUPPORTED_VERSION,
        "only version 3 is spoken (UnsupportedVersion)",
        False,
    ),
    (
        "Hello version 4",
        frame(F.FrameType.HELLO, 0, hello_body(version=4)),
        ErrorCode.UNSUPPORTED_VERSION,
        "only version 3 is spoken (UnsupportedVersion)",
        False,
    ),
    ("Hello with unknown role", frame(F.FrameType.HELLO, 0, hello_body(role=3)), P, "role must be 1 or 2", False),
    (
        "Hello without an info map",
        frame(F.FrameType.HELLO, 0, struct.pack(">4sHBB", F.MAGIC, F.VERSION, 1, 0)),
        P,
        "the info map is required (an empty one is 0x80)",
        False,
    ),
    (
        "Hello body shorter than its fixed part",
        frame(F.FrameType.HELLO, 0, b"SHFD\0"),
        P,
        "fixed part is 8 bytes",
        False,
    ),
    (
        "HelloAck whose info is an array",
        frame(F.FrameType.HELLO_ACK, 0, struct.pack(">4sHBB", F.MAGIC, F.VERSION, 2, 0) + packb(["node"])),
        P,
        "info must be a msgpack map",
        False,
    ),
    (
        "BufferResponse payload over the default limit",
        header(16 + F.DEFAULT_MAX_PAYLOAD + 1, F.FrameType.BUFFER_RESPONSE, 1) + struct.pack(">IIHHI", 0, 0, 0, 0, 0),
        P,
        "payload of 32769 bytes > 32768; rejected as soon as the header is read, before the payload",
        False,
    ),
    (
        "PushData payload over the default limit",
        header(8 + F.DEFAULT_MAX_PAYLOAD + 1, F.FrameType.PUSH_DATA, 1) + struct.pack(">II", 0, 0),
        P,
        "payload of 32769 bytes > 32768; rejected as soon as the header is read, before the payload",
        False,
    ),
    (
        "control body over 8 MiB",
        header(F.MAX_CONTROL_BODY + 1, F.FrameType.ADMIN_REQUEST, 1),
        P,
        "control bodies are at most 8388608 bytes; rejected as soon as the header is read",
        False,
    ),
    (
        "BufferResponse shorter than its fixed part",
        header(12, F.FrameType.BUFFER_RESPONSE, 1) + bytes(12),
        P,
        "length 12 < 16-byte fixed part",
        False,
    ),
    (
        "PushData shorter than its fixed part",
        header(4, F.FrameType.PUSH_DATA, 1) + bytes(4),
        P,
        "length 4 < 8-byte fixed part",
        False,
    ),
    ("Error body shorter than its code", frame(F.FrameType.ERROR, 0, b"\0"), P, "code is a u16", False),
    (
        "CommitAck body shorter than its count",
        frame(F.FrameType.COMMIT_ACK, 1, b"\0\0"),
        P,
        "count is a u32",
        False,
    ),
    (
        "CommitAck count does not match the body",
        frame(F.FrameType.COMMIT_ACK, 1, b"\0\0\0\2" + bytes(8)),
        P,
        "2 lengths need 4 + 16 bytes",
        False,
    ),
    (
        "PartitionRequest body shorter than its credit",
        frame(F.FrameType.PARTITION_REQUEST, 1, b"\0\0\2"),
        P,
        "credit is a u32",
        False,
    ),
    (
        "PartitionRequest without locations",
        frame(
            F.FrameType.PARTITION_REQUEST,
            1,
            b"\0\0\0\2" + packb({k: v for k, v in REQUEST_FIELDS.items() if k != "locations"}),
        ),
        P,
        "'locations' is required",
        False,
    ),
    (
        "PartitionRequest with a negative attempt id",
        frame(F.FrameType.PARTITION_REQUEST, 1, b"\0\0\0\2" + packb({**REQUEST_FIELDS, "locations": {"": [-1]}})),
        P,
        "attempt ids are u64: -1 (0xff) is not one",
        False,
    ),
    (
        "PartitionRequest with shuffle as a string",
        frame(F.FrameType.PARTITION_REQUEST, 1, b"\0\0\0\2" + packb({**REQUEST_FIELDS, "shuffle": "1"})),
        P,
        "'shuffle' must be an integer",
        False,
    ),
    (
        "OpenMapOutput with a boolean for an integer",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb({**OPEN_FIELDS, "shuffle": True})),
        P,
        "true is not an integer",
        False,
    ),
    (
        "OpenMapOutput with app as bin",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb({**OPEN_FIELDS, "app": b"a"})),
        P,
        "strings are msgpack str, never bin",
        False,
    ),
    (
        "OpenMapOutput whose body is an array",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb(list(OPEN_FIELDS.values()))),
        P,
        "control bodies are msgpack maps",
        False,
    ),
    (
        "OpenMapOutput with bytes after the map",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb(OPEN_FIELDS) + b"\xc0"),
        P,
        "the map must fill the body exactly",
        False,
    ),
    (
        "OpenMapOutput asking for 0 copies",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb({**OPEN_FIELDS, "replicas": 0})),
        P,
        "replicas, when present, is an integer in 1..4",
        False,
    ),
    (
        "OpenMapOutput asking for 5 copies",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb({**OPEN_FIELDS, "replicas": 5})),
        P,
        "replicas, when present, is an integer in 1..4",
        False,
    ),
    (
        "OpenMapOutput asking for an unknown durability",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb({**OPEN_FIELDS, "durability": "disk"})),
        P,
        "durability, when present, is none or object-store",
        False,
    ),
    (
        "OpenMapOutput asking for an fsync other than at commit",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb({**OPEN_FIELDS, "fsync": "always"})),
        P,
        "fsync, when present, is commit",
        False,
    ),
    (
        "OpenMapOutput with a number for durability",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb({**OPEN_FIELDS, "durability": 1})),
        P,
        "durability, when present, is none or object-store",
        False,
    ),
    (
        "OpenMapOutput with a boolean for replicas",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb({**OPEN_FIELDS, "replicas": True})),
        P,
        "true is not an integer",
        False,
    ),
    ("AdminRequest without op", frame(F.FrameType.ADMIN_REQUEST, 1, packb({"args": {}})), P, "'op' is required", False),
    (
        "AdminRequest with args not a map",
        frame(F.FrameType.ADMIN_REQUEST, 1, packb({"op": "stats", "args": []})),
        P,
        "'args' must be a map",
        False,
    ),
    ("Close with a body", frame(F.FrameType.CLOSE, 0, b"\0"), P, "Close has an empty body", False),
    (
        "CancelPartitionRequest with a body",
        frame(F.FrameType.CANCEL_PARTITION_REQUEST, 1, b"\0"),
        P,
        "CancelPartitionRequest has an empty body",
        False,
    ),
    (
        "input ends inside a frame",
        header(4, F.FrameType.ADD_CREDIT, 1) + b"\0\0",
        P,
        "a frame cut off by the end of the connection",
        True,
    ),
    (
        "input ends inside a header",
        header(4, F.FrameType.ADD_CREDIT, 1)[:7],
        P,
        "a header cut off by the end of the connection",
        True,
    ),
]

#: daemon-only keys a decoder must refuse (§15 `peer_vectors`): (name, bytes, code, reason, at_eof) as INVALID
PEER_INVALID: list[tuple[str, bytes, int, str, bool]] = [
    (
        "OpenMapOutput with an app_key in upper case",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb({**OPEN_FIELDS, "replica_of": "h:1", "app_key": APP_KEY.upper()})),
        P,
        'app_key is "" or 64 lowercase hex digits',
        False,
    ),
    (
        "OpenMapOutput with an app_key of 63 digits",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb({**OPEN_FIELDS, "replica_of": "h:1", "app_key": APP_KEY[:63]})),
        P,
        'app_key is "" or 64 lowercase hex digits',
        False,
    ),
    (
        "OpenMapOutput with replica_of as an integer",
        frame(F.FrameType.OPEN_MAP_OUTPUT, 1, packb({**OPEN_FIELDS, "replica_of": 1})),
        P,
        "replica_of, when present, is a str",
        False,
    ),
    (
        "PartitionRequest with resume as an array",
        frame(F.FrameType.PARTITION_REQUEST, 1, b"\0\0\0\2" + packb({**REQUEST_FIELDS, "resume": [[], 0]})),
        P,
        "resume is a map",
        False,
    ),
    (
        "PartitionRequest with resume without done",
        request_with_resume({"attempt": 1, "partition": 0, "bytes": 5}),
        P,
        "resume needs done",
        False,
    ),
    (
        "PartitionRequest with resume naming an attempt but no bytes",
        request_with_resume({"done": [], "attempt": 1, "partition": 0}),
        P,
        "attempt, partition and bytes come all three or not at all",
        False,
    ),
    (
        "PartitionRequest with resume and a negative attempt id in done",
        request_with_resume({"done": [-1]}),
        P,
        "done lists u64 attempt ids",
        False,
    ),
    (
        "PartitionRequest with resume at a partition beyond u32",
        request_with_resume({"done": [], "attempt": 1, "partition": U32_MAX + 1, "bytes": 0}),
        P,
        "resume.partition is a u32 like every partition",
        False,
    ),
    (
        "PartitionRequest with resume counting bytes as a string",
        request_with_resume({"done": [], "attempt": 1, "partition": 0, "bytes": "5"}),
        P,
        "resume.bytes is a u64",
        False,
    ),
    (
        "PartitionRequest with resume counting version 2 chunks",
        request_with_resume({"done": [], "attempt": 1, "partition": 0, "chunks": 2, "bytes": 5}),
        P,
        "resume has only the keys done, attempt, partition and bytes (version 2's chunks is gone)",
        False,
    ),
]

#: well-formed requests a daemon refuses on the stream, before any data (§10.6): (name, bytes, code, reason)
PEER_REFUSED: list[tuple[str, bytes, int, str]] = [
    (
        "resume with an attempt in done that the request does not name",
        request_with_resume({"done": [2]}),
        ErrorCode.INVALID_REQUEST,
        "done lists named attempts only",
    ),
    (
        "resume in an attempt the request does not name",
        request_with_resume({"done": [], "attempt": 2, "partition": 0, "bytes": 0}),
        ErrorCode.INVALID_REQUEST,
        "attempt is a named attempt",
    ),
    (
        "resume in an attempt it says is done",
        request_with_resume({"done": [1], "attempt": 1, "partition": 0, "bytes": 0}),
        ErrorCode.INVALID_REQUEST,
        "attempt is not among done",
    ),
    (
        "resume at a partition below the request's start",
        request_with_resume({"done": [], "attempt": 1, "partition": 1, "bytes": 0}, start=2, end=4),
        ErrorCode.INVALID_REQUEST,
        "start <= partition < end",
    ),
    (
        "resume at the request's end",
        request_with_resume({"done": [], "attempt": 1, "partition": 4, "bytes": 0}, start=2, end=4),
        ErrorCode.INVALID_REQUEST,
        "start <= partition < end",
    ),
]

#: inputs the encoder never produces but a decoder must accept: (name, bytes, frame they decode to)
DECODE_ONLY: list[tuple[str, bytes, F.Frame]] = [
    (
        "OpenMapOutput, keys in another order and an unknown key",
        frame(
            F.FrameType.OPEN_MAP_OUTPUT,
            8,
            packb({"partitions": 4, "attempt": 9, "compression": "lz4", "map_index": 2, "shuffle": 1, "app": "a"}),
        ),
        F.OpenMapOutput(writer=8, app="a", shuffle=1, map_index=2, attempt=9, partitions=4),
    ),
    (
        "PartitionRequest, integers in wider forms than needed",
        frame(
            F.FrameType.PARTITION_REQUEST,
            3,
            b"\0\0\0\2"
            + b"\x85\xa3app\xa1a"
            + b"\xa7shuffle\xcf\0\0\0\0\0\0\0\x07"  # uint64 7
            + b"\xa5start\xd0\x03"  # int8 3
            + b"\xa3end\xd1\0\x04"  # int16 4
            + b"\xa9locations\x81\xa0\x91\xce\0\0\0\x05",  # {"": [uint32 5]}
        ),
        F.PartitionRequest(receiver=3, credit=2, app="a", shuffle=7, start=3, end=4, locations={"": [5]}),
    ),
    (
        "AdminRequest without args",
        frame(F.FrameType.ADMIN_REQUEST, 4, packb({"op": "stats"})),
        F.AdminRequest(4, "stats", {}),
    ),
    (
        "PushData whose crc does not match its payload (decodes; the stream then fails with CORRUPT_DATA)",
        frame(F.FrameType.PUSH_DATA, 5, struct.pack(">II", 0, 0xDEADBEEF) + groups((1, [(1, b"abc")]))),
        F.PushData(writer=5, sequence=0, length=23, payload=groups((1, [(1, b"abc")])), crc=0xDEADBEEF),
    ),
]


# --------------------------------------------------------------------------- packed payloads (§3.3)

PUSH_CONTEXT: dict[str, Any] = {"attempt": 4711, "partitions": 200}
READ_CONTEXT: dict[str, Any] = {"start": 3, "end": 9, "attempts": [41, 42, U64_MAX]}
Payload = list[tuple[int, Runs]]

#: payloads of one stream, in order, and what they carry: (name, frame type, context, payloads)
PACKED_VALID: list[tuple[str, str, dict[str, Any], list[Payload]]] = [
    ("push: one run", "PUSH_DATA", PUSH_CONTEXT, [[(4711, [(7, b"seven")])]]),
    (
        "push: several runs, partitions with no data left out",
        "PUSH_DATA",
        PUSH_CONTEXT,
        [[(4711, [(0, b"a"), (2, b"bb"), (3, b"ccc"), (150, b"dddd")])]],
    ),
    (
        "push: a partition spanning two buffers",
        "PUSH_DATA",
        PUSH_CONTEXT,
        [[(4711, [(3, b"abc"), (4, b"de")])], [(4711, [(4, b"fg"), (6, b"h")])]],
    ),
    (
        "push: a partition spanning three buffers, all of the middle one",
        "PUSH_DATA",
        PUSH_CONTEXT,
        [[(4711, [(1, b"a"), (2, b"b1")])], [(4711, [(2, b"b2")])], [(4711, [(2, b"b3"), (5, b"c")])]],
    ),
    ("push: the map output's last partition", "PUSH_DATA", PUSH_CONTEXT, [[(4711, [(199, b"last")])]]),
    ("read: one group", "BUFFER_RESPONSE", READ_CONTEXT, [[(42, [(3, b"x")])]]),
    (
        "read: several groups in one payload",
        "BUFFER_RESPONSE",
        READ_CONTEXT,
        [[(41, [(3, b"a"), (8, b"b")]), (42, [(3, b"c")]), (U64_MAX, [(4, b"d"), (5, b"e")])]],
    ),
    (
        "read: pairs spanning payloads, at both ends of the range",
        "BUFFER_RESPONSE",
        READ_CONTEXT,
        [[(41, [(3, b"ab"), (8, b"cd")])], [(41, [(8, b"ef")]), (42, [(8, b"g")])], [(42, [(8, b"hi")])]],
    ),
]


def raw_group(attempt: int, entries: list[tuple[int, int]], data: bytes, count: int | None = None) -> bytes:
    """A group as given, right or wrong: its header says `count` runs (default: the entries given)."""
    flat = [v for entry in entries for v in entry]
    head = struct.pack(f">QI{len(flat)}I", attempt, len(entries) if count is None else count, *flat)
    return head + data


def malformed(attempt: int) -> list[tuple[str, bytes, str]]:
    """Payloads that break the rules every group follows, whichever frame carries them (§3.3)."""
    good = raw_group(attempt, [(5, 2)], b"ok")
    return [
        ("an empty payload", b"", "a payload holds at least one group"),
        ("shorter than a group header", good[:11], "a group has a 12-byte header"),
        ("count 0", raw_group(attempt, [], b""), "a group has at least one run"),
        (
            "a directory cut short",
            raw_group(attempt, [(4, 1)], b"", count=2) + b"\0\0\0\5",
            "2 runs need 16 bytes of directory",
        ),
        ("runs out of order", raw_group(attempt, [(6, 1), (5, 1)], b"ab"), "partitions strictly ascending"),
        ("two runs of one partition", raw_group(attempt, [(5, 1), (5, 1)], b"ab"), "partitions strictly ascending"),
        ("a run of length 0", raw_group(attempt, [(4, 0), (5, 1)], b"a"), "every run holds at least one byte"),
        ("lengths past the payload", raw_group(attempt, [(4, 1), (5, 4)], b"abc"), "runs hold 5 bytes, 3 follow"),
        ("trailing bytes", good + b"\0\0\0", "the payload ends where its last group ends"),
    ]


#: (name, frame type, context, payload, reason): each one fails where the context says
PACKED_INVALID: list[tuple[str, str, dict[str, Any], bytes, str]] = [
    *((f"push: {name}", "PUSH_DATA", PUSH_CONTEXT, raw, why) for name, raw, why in malformed(4711)),
    (
        "push: a partition equal to the map output's count",
        "PUSH_DATA",
        PUSH_CONTEXT,
        raw_group(4711, [(5, 1), (200, 1)], b"ab"),
        "partitions are below the map output's partitions (200)",
    ),
    (
        "push: another attempt's group",
        "PUSH_DATA",
        PUSH_CONTEXT,
        raw_group(4712, [(5, 1)], b"a"),
        "a push carries its own attempt's groups",
    ),
    (
        "push: two groups",
        "PUSH_DATA",
        PUSH_CONTEXT,
        raw_group(4711, [(5, 1)], b"a") + raw_group(4711, [(6, 1)], b"b"),
        "a PushData payload is exactly one group",
    ),
    *((f"read: {name}", "BUFFER_RESPONSE", READ_CONTEXT, raw, why) for name, raw, why in malformed(42)),
    (
        "read: a partition below the range",
        "BUFFER_RESPONSE",
        READ_CONTEXT,
        raw_group(42, [(2, 1), (3, 1)], b"ab"),
        "partitions within [start, end) = [3, 9)",
    ),
    (
        "read: a partition at the range's end",
        "BUFFER_RESPONSE",
        READ_CONTEXT,
        raw_group(42, [(8, 1), (9, 1)], b"ab"),
        "partitions within [start, end) = [3, 9)",
    ),
    (
        "read: an attempt the request did not name",
        "BUFFER_RESPONSE",
        READ_CONTEXT,
        raw_group(43, [(5, 1)], b"a"),
        "groups of the named attempts only",
    ),
    (
        "read: a malformed second group",
        "BUFFER_RESPONSE",
        READ_CONTEXT,
        raw_group(42, [(5, 1)], b"a") + raw_group(41, [], b""),
        "every group of a payload follows the rules",
    ),
]

#: where each frame's payload is checked and what a malformed one is there (§7.6, §7.10)
DETECTED = {"PUSH_DATA": ("daemon", ErrorCode.INVALID_REQUEST), "BUFFER_RESPONSE": ("reader", ErrorCode.PROTOCOL)}


def _runs_json(parts: Payload) -> list[dict[str, Any]]:
    return [
        {"attempt": attempt, "runs": [{"partition": p, "data_hex": d.hex()} for p, d in runs]}
        for attempt, runs in parts
    ]


def _pairs_json(payloads: list[Payload]) -> list[dict[str, Any]]:
    """Each pair's bytes: its runs concatenated in stream order, the pairs in the order they start."""
    pairs: dict[tuple[int, int], bytes] = {}
    for payload in payloads:
        for attempt, runs in payload:
            for p, d in runs:
                pairs[(p, attempt)] = pairs.get((p, attempt), b"") + d
    return [{"partition": p, "attempt": a, "data_hex": d.hex()} for (p, a), d in pairs.items()]


def _packed() -> dict[str, Any]:
    valid = [
        {
            "name": name,
            "frame": ftype,
            "context": context,
            "payloads": [{"hex": groups(*parts).hex(), "groups": _runs_json(parts)} for parts in payloads],
            "pairs": _pairs_json(payloads),
        }
        for name, ftype, context, payloads in PACKED_VALID
    ]
    invalid = [
        {
            "name": name,
            "frame": ftype,
            "context": context,
            "hex": raw.hex(),
            "code": int(DETECTED[ftype][1]),
            "detected_by": DETECTED[ftype][0],
            "reason": reason,
        }
        for name, ftype, context, raw, reason in PACKED_INVALID
    ]
    return {"valid": valid, "invalid": invalid, "compressed_runs": _compressed_runs()}


def _blocks(*pieces: bytes) -> bytes:
    """A run of one block per piece (§10.5), as the Python client writes them."""
    out = b""
    for piece in pieces:
        scratch = memoryview(bytearray(len(piece) + 5))
        out += bytes(scratch[: compress_block(memoryview(piece), scratch)])
    return out


def _compressed_runs() -> list[dict[str, Any]]:
    cases = [
        ("one block kept as it was", [b"not worth compressing"]),
        ("one LZ4 block", [b"key=value;" * 40]),
        ("an LZ4 block, then one kept as it was", [b"0123456789" * 30, b"tail"]),
    ]
    return [
        {"name": name, "run_hex": _blocks(*pieces).hex(), "data_hex": b"".join(pieces).hex()} for name, pieces in cases
    ]


def _vectors(frames: list[tuple[str, F.Frame]]) -> list[dict[str, Any]]:
    return [{"name": name, "frame": to_json(f), "hex": encode(f).hex()} for name, f in frames]


def _invalid(entries: list[tuple[str, bytes, int, str, bool]]) -> list[dict[str, Any]]:
    return [
        {"name": name, "hex": raw.hex(), "code": int(code), "reason": reason, "at_eof": at_eof}
        for name, raw, code, reason, at_eof in entries
    ]


def build() -> dict[str, Any]:
    vectors = _vectors(VALID + EXAMPLE)
    peer = {
        "vectors": _vectors(PEER),
        "invalid": _invalid(PEER_INVALID),
        "refused": [
            {"name": name, "hex": raw.hex(), "code": int(code), "reason": reason}
            for name, raw, code, reason in PEER_REFUSED
        ],
    }
    packed = _packed()
    names = [v["name"] for v in vectors + peer["vectors"] + peer["invalid"] + peer["refused"]]
    names += [v["name"] for v in packed["valid"] + packed["invalid"]]
    assert len(set(names)) == len(names), "vector names must be unique"
    return {
        "description": (
            "Golden vectors for the shuffled wire protocol, version 3 (see proto/PROTOCOL.md). "
            "'vectors': frames an encoder must produce byte for byte and a decoder must read back. "
            "'decode_only': inputs a decoder must accept that the reference encoder never writes. "
            "'invalid': inputs a decoder must reject; 'code' is the error code it reports on stream 0, "
            "'at_eof' marks inputs that are only wrong because the connection ends inside a frame. "
            "Decoders use the default payload limit, 32768 bytes. Integers may exceed 2^63-1 (u64). "
            "'packed': data payloads (packed groups, §3.3): 'valid' ones with the groups and the pairs they carry, "
            "'invalid' ones with the error the party that checks them ('detected_by') reports, and "
            "'compressed_runs' (§10.5). "
            "'auth': the proofs and the application token of PROTOCOL.md §6 for the given inputs (secrets as hex); "
            "'auth.drain': the drain_challenge and drain proofs of §13. "
            "'peer_vectors': 'vectors' and 'invalid' as above for what only daemons send each other (features, "
            "replica pushes, resumed reads), and 'refused': requests a daemon refuses on the stream; client "
            "implementations may skip them."
        ),
        "protocol_version": F.VERSION,
        "max_payload": F.DEFAULT_MAX_PAYLOAD,
        "vectors": vectors,
        "decode_only": [{"name": name, "frame": to_json(f), "hex": raw.hex()} for name, raw, f in DECODE_ONLY],
        "invalid": _invalid(INVALID),
        "packed": packed,
        "peer_vectors": peer,
        "auth": {
            "secret_hex": AUTH_SECRET.hex(),
            "dialer_nonce": DIALER_NONCE,
            "acceptor_nonce": ACCEPTOR_NONCE,
            "acceptor_proof": ACCEPTOR_PROOF,
            "dialer_proof": DIALER_PROOF,
            "app_secret_hex": APP_SECRET.hex(),
            "app": AUTH_APP,
            "app_token": APP_TOKEN,
            "drain": {
                "peer_secret_hex": PEER_SECRET.hex(),
                "caller_nonce": DIALER_NONCE,
                "daemon_nonce": ACCEPTOR_NONCE,
                "node": DRAIN_NODE,
                "client": DRAIN_CLIENT,
                "challenge_proof": DRAIN_CHALLENGE_PROOF,
                "handoff": True,
                "timeout": 60,
                "drain_proof": DRAIN_PROOF,
            },
        },
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print("frames.json is up to date" if same else "frames.json differs from what generate.py builds")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
