"""The recorded conversations (proto/vectors/conversations.json) against the protocol connection.

The file is what the JVM client's ConversationCheck replays; this test says the
Python protocol connection still holds every conversation in it, byte for byte
and event for event. A difference means the protocol connection's behaviour
changed: if that was deliberate, re-record with proto/vectors/record.py and
review the diff.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from shuffled.protocol.codec import decode_all, encode

VECTORS = Path(__file__).parents[2] / "proto" / "vectors"
RECORDED: dict[str, Any] = json.loads((VECTORS / "conversations.json").read_text(encoding="utf-8"))


def _recorder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("record", VECTORS / "record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_protocol_connection_still_holds_every_recorded_conversation() -> None:
    assert _recorder().build() == RECORDED


@pytest.mark.parametrize("conversation", RECORDED["conversations"], ids=lambda c: c["name"])
def test_every_step_is_whole_frames_that_encode_back_to_the_same_bytes(conversation: dict[str, Any]) -> None:
    for step in conversation["steps"]:
        data = bytes.fromhex(step["hex"])
        frames = decode_all(data)
        assert frames and b"".join(encode(f) for f in frames) == data, step


def test_the_conversations_cover_each_event_and_both_fatal_kinds() -> None:
    events = {e.split("(")[0] for c in RECORDED["conversations"] for s in c["steps"] for e in s["events"]}
    assert {
        "HelloReceived",
        "Authenticated",
        "HandshakeDone",
        "ReadRequested",
        "CreditAdded",
        "ReadCancelled",
        "PushOpened",
        "PushDataArrived",
        "CommitRequested",
        "AbortRequested",
        "AdminRequested",
        "BufferArrived",
        "PushCredited",
        "Committed",
        "Aborted",
        "AdminAnswered",
        "StreamFailed",
        "StreamRefused",
        "ConnectionFailed",
    } <= events
    fatal = {s["fatal"] for c in RECORDED["conversations"] for s in c["steps"] if "fatal" in s}
    assert fatal == {"AUTH_FAILED", "PROTOCOL"}
