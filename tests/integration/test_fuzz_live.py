"""Fuzzed frames against a running daemon (see tests/integration/fuzzing.py): no crash, no hang, another
client keeps pushing and reading correct data throughout, and the pool is fully recycled.

SHUFFLED_FUZZ_FRAMES scales the run (default 100 000); `python3 -m tests.integration.fuzzing` runs longer.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from shuffled.config import MAX_COMMIT_PARTITIONS
from shuffled.protocol import codec
from shuffled.protocol.errors import ErrorCode, LimitExceeded
from shuffled.protocol.frames import ErrorResponse, OpenMapOutput
from shuffled.protocol.packed import group_bytes
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import Cluster, cluster_fixture, payload, pool_settled, secret_flags
from tests.integration.fuzzing import (
    APPS,
    CLOSE_BOUND,
    FUZZ_APP_SECRET,
    HalfOpen,
    Outcome,
    check_recycled,
    fuzz,
    half_open,
)
from tests.integration.test_bad_input import Raw

FRAMES = int(os.environ.get("SHUFFLED_FUZZ_FRAMES", "100000"))


target = cluster_fixture(1, pool_size="32M")


async def _bystander(
    addr: str, stop: asyncio.Event, secret: str | None = None, flood: HalfOpen | None = None
) -> tuple[int, int]:
    """Push and read back verified data until told to stop, each round on a new connection if `secret` is
    set (so the daemon keeps admitting authenticated clients); returns (rounds done, rounds done while the
    `flood`'s half-open connections were held)."""
    rounds = during = 0
    client = await AsyncClient.connect(addr, secret=secret)
    try:
        while not stop.is_set() or rounds == 0:
            rounds += 1
            if secret is not None and rounds > 1:
                await client.close()
                client = await AsyncClient.connect(addr, secret=secret)
            w = await client.open_writer("bystander", rounds, 0, 1, 2)
            await w.write(1, payload(rounds, 1, 200_000))
            await w.commit()
            async with client.read("bystander", rounds, 1, 2, {"": [1]}) as r:
                assert await r.read_all() == payload(rounds, 1, 200_000)
            await client.unregister_shuffle("bystander", rounds)
            during += flood is not None and flood.held > 0
    finally:
        await client.close()
    return rounds, during


async def _beside_a_bystander(
    addr: str, frames: int, seed: int, secret: str | None = None, **how: Any
) -> tuple[Outcome, float, int]:
    """`fuzz` the daemon at `addr` (`how`: its keyword arguments) while a bystander pushes and reads there:
    (what the fuzzing saw, seconds it took, rounds the bystander did)."""
    stop = asyncio.Event()
    bystander = asyncio.create_task(_bystander(addr, stop, secret))
    started = time.monotonic()
    out = await fuzz(addr, frames, seed, **how)
    elapsed = time.monotonic() - started
    stop.set()
    rounds, _ = await bystander
    return out, elapsed, rounds


@within(240)
async def test_live_daemon_survives_fuzzed_frames(target: Cluster) -> None:
    d = target.daemons[0]
    out, elapsed, rounds = await _beside_a_bystander(d.addr, FRAMES, seed=7)
    print(
        f"\nfuzzed {out.frames} frames ({out.bytes} bytes) on {out.connections} connections in {elapsed:.1f}s; "
        f"{out.replies} replies; {out.fatal} ended by a fatal error; bystander did {rounds} rounds"
    )
    assert out.frames >= FRAMES and out.hung == 0
    assert d.proc.poll() is None, "the daemon died"
    assert 0 < out.fatal < out.connections  # both the fatal paths and the survivable ones ran
    assert out.replies > FRAMES // 5  # most frames were handled, not discarded behind an early fatal one
    errors = await check_recycled(d.addr, [*APPS, "bystander"])
    assert errors.get("PROTOCOL", 0) > 0 and errors.get("UNKNOWN_STREAM", 0) > 0, errors


@within(120)
async def test_fuzzed_frames_before_authentication_cost_little(tmp_path: Path) -> None:
    """Against a daemon that requires a secret every fuzzed connection is a stranger (`Generator.stranger`):
    Hellos with nonces (so the daemon answers with a challenge) and without, as clients and as daemons;
    AuthResponses garbled, reflected, replayed, or proving the cluster secret where a daemon must prove
    the peer secret; headers announcing megabytes before the handshake is done. Meanwhile 160 connections
    from one address stop in their handshake and stay open. None gets past the handshake; the ones over
    max-handshakes-per-address are refused at once, the others closed at the handshake timeout; the
    daemon stays up, an authenticated client (a new connection every round) is served throughout, and
    nothing is left in the pool. RSS grows by less than 28 MiB, the client's rounds included: closed
    connections let go of their read buffers at once (they took 64 KiB or more each until the daemon's
    rare full garbage collection, and RSS grew by about 38 MiB here)."""
    import psutil

    secret = "fuzz-secret"
    flags = [*secret_flags(tmp_path, secret), "--handshake-timeout", "3"]
    cluster = Cluster(1, pool_size="32M", extra=flags)
    try:
        d = cluster.daemons[0]
        proc = psutil.Process(d.pid)
        rss = proc.memory_info().rss

        flood = HalfOpen()
        flooding = asyncio.create_task(half_open(d.addr, 160, "127.0.0.77", 3 + CLOSE_BOUND, 5, flood))
        await flood.connected.wait()
        stop = asyncio.Event()
        bystander = asyncio.create_task(_bystander(d.addr, stop, secret, flood))
        started = time.monotonic()
        out = await fuzz(d.addr, FRAMES // 5, seed=11, strangers=True, secret=secret.encode())
        elapsed = time.monotonic() - started
        await flooding
        stop.set()
        rounds, during = await bystander
        grown = proc.memory_info().rss - rss
        print(
            f"\n{out.connections} strangers ({out.frames} frames) in {elapsed:.1f}s: {out.challenged} "
            f"challenged, {out.fatal} ended by a fatal error, {out.admitted} admitted; half-open: "
            f"{flood.refused} refused, {flood.timed_out} timed out; bystander {rounds} rounds, {during} "
            f"during the flood; RSS grew {grown / 2**20:.1f} MiB"
        )
        assert out.hung == 0 and flood.hung == 0 and d.proc.poll() is None
        assert out.admitted == 0, "a stranger got past the handshake"
        # How far strangers got, from the daemon's log: many sent a nonce, were challenged and failed on
        # their proof (answered, or sent ahead of the challenge, which then never goes out)
        failed = [line for line in d.log if 'msg="authentication failed"' in line]
        wrong = sum("wrong proof" in line or "has no secret" in line for line in failed)
        print(f"authentication failed {len(failed)} times, {wrong} on a proof")
        assert out.challenged > 0 and wrong > out.connections // 5, (out.challenged, wrong)
        assert flood.refused == 160 - 128 and flood.timed_out == 128  # max-handshakes-per-address
        assert during > 0
        errors = await check_recycled(d.addr, ["bystander"], secret=secret)
        for code in ("AUTH_FAILED", "PROTOCOL", "LIMIT_EXCEEDED", "TIMEOUT"):
            assert errors.get(code, 0) > 0, errors
        assert grown < 28 << 20
    finally:
        cluster.stop()


@within(180)
async def test_tenants_and_peers_fuzzing_replica_resume_holds_and_drain_fields(tmp_path: Path) -> None:
    """Every fuzzed connection proves a secret, the cluster secret (a tenant) or the peer secret
    (a peer daemon), against two daemons with secrets and two copies, and fuzzes the fields hostile
    tenants tried: OpenMapOutput `replicas`, `replica_of` and `app_key`, PartitionRequest `resume` (reads
    relayed to the other daemon too), the admin `holds`, `drain_challenge` and `drain` (with made-up
    proofs). Neither daemon dies, hangs, starts to drain or crashes a handler (INTERNAL); tenants' daemon-only
    fields and `holds` are refused, as is every `drain`; an authenticated client is served throughout;
    both pools hold nothing once the fuzzed applications are removed."""
    secret = "fuzz-secret"
    flags = [*secret_flags(tmp_path, secret), "--replicas", "2"]
    cluster = Cluster(2, pool_size="32M", extra=flags)
    try:
        a, b = cluster.daemons

        members = (secret.encode(), f"peer-{secret}".encode())
        out, elapsed, rounds = await _beside_a_bystander(
            a.addr, FRAMES // 5, seed=13, secret=secret, members=members, relay=b.addr
        )
        print(
            f"\n{out.connections} tenants and peers ({out.frames} frames) in {elapsed:.1f}s: {out.members_in} "
            f"past the handshake, {out.replies} replies, {out.fatal} ended by a fatal error; bystander {rounds} "
            "rounds"
        )
        assert out.hung == 0 and a.proc.poll() is None and b.proc.poll() is None
        # most got in (a fatal frame in the same write as the AuthResponse ends one before its HelloAck)
        assert out.members_in > out.connections // 2
        for d in (a, b):
            async with await AsyncClient.connect(d.addr, secret=secret) as c:
                s = await c.stats()
                assert s["drain"]["state"] == "serving" and not s["draining"], s["drain"]
        errors = await check_recycled(a.addr, [*APPS, "bystander"], secret=secret, app_secret=FUZZ_APP_SECRET)
        for code in ("AUTH_FAILED", "INVALID_REQUEST", "PROTOCOL"):
            assert errors.get(code, 0) > 0, errors
        await check_recycled(b.addr, [], secret=secret)  # the copies went with the removals
    finally:
        cluster.stop()


# -- what the fuzzer found, kept as plain regressions


async def _fatal(addr: str, frames: bytes) -> tuple[int, str]:
    raw = await Raw.open(addr)
    await raw.hello()
    await raw.send(frames)
    while not isinstance(f := await raw.frame(), ErrorResponse) or f.stream != 0:
        pass
    assert await raw.closed()
    return f.code, f.message


@within(30)
async def test_push_data_behind_its_open_in_one_write_is_a_credit_violation(target: Cluster) -> None:
    """It used to crash the handler (INTERNAL): the payload had no buffer to land in."""

    d = target.daemons[0]
    early = codec.encode_push_data(1, 0, group_bytes(1, [(0, b"early")]))
    frames = codec.encode(OpenMapOutput(1, "fz-r", 1, 0, 1, 2)) + early
    code, message = await _fatal(d.addr, frames)
    assert code == ErrorCode.CREDIT_VIOLATION and "credit" in message, message
    async with await AsyncClient.connect(d.addr) as c:
        s = await pool_settled(c)
        assert s["store"]["open_map_outputs"] == 0 and "INTERNAL" not in s["errors"], s


@within(30)
async def test_stream_zero_in_a_push_frame_is_a_protocol_error(target: Cluster) -> None:
    """It used to be answered with UNKNOWN_STREAM on stream 0, which means 'fatal', on a connection kept open."""

    push = codec.encode_push_data(0, 0, group_bytes(1, [(0, b"x")]))
    for frame in (push, codec.encode_commit(0, 0), codec.encode_abort(0)):
        code, message = await _fatal(target.daemons[0].addr, frame)
        assert code == ErrorCode.PROTOCOL and "stream id 0" in message


@within(30)
async def test_a_shuffle_beyond_max_partitions_is_refused(target: Cluster) -> None:
    """A 2^24-partition map output once cost 128 MiB of zeros and a commit blocked the daemon for seconds."""

    async with await AsyncClient.connect(target.daemons[0].addr) as c:
        with pytest.raises(LimitExceeded, match=r"max-partitions \(1048575\)"):
            await c.open_writer("fz-r", 2, 0, 1, 1 << 24)
        top = MAX_COMMIT_PARTITIONS  # the largest allowed: cheap while open
        w = await c.open_writer("fz-r", 3, 0, 1, top)
        await w.write(top - 1, b"last")
        lengths = await w.commit()
        assert len(lengths) == top and lengths[-1] == 4 and sum(lengths) == 4
        async with c.read("fz-r", 3, 0, top, {"": [1]}) as r:  # a huge range holding one chunk
            assert await r.read_all() == b"last"
        await c.remove_application("fz-r")
