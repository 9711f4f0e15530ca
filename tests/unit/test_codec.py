"""Codec properties: round trips, any split of the input, truncation, garbage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import get_args

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shuffled.buffers.pool import SLACK
from shuffled.protocol import frames as F
from shuffled.protocol.codec import FrameReader, PayloadSink, decode_all, encode
from shuffled.protocol.errors import ErrorCode, ProtocolError, ShuffledError
from shuffled.protocol.integrity import checksum
from shuffled.protocol.resume import Resume

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
small = st.integers(0, 2**31 - 1)
text = st.text(max_size=20)
payload = st.binary(max_size=300)
attempt_ids = st.lists(u64, max_size=4)
#: a failed-over read's resume point (§10.6): with or without a pair in progress
resume = st.builds(Resume, done=attempt_ids.map(tuple)) | st.builds(
    Resume, done=attempt_ids.map(tuple), attempt=u64, partition=u32, bytes=u64
)
app_key = st.just("") | st.text("0123456789abcdef", min_size=64, max_size=64)

frames = st.one_of(
    st.builds(F.Hello, role=st.sampled_from(F.Role), info=st.dictionaries(st.sampled_from(["node", "name"]), text)),
    st.builds(F.HelloAck, role=st.sampled_from(F.Role), info=st.dictionaries(st.sampled_from(["node"]), text)),
    st.builds(F.ErrorResponse, stream=u32, code=st.integers(0, 65535), message=text),
    st.builds(F.Close),
    st.builds(F.AuthChallenge, nonce=text, proof=text),
    st.builds(F.AuthResponse, proof=text),
    st.builds(
        F.PartitionRequest,
        receiver=u32,
        credit=u32,
        app=text,
        shuffle=small,
        start=small,
        end=small,
        locations=st.dictionaries(text, st.lists(u64, max_size=5), max_size=3),
        token=st.none() | text,
        resume=st.none() | resume,
    ),
    st.builds(F.AddCredit, receiver=u32, credit=st.integers(1, 2**32 - 1)),
    st.builds(
        F.BufferResponse,
        receiver=u32,
        sequence=u32,
        backlog=u32,
        kind=st.just(F.BufferKind.DATA),
        length=st.just(0),
        payload=payload,
    ),
    st.builds(F.CancelPartitionRequest, receiver=u32),
    st.builds(
        F.OpenMapOutput,
        writer=u32,
        app=text,
        shuffle=small,
        map_index=small,
        attempt=small,
        partitions=small,
        token=st.none() | text,
        replicas=st.none() | st.integers(1, F.MAX_REPLICAS),
        replica_of=st.none() | text,
        app_key=st.none() | app_key,
    ),
    st.builds(F.PushCredit, writer=u32, credit=st.integers(1, 2**32 - 1)),
    st.builds(F.PushData, writer=u32, sequence=u32, length=st.just(0), payload=payload),
    st.builds(F.CommitMapOutput, writer=u32, pushes=u32),
    st.builds(F.CommitAck, writer=u32, lengths=st.lists(u64, max_size=6)),
    st.builds(F.AbortMapOutput, writer=u32),
    st.builds(F.AbortAck, writer=u32),
    st.builds(F.AdminRequest, request=u32, op=text, args=st.dictionaries(text, st.integers(0, 1000), max_size=3)),
    st.builds(F.AdminResponse, request=u32, result=st.dictionaries(text, st.integers(0, 1000), max_size=3)),
)


def _normalise(frame: F.Frame) -> F.Frame:
    """Data frames decode with length set, the payload as bytes and the CRC32C the encoder computed."""
    if isinstance(frame, F.BufferResponse | F.PushData):
        frame.payload = bytes(frame.payload or b"")
        frame.length = len(frame.payload)
        frame.crc = checksum(frame.payload)
    return frame


def _decode(data: bytes, splits: list[int] | None = None, slack: int = 0) -> list[F.Frame]:
    """Feed the reader in pieces of the given sizes (cycled); payload destinations have `slack` scratch
    bytes after them, as pool segments do, which the reader may fill with the next frame's start."""

    def sink(ftype: F.FrameType, stream: int, length: int) -> tuple[memoryview, memoryview]:
        room = memoryview(bytearray(length + slack))
        return room, room[:length]

    reader = FrameReader(sink, max_payload=1 << 16)
    out: list[F.Frame] = []
    pos, i = 0, 0
    while pos < len(data):
        target = reader.get_buffer()
        step = splits[i % len(splits)] if splits else len(target)
        i += 1
        n = min(len(target), len(data) - pos, max(1, step))
        target[:n] = data[pos : pos + n]
        pos += n
        out.extend(reader.buffer_updated(n))
    assert not reader.pending_bytes()
    for f in out:
        if isinstance(f, F.BufferResponse | F.PushData):
            f.payload = bytes(f.payload)  # the payload's own bytes only, never the scratch after them
    return out


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(frames, min_size=1, max_size=8),
    st.lists(st.integers(1, 70), min_size=1, max_size=5),
    st.sampled_from([0, 1, 13, 64, 200]),
)
def test_round_trip_in_any_split(batch: list[F.Frame], splits: list[int], slack: int) -> None:
    expected = [_normalise(f) for f in batch]
    data = b"".join(encode(f) for f in expected)
    assert _decode(data, splits, slack) == expected


def test_one_read_per_data_frame_when_payloads_have_slack() -> None:
    """With the pool's slack after each segment, the read that finishes a payload also takes the next
    frame's header, so a busy stream costs one socket read per 32 KiB frame instead of two."""
    payload = bytes(range(256)) * 128
    data = b"".join(encode(F.BufferResponse(1, i, 9 - i, F.BufferKind.DATA, 0, payload)) for i in range(10))

    def sink_with(slack: int) -> PayloadSink:
        def sink(ftype: F.FrameType, stream: int, length: int) -> tuple[memoryview, None]:
            return memoryview(bytearray(length + slack)), None

        return sink

    for slack, most_reads in ((SLACK, 11), (0, 20)):
        reader = FrameReader(sink_with(slack), max_payload=len(payload))
        reads, pos, got = 0, 0, 0
        while pos < len(data):  # the socket always has more than the reader asks for
            target = reader.get_buffer()
            n = min(len(target), len(data) - pos)
            target[:n] = data[pos : pos + n]
            pos += n
            reads += 1
            got += len(reader.buffer_updated(n))
        assert got == 10 and reads <= most_reads, (slack, reads)


@settings(max_examples=200)
@given(frames)
def test_truncated_input_never_yields_a_partial_frame(frame: F.Frame) -> None:
    data = encode(_normalise(frame))
    for cut in range(1, len(data)):
        with pytest.raises(ProtocolError):
            decode_all(data[:cut])


@settings(max_examples=1500)
@given(st.binary(min_size=0, max_size=200))
def test_garbage_raises_only_shuffled_errors(data: bytes) -> None:
    try:
        decode_all(data)
    except ShuffledError:
        pass


@settings(max_examples=800)
@given(frames, st.data())
def test_mutated_frames_raise_only_shuffled_errors(frame: F.Frame, data: st.DataObject) -> None:
    raw = bytearray(encode(_normalise(frame)))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    try:
        decode_all(bytes(raw))
    except ShuffledError:
        pass


OPEN = {"app": "a", "shuffle": 1, "map_index": 0, "attempt": 1, "partitions": 2}
REQUEST = {"app": "a", "shuffle": 1, "start": 0, "end": 1, "locations": {"": [1]}}


def _open_body(**keys: object) -> bytes:
    body: bytes = msgpack.packb({**OPEN, **keys})
    return encode(F.OpenMapOutput(1, "a", 1, 0, 1, 2))[:12] + body


def _request_body(**keys: object) -> bytes:
    body: bytes = msgpack.packb({**REQUEST, **keys})
    return encode(F.PartitionRequest(1, 2, "a", 1, 0, 1, {"": [1]}))[:16] + body


def _framed(partial: bytes) -> bytes:
    """Header with the right length for a hand-packed body (the header above came from a shorter one)."""
    return (len(partial) - 12).to_bytes(4, "big") + partial[4:]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (_open_body(replicas=0), "replicas"),
        (_open_body(replicas=F.MAX_REPLICAS + 1), "replicas"),
        (_open_body(replicas=True), "replicas"),
        (_open_body(replicas="2"), "replicas"),
        (_open_body(replica_of=7), "replica_of"),
        (_open_body(app_key="A" * 64), "app_key"),
        (_open_body(app_key="0" * 63), "app_key"),
        (_open_body(app_key="0" * 65), "app_key"),
        (_open_body(app_key=b"\0" * 32), "app_key"),
        (_request_body(resume=[]), "resume"),
        (_request_body(resume={"attempt": 1, "partition": 0, "bytes": 0}), "resume"),
        (_request_body(resume={"done": [True]}), "resume"),
        (_request_body(resume={"done": [-1]}), "resume"),
        (_request_body(resume={"done": [], "attempt": 1}), "resume"),
        (_request_body(resume={"done": [], "attempt": 1, "partition": -1, "bytes": 0}), "resume"),
        (_request_body(resume={"done": [], "attempt": 1, "partition": 2**32, "bytes": 0}), "resume"),
        (_request_body(resume={"done": [], "attempt": 1, "partition": 0, "bytes": None}), "resume"),
        (_request_body(resume={"done": [], "attempt": 1, "partition": 0, "bytes": 3, "x": 0}), "resume"),
        (_request_body(resume={"done": [], "attempt": 1, "partition": 0, "chunks": 2, "bytes": 3}), "resume"),
    ],
)
def test_new_optional_keys_are_checked_on_decode(body: bytes, why: str) -> None:
    """Replication's keys (§7.4, §7.8) are refused as PROTOCOL when malformed, like every other frame field."""
    with pytest.raises(ProtocolError, match=why) as info:
        decode_all(_framed(body))
    assert info.value.code == ErrorCode.PROTOCOL


def test_new_optional_keys_stay_off_the_wire_when_unset() -> None:
    """A frame without them is the plain frame: clients that never set them send the bytes they always did."""
    plain = encode(F.OpenMapOutput(1, "a", 1, 0, 1, 2, token="t"))
    assert b"replica" not in plain and b"app_key" not in plain
    assert b"resume" not in encode(F.PartitionRequest(1, 2, "a", 1, 0, 1, {"": [1]}, token="t"))
    both = encode(F.OpenMapOutput(1, "a", 1, 0, 1, 2, token="t", replicas=2))
    assert both.index(b"token") < both.index(b"replicas"), "replicas follows token on the wire (§7.8)"


def test_payload_over_limit_is_refused() -> None:
    data = encode(F.PushData(1, 0, 0, b"x" * 100))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode_all(data, max_payload=99)


def test_payload_lands_in_sink_memory_without_copy_of_the_bulk() -> None:
    """Most of a large payload is read straight into the sink's buffer, not the staging area."""
    segment = bytearray(32768)
    calls = []

    def sink(ftype: F.FrameType, stream: int, length: int) -> tuple[memoryview, str]:
        return memoryview(segment)[:length], "seg"

    reader = FrameReader(sink, max_payload=32768)
    data = encode(F.BufferResponse(7, 0, 0, F.BufferKind.DATA, 0, b"\xab" * 32768))
    pos = 0
    frames_out: list[F.Frame] = []
    while pos < len(data):
        target = reader.get_buffer()
        calls.append(len(target))
        n = min(len(target), len(data) - pos)
        target[:n] = data[pos : pos + n]
        pos += n
        frames_out.extend(reader.buffer_updated(n))
    assert len(frames_out) == 1 and frames_out[0].payload == "seg"  # type: ignore[union-attr]
    assert segment == b"\xab" * 32768
    assert max(calls) >= 32000, "the bulk of the payload must be read directly into the segment"


def test_protocol_package_imports_no_asyncio() -> None:
    """The sans-IO core stays free of IO: importing any module of it must not pull in asyncio.

    The codec, the frames and the state machines stay free of sockets too (integrity's crc32c
    package imports socket, so the codec loads it only when a CRC is to be computed).
    """
    code = (
        "import importlib, pkgutil, sys\n"
        "import shuffled.protocol.codec, shuffled.protocol.credit, shuffled.protocol.errors, shuffled.protocol.frames\n"
        "print([m for m in ('asyncio', 'socket', 'uvloop', 'selectors') if m in sys.modules])\n"
        "import shuffled.protocol as package\n"
        "names = [m.name for m in pkgutil.iter_modules(package.__path__)]\n"
        "for name in names:\n"
        "    importlib.import_module('shuffled.protocol.' + name)\n"
        "print(names, [m for m in ('asyncio', 'uvloop') if m in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    core, every = result.stdout.splitlines()
    assert core == "[]", core
    assert every.endswith(" []") and "'frames'" in every, every
    for path in (Path(__file__).parents[2] / "shuffled" / "protocol").glob("*.py"):
        source = path.read_text()
        assert "import asyncio" not in source and "from asyncio" not in source, path


def test_registry_has_one_class_per_frame_type() -> None:
    """Encode and decode dispatch through FRAME_CLASSES: a FrameType without a class there could not be sent."""
    classes = get_args(F.Frame)
    assert len(set(classes)) == len(classes)
    assert set(F.FRAME_CLASSES) == set(F.FrameType)
    assert all(F.FRAME_CLASSES[cls.TYPE] is cls for cls in classes)
