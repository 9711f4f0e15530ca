"""Malformed packed groups (PROTOCOL.md §3.3) against a live daemon, one per rule, from the golden vectors:
a push carrying one fails that push with INVALID_REQUEST, nothing of it is stored and every segment goes back;
a read whose payload carries one fails that read with PROTOCOL at the client, which cancels it. Either way the
connection, and the peer connection a relayed read used, go on serving."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from shuffled.protocol import codec
from shuffled.protocol.errors import ErrorCode, ProtocolError
from shuffled.protocol.frames import (
    AddCredit,
    BufferKind,
    CancelPartitionRequest,
    ErrorResponse,
    OpenMapOutput,
    PushCredit,
)
from shuffled.protocol.packed import group_bytes
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import Cluster, cluster_fixture, pool_settled
from tests.integration.test_bad_input import Raw, _still_serving
from tests.integration.test_regressions import _relayed_read, fake_peer

PACKED: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "proto" / "vectors" / "frames.json").read_text(encoding="utf-8")
)["packed"]
PUSHED = [e for e in PACKED["invalid"] if e["frame"] == "PUSH_DATA"]
READ = [e for e in PACKED["invalid"] if e["frame"] == "BUFFER_RESPONSE"]

one = cluster_fixture(1, pool_size="32M")


@within(60)
async def test_each_malformed_group_fails_its_push_only(one: Cluster) -> None:
    d = one.daemons[0]
    raw = await Raw.open(d.addr)
    await raw.hello()
    for writer, entry in enumerate(PUSHED, start=1):
        context = entry["context"]
        await raw.send(codec.encode(OpenMapOutput(writer, "pk-app", 1, writer, context["attempt"], 200)))
        assert isinstance(await raw.frame(), PushCredit)
        await raw.send(codec.encode_push_data(writer, 0, bytes.fromhex(entry["hex"])))
        err = await raw.frame()
        while isinstance(err, PushCredit):
            err = await raw.frame()
        assert isinstance(err, ErrorResponse) and (err.stream, err.code) == (writer, ErrorCode.INVALID_REQUEST)
        assert err.message, entry["name"]
    # The same connection pushes a good group of the same attempt afterwards: nothing of the bad ones stayed.
    writer = len(PUSHED) + 1
    await raw.send(codec.encode(OpenMapOutput(writer, "pk-app", 1, 0, 4711, 200)))
    assert isinstance(await raw.frame(), PushCredit)
    await raw.send(codec.encode_push_data(writer, 0, group_bytes(4711, [(3, b"abc")])) + codec.encode_commit(writer, 1))
    while isinstance(ack := await raw.frame(), PushCredit):
        pass
    assert not isinstance(ack, ErrorResponse), ack
    async with await AsyncClient.connect(d.addr) as c:
        s = await pool_settled(c)
        assert s["store"]["open_map_outputs"] == 0 and s["store"]["commits"] >= 1, s["store"]
        assert s["errors"].get("INVALID_REQUEST", 0) >= len(PUSHED), s["errors"]
        await c.remove_application("pk-app")
        assert (await pool_settled(c))["pool"]["used"] == 0
    raw.writer.close()
    await _still_serving(d.addr)


@within(60)
async def test_each_malformed_payload_fails_its_read_only(one: Cluster) -> None:
    d = one.daemons[0]
    async with fake_peer() as (peer, requests):
        c = await AsyncClient.connect(d.addr)
        for shuffle, entry in enumerate(READ, start=1):
            context = entry["context"]
            reader = c.read("r-app", shuffle, context["start"], context["end"], {peer: context["attempts"]})
            nxt = asyncio.ensure_future(reader.next_chunk())
            req, raw = await asyncio.wait_for(requests.get(), 10)
            bad = bytes.fromhex(entry["hex"])
            await raw.send(codec.encode_buffer_response(req.receiver, 0, 0, BufferKind.DATA, bad))
            with pytest.raises(ProtocolError) as info:
                await asyncio.wait_for(nxt, 10)
            assert info.value.code == ErrorCode.PROTOCOL, entry["name"]
            cancel, _ = await asyncio.wait_for(requests.get(), 10)
            while isinstance(cancel, AddCredit):  # the relayed buffer's credit, back before the client's cancel
                cancel, _ = await asyncio.wait_for(requests.get(), 10)
            assert isinstance(cancel, CancelPartitionRequest) and cancel.receiver == req.receiver
        # The client's connection and the daemon's peer connection survived: a read over both ends cleanly.
        _, last, req, raw = await _relayed_read(c, peer, requests, 99)
        await raw.send(codec.encode_buffer_response(req.receiver, 0, 0, BufferKind.END_OF_PARTITION, b""))
        assert await asyncio.wait_for(last, 10) is None
        assert (await pool_settled(c))["pool"]["used"] == 0
        await c.close()
