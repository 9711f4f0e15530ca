"""Golden wire-format vectors (proto/vectors/frames.json) against the Python codec.

The JSON file is the source of truth: a failure here means the codec's bytes changed.
If that was deliberate, update proto/PROTOCOL.md, regenerate the file with
proto/vectors/generate.py and review the diff.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from pathlib import Path
from typing import Any

import pytest

from shuffled.protocol import frames as F
from shuffled.protocol.auth import acceptor_proof, app_token, dialer_proof, drain_challenge_proof, drain_proof
from shuffled.protocol.codec import FrameReader, decode_all, encode
from shuffled.protocol.compression import decompress_run
from shuffled.protocol.credit import DEFAULT_FLOATING, ChannelCredit, FloatingPool, OutboundStream
from shuffled.protocol.errors import ErrorCode, InvalidRequest, ProtocolError, ShuffledError
from shuffled.protocol.packed import Directory, check_push, directory, group_bytes, read_payload, slice_group, walk
from shuffled.protocol.resume import Resume

PROTO = Path(__file__).parents[2] / "proto"
DOC = PROTO / "PROTOCOL.md"
with (PROTO / "vectors" / "frames.json").open(encoding="utf-8") as _f:
    VECTORS: dict[str, Any] = json.load(_f)

VALID: list[dict[str, Any]] = VECTORS["vectors"]
DECODE_ONLY: list[dict[str, Any]] = VECTORS["decode_only"]
INVALID: list[dict[str, Any]] = VECTORS["invalid"]
#: what only daemons send each other (§15): the reference codec is a daemon's, so it must hold all of these too
PEER_VALID: list[dict[str, Any]] = VECTORS["peer_vectors"]["vectors"]
PEER_INVALID: list[dict[str, Any]] = VECTORS["peer_vectors"]["invalid"]
PEER_REFUSED: list[dict[str, Any]] = VECTORS["peer_vectors"]["refused"]
PACKED_VALID: list[dict[str, Any]] = VECTORS["packed"]["valid"]
PACKED_INVALID: list[dict[str, Any]] = VECTORS["packed"]["invalid"]
ALL_VALID = VALID + PEER_VALID
ALL_INVALID = INVALID + PEER_INVALID
MAX_PAYLOAD: int = VECTORS["max_payload"]


def build(fields: dict[str, Any]) -> F.Frame:
    """The frame a vector's JSON object describes, as the decoder returns it (payloads as bytearray)."""
    kwargs = dict(fields)
    ftype = F.FrameType[kwargs.pop("type")]
    if "role" in kwargs:
        kwargs["role"] = F.Role[kwargs["role"]]
    if "resume" in kwargs:
        kwargs["resume"] = Resume.from_wire(kwargs["resume"])
    if "kind" in kwargs:
        kwargs["kind"] = F.BufferKind[kwargs["kind"]]
    if "payload_hex" in kwargs:
        payload = bytearray.fromhex(kwargs.pop("payload_hex"))
        kwargs["length"] = len(payload)
        # the decoder hands events over without a payload object
        kwargs["payload"] = None if kwargs.get("kind") is F.BufferKind.END_OF_PARTITION else payload
    frame: F.Frame = F.FRAME_CLASSES[ftype](**kwargs)
    return frame


def feed(data: bytes, step: int = 1) -> tuple[list[F.Frame], FrameReader]:
    """Decode `data` handing the reader at most `step` bytes at a time."""

    def sink(ftype: F.FrameType, stream: int, length: int) -> tuple[memoryview, bytearray]:
        buf = bytearray(length)
        return memoryview(buf), buf

    reader = FrameReader(sink, max_payload=MAX_PAYLOAD)
    out: list[F.Frame] = []
    pos = 0
    while pos < len(data):
        target = reader.get_buffer()
        n = min(step, len(target), len(data) - pos)
        target[:n] = data[pos : pos + n]
        pos += n
        out.extend(reader.buffer_updated(n))
    return out, reader


def _ids(entries: list[dict[str, Any]]) -> list[str]:
    return [e["name"] for e in entries]


def test_auth_example_matches_the_reference_computation() -> None:
    """The proofs and token in the vectors are what §6 says: HMAC-SHA256 under the labels, over the nonces/app."""
    a = VECTORS["auth"]
    secret, app_secret = bytes.fromhex(a["secret_hex"]), bytes.fromhex(a["app_secret_hex"])
    assert acceptor_proof(secret, a["dialer_nonce"], a["acceptor_nonce"]) == a["acceptor_proof"]
    assert dialer_proof(secret, a["dialer_nonce"], a["acceptor_nonce"]) == a["dialer_proof"]
    assert a["acceptor_proof"] != a["dialer_proof"]  # a proof cannot be reflected back to its sender
    assert app_token(app_secret, a["app"]) == a["app_token"]
    message = b"shuffled-v2 dialer\n" + a["dialer_nonce"].encode() + b"\n" + a["acceptor_nonce"].encode()
    assert hmac.new(secret, message, hashlib.sha256).hexdigest() == a["dialer_proof"]


def test_drain_example_matches_the_spelled_out_computation() -> None:
    """The drain proofs of §13: HMAC-SHA256 under the peer secret of the bytes the spec lists."""
    d = VECTORS["auth"]["drain"]
    secret = bytes.fromhex(d["peer_secret_hex"])
    fields = [d["caller_nonce"], d["daemon_nonce"], d["node"], d["client"]]
    challenge = b"shuffled-v2 drain challenge\n" + "\n".join(fields).encode()
    assert hmac.new(secret, challenge, hashlib.sha256).hexdigest() == d["challenge_proof"]
    assert drain_challenge_proof(secret, *fields) == d["challenge_proof"]
    args = [d["caller_nonce"], d["daemon_nonce"], "true" if d["handoff"] else "false", str(d["timeout"])]
    drain = b"shuffled-v2 drain\n" + "\n".join(args).encode()
    assert hmac.new(secret, drain, hashlib.sha256).hexdigest() == d["drain_proof"]
    assert drain_proof(secret, d["caller_nonce"], d["daemon_nonce"], d["handoff"], d["timeout"]) == d["drain_proof"]


def test_vector_file_shape() -> None:
    assert VECTORS["protocol_version"] == F.VERSION
    assert MAX_PAYLOAD == F.DEFAULT_MAX_PAYLOAD
    names = _ids(ALL_VALID) + _ids(DECODE_ONLY) + _ids(ALL_INVALID) + _ids(PEER_REFUSED)
    names += _ids(PACKED_VALID) + _ids(PACKED_INVALID)
    assert len(names) == len(set(names)), "vector names must be unique"
    for entry in ALL_VALID + DECODE_ONLY + ALL_INVALID + PEER_REFUSED:
        assert re.fullmatch(r"(?:[0-9a-f]{2})+", entry["hex"]), entry["name"]


@pytest.mark.parametrize("vector", ALL_VALID, ids=_ids(ALL_VALID))
def test_encode_matches_hex(vector: dict[str, Any]) -> None:
    assert encode(build(vector["frame"])).hex() == vector["hex"]


@pytest.mark.parametrize("vector", ALL_VALID + DECODE_ONLY, ids=_ids(ALL_VALID + DECODE_ONLY))
def test_decode_matches_fields(vector: dict[str, Any]) -> None:
    frames = decode_all(bytes.fromhex(vector["hex"]), max_payload=MAX_PAYLOAD)
    assert frames == [build(vector["frame"])]


@pytest.mark.parametrize("vector", ALL_VALID + DECODE_ONLY, ids=_ids(ALL_VALID + DECODE_ONLY))
def test_decode_one_byte_at_a_time(vector: dict[str, Any]) -> None:
    frames, reader = feed(bytes.fromhex(vector["hex"]))
    assert frames == [build(vector["frame"])]
    assert not reader.pending_bytes()


def test_all_vectors_back_to_back_one_byte_at_a_time() -> None:
    stream = b"".join(bytes.fromhex(v["hex"]) for v in VALID)
    frames, reader = feed(stream)
    assert frames == [build(v["frame"]) for v in VALID]
    assert not reader.pending_bytes()


@pytest.mark.parametrize("entry", ALL_INVALID, ids=_ids(ALL_INVALID))
def test_invalid_is_rejected(entry: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_all(bytes.fromhex(entry["hex"]), max_payload=MAX_PAYLOAD)
    assert info.value.code == entry["code"], info.value.message


@pytest.mark.parametrize("entry", ALL_INVALID, ids=_ids(ALL_INVALID))
def test_invalid_is_rejected_from_the_bytes_alone(entry: dict[str, Any]) -> None:
    """Apart from inputs cut off by the end of the connection, the bytes themselves are refused while reading."""
    data = bytes.fromhex(entry["hex"])
    if entry["at_eof"]:
        frames, reader = feed(data)
        assert frames == [] and reader.pending_bytes()
        return
    with pytest.raises(ProtocolError) as info:
        feed(data)
    assert info.value.code == entry["code"], info.value.message


def test_every_frame_type_has_a_vector() -> None:
    covered = {v["frame"]["type"] for v in VALID}
    missing = [t.name for t in F.FrameType if t.name not in covered]
    assert not missing, f"frame types without a golden vector: {missing}"


# --------------------------------------------------------------------------- packed payloads (§3.3)


def _groups_json(groups: list[Directory], payload: bytes) -> list[dict[str, Any]]:
    return [
        {"attempt": d.attempt, "runs": [{"partition": p, "data_hex": payload[a:b].hex()} for p, a, b in d.runs()]}
        for d in groups
    ]


def _check_payload(entry: dict[str, Any], payload: bytes) -> list[Directory]:
    """What the party that checks this frame's payloads makes of it (§7.6, §7.10)."""
    context = entry["context"]
    if entry["frame"] == "PUSH_DATA":
        check_push(payload, context["attempt"], context["partitions"])
        return [directory(payload)]
    return read_payload(payload, context["start"], context["end"], set(context["attempts"]))


@pytest.mark.parametrize("entry", PACKED_VALID, ids=_ids(PACKED_VALID))
def test_packed_payloads_encode_and_read_back(entry: dict[str, Any]) -> None:
    """Packing each payload's runs gives its bytes; checking it gives its groups; the runs give the pairs."""
    pairs: dict[tuple[int, int], bytes] = {}
    for payload_entry in entry["payloads"]:
        payload = bytes.fromhex(payload_entry["hex"])
        groups = payload_entry["groups"]
        packed = b"".join(
            group_bytes(g["attempt"], [(r["partition"], bytes.fromhex(r["data_hex"])) for r in g["runs"]])
            for g in groups
        )
        assert packed == payload
        parsed = _check_payload(entry, payload)
        assert _groups_json(parsed, payload) == groups
        for d in parsed:
            for p, a, b in d.runs():
                pairs[(p, d.attempt)] = pairs.get((p, d.attempt), b"") + payload[a:b]
    assert [{"partition": p, "attempt": a, "data_hex": d.hex()} for (p, a), d in pairs.items()] == entry["pairs"]


@pytest.mark.parametrize("entry", PACKED_INVALID, ids=_ids(PACKED_INVALID))
def test_malformed_packed_payloads_are_refused_where_they_are_checked(entry: dict[str, Any]) -> None:
    """A daemon refuses a PushData's group with INVALID_REQUEST on the stream, a reader a BufferResponse's
    with PROTOCOL; the frame around it decodes (the codec does not look inside payloads)."""
    expected = InvalidRequest if entry["detected_by"] == "daemon" else ProtocolError
    assert {"daemon": "PUSH_DATA", "reader": "BUFFER_RESPONSE"}[entry["detected_by"]] == entry["frame"]
    with pytest.raises(ShuffledError) as info:
        _check_payload(entry, bytes.fromhex(entry["hex"]))
    assert type(info.value) is expected and info.value.code == entry["code"], info.value.message


def test_packed_vectors_cover_every_rule_at_both_layers() -> None:
    names = {e["name"] for e in PACKED_INVALID}
    for rule in (
        "an empty payload",
        "shorter than a group header",
        "count 0",
        "a directory cut short",
        "runs out of order",
        "two runs of one partition",
        "a run of length 0",
        "lengths past the payload",
        "trailing bytes",
    ):
        assert {f"push: {rule}", f"read: {rule}"} <= names, rule
    assert {e["code"] for e in PACKED_INVALID} == {ErrorCode.INVALID_REQUEST, ErrorCode.PROTOCOL}
    assert any(len(e["payloads"]) == 3 for e in PACKED_VALID), "a partition spanning several buffers"
    assert any(len(p["groups"]) > 1 for e in PACKED_VALID for p in e["payloads"]), "several groups in a payload"


@pytest.mark.parametrize("vector", ALL_VALID + DECODE_ONLY, ids=_ids(ALL_VALID + DECODE_ONLY))
def test_every_data_frame_vector_carries_packed_groups(vector: dict[str, Any]) -> None:
    frame = vector["frame"]
    payload = bytes.fromhex(frame.get("payload_hex", ""))
    if frame["type"] == "PUSH_DATA":
        check_push(payload, int.from_bytes(payload[:8], "big"), 1 << 24)
    elif frame["type"] == "BUFFER_RESPONSE" and frame["kind"] == "DATA":
        assert read_payload(payload, 0, 1 << 32, {attempt for attempt, *_ in walk(payload)})


def test_the_worked_example_serves_part_of_a_stored_group() -> None:
    """§14's buffer 1 is the part of attempt 7's second group in the range [3, 5): a new header, the
    directory's slice and the data's slice."""
    stored = group_bytes(7, [(4, b"fg"), (5, b"x")])
    part = slice_group(memoryview(stored), 3, 5)
    assert part is not None
    by_name = {v["name"]: v["frame"] for v in VALID}
    assert b"".join(bytes(p) for p in part.parts).hex() == by_name["example: buffer 1"]["payload_hex"]


@pytest.mark.parametrize("entry", VECTORS["packed"]["compressed_runs"], ids=lambda e: e["name"])
def test_compressed_runs_decompress_to_their_data(entry: dict[str, Any]) -> None:
    assert bytes(decompress_run(memoryview(bytes.fromhex(entry["run_hex"])))) == bytes.fromhex(entry["data_hex"])


# --------------------------------------------------------------------------- resume (§10.6)


def _resumed(vector: dict[str, Any]) -> tuple[F.PartitionRequest, Resume]:
    (request,) = decode_all(bytes.fromhex(vector["hex"]))
    assert isinstance(request, F.PartitionRequest) and request.resume is not None
    return request, request.resume


def _named(request: F.PartitionRequest) -> set[int]:
    return {a for attempts in request.locations.values() for a in attempts}


@pytest.mark.parametrize("vector", [v for v in PEER_VALID if "resume" in v["frame"]], ids=lambda v: v["name"])
def test_resume_vectors_fit_their_requests(vector: dict[str, Any]) -> None:
    request, resume = _resumed(vector)
    resume.check(request.start, request.end, _named(request))
    assert resume.to_wire() == vector["frame"]["resume"]


@pytest.mark.parametrize("entry", PEER_REFUSED, ids=_ids(PEER_REFUSED))
def test_resume_points_that_do_not_fit_their_request_are_refused(entry: dict[str, Any]) -> None:
    request, resume = _resumed(entry)
    with pytest.raises(InvalidRequest) as info:
        resume.check(request.start, request.end, _named(request))
    assert info.value.code == entry["code"]


def test_client_vectors_carry_no_daemon_only_key() -> None:
    """A client implementation may skip `peer_vectors`, so nothing it must encode or refuse needs a daemon's keys."""
    daemon_only = {"replica_of", "app_key", "resume"}
    for v in VALID + DECODE_ONLY:
        frame = v["frame"]
        assert not daemon_only & (set(frame) | set(frame.get("info", {}))), v["name"]
        features = set(frame.get("info", {}).get("features", []))
        assert features <= {F.SHM, F.SHM_READ}, f"{v['name']}: a client offers shared memory, nothing else"
    for v in PEER_VALID:
        frame = v["frame"]
        keys = set(frame) | set(frame.get("info", {}))
        assert daemon_only & keys or F.REPLICA in frame.get("info", {}).get("features", []), v["name"]
    assert any(v["frame"].get("replicas") for v in VALID), "the client key replicas has a client vector"


def test_vectors_cover_both_buffer_kinds_and_roles() -> None:
    kinds = {v["frame"].get("kind") for v in VALID}
    roles = {v["frame"].get("role") for v in VALID}
    assert {k.name for k in F.BufferKind} <= kinds
    assert {r.name for r in F.Role} <= roles


# --------------------------------------------------------------------------- the worked example in PROTOCOL.md


def _doc_example() -> list[tuple[str, str]]:
    """(vector name, hex) of each frame in PROTOCOL.md's worked example block."""
    text = DOC.read_text(encoding="utf-8")
    block = text.split("<!-- worked-example:begin -->", 1)[1].split("<!-- worked-example:end -->", 1)[0]
    out: list[tuple[str, str]] = []
    for line in block.splitlines():
        m = re.match(r"^(?:C->D|D->C)\s+\S.*?\s{2,}\[(example: [^\]]+)\]$", line)
        if m:
            out.append((m.group(1), ""))
        elif out and re.fullmatch(r"\s+[0-9a-f ]+", line):
            out[-1] = (out[-1][0], out[-1][1] + line.replace(" ", ""))
    return out


def test_worked_example_in_the_spec_matches_the_vectors() -> None:
    by_name = {v["name"]: v["hex"] for v in VALID}
    example = _doc_example()
    assert [name for name, _ in example] == [n for n in by_name if n.startswith("example:")]
    for name, hexed in example:
        assert hexed == by_name[name], name


def test_worked_example_follows_the_credit_rules() -> None:
    """The example's numbers are what the reference credit state machines produce."""
    frames = {v["name"]: build(v["frame"]) for v in VALID if v["name"].startswith("example:")}
    request = frames["example: PartitionRequest"]
    assert isinstance(request, F.PartitionRequest)
    sender: OutboundStream[str] = OutboundStream(request.receiver, request.credit)
    for name in ("example: buffer 0", "example: buffer 1", "example: buffer 2"):
        sender.push_data(name)
    sender.push_event("example: end of partition")
    receiver = ChannelCredit(request.credit, FloatingPool(DEFAULT_FLOATING))

    def send_ready() -> list[str]:
        sent = []
        while sender.ready():
            name, seq, backlog, _ = sender.pop()
            frame = frames[name]
            assert isinstance(frame, F.BufferResponse)
            assert (frame.sequence, frame.backlog) == (seq, backlog), name
            if frame.kind is F.BufferKind.DATA:
                receiver.on_buffer(frame.backlog)
            sent.append(name)
        return sent

    assert send_ready() == ["example: buffer 0", "example: buffer 1"]
    grant = frames["example: AddCredit"]
    assert isinstance(grant, F.AddCredit)
    assert receiver.take_announcement() == grant.credit
    sender.add_credit(grant.credit)
    assert send_ready() == ["example: buffer 2", "example: end of partition"]
