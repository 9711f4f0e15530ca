"""Drain with hand-over on real daemons: what a stopping daemon holds ends up on the daemons where
placement looks for copies, chunk for chunk, and its own data dir still serves it after a restart;
open reads finish while new client reads are refused; only peer-secret holders may drain a daemon."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shuffled.protocol.auth import drain_challenge_proof, drain_proof, new_nonce, proof_matches
from shuffled.protocol.errors import AuthFailed, InvalidRequest, ShuttingDown
from shuffled.server.cluster.handover import PARALLEL
from shuffled.server.cluster.replica_ring import candidates
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import Cluster, DaemonProcess, free_port, payload, secret_flags, start_daemon, wait_until
from tests.integration.test_durability import expected, read_by_attempt
from tests.shuffles import push
from tests.units import KiB, MiB

APP = "app-drain"
SIZES = [300 * KiB, 0, 1 * MiB + 5, 70 * KiB]


async def chunks(client: AsyncClient, shuffle: int, attempts: list[int]) -> dict[tuple[int, int], list[bytes]]:
    """The chunks of each (partition, attempt) pair as served, in order: every copy must have the same ones
    (a read that fails over resumes a pair by chunk count), whatever order the pairs come in."""
    got: dict[tuple[int, int], list[bytes]] = {}
    async with client.read(APP, shuffle, 0, len(SIZES), {"": attempts}) as reader:
        async for chunk in reader:
            got.setdefault((chunk.partition, chunk.attempt), []).append(bytes(chunk.data))
    return got


async def exited(d: DaemonProcess, timeout: float = 30.0) -> int:
    async def poll() -> int | None:
        return d.proc.poll()

    code: int = await wait_until(poll, lambda rc: rc is not None, timeout, "the drained daemon exited")
    return code


def logged(d: DaemonProcess, msg: str) -> dict[str, str]:
    """The fields of the daemon's (key=value) log line `msg`."""
    (line,) = [line for line in d.log if f"msg={msg} " in line or line.rstrip().endswith(f"msg={msg}")]
    return dict(re.findall(r"(\w+)=(\S+)", line))


@within(60)
async def test_replicas_1_every_attempt_is_copied_then_served_by_its_candidate_and_after_a_restart() -> None:
    with Cluster(2, extra=["--replicas", "1"]) as cluster:
        d0, d1 = cluster.daemons
        assert candidates([d0.addr, d1.addr], {}, d0.addr, APP, 1) == [d1.addr]
        c0 = await AsyncClient.connect(d0.addr)
        await push(c0, APP, 1, 1, SIZES)
        await push(c0, APP, 1, 2, SIZES)
        await c0.flush(APP, 1)  # attempts 1 and 2 are read back from disk for the copy
        await push(c0, APP, 1, 3, SIZES)  # attempt 3 is copied from memory
        await push(c0, APP, 2, 9, SIZES[:1])
        before = await chunks(c0, 1, [1, 2, 3])
        assert await c0.drain() == {"state": "pushes"}
        assert await exited(d0) == 0
        await c0.close()
        drained = logged(d0, "drained")
        assert (drained["to_copy"], drained["copied"], drained["copy_failed"]) == ("4", "4", "0")
        assert int(drained["copied_bytes"]) == 3 * sum(SIZES) + SIZES[0]
        c1 = await AsyncClient.connect(d1.addr)
        assert await chunks(c1, 1, [1, 2, 3]) == before
        assert await read_by_attempt(c1, 2, 0, 1, {"": [9]}, app=APP) == expected([9], SIZES[:1])
        # A reader still names the drained daemon (Spark's MapStatus does): the read fails over to the copy.
        got = await read_by_attempt(c1, 1, 0, len(SIZES), {d0.addr: [1, 2, 3]}, app=APP)
        assert got == expected([1, 2, 3], SIZES)
        await c1.close()
        # The drained daemon's data dir still serves everything after a restart.
        d0 = cluster.daemons[0] = start_daemon(d0.host, d0.port, extra=["--peers", f"{d0.addr},{d1.addr}"])
        c0 = await AsyncClient.connect(d0.addr)
        assert await read_by_attempt(c0, 1, 0, len(SIZES), {"": [1, 2, 3]}, app=APP) == expected([1, 2, 3], SIZES)
        s = await c0.stats()
        assert s["drain"]["state"] == "serving" and s["ready"]
        await c0.close()


@within(60)
async def test_replicas_2_only_what_lacks_copies_elsewhere_is_copied_on_sigterm() -> None:
    """SIGTERM with drain-handoff on, every daemon with --replicas 2, so pushes are replicated: an attempt
    held by both other daemons stays as it is; one replicated as usual gets one more copy; a replica held
    here is copied to the next candidate of its primary, as a replica of that primary."""

    with Cluster(3, extra=["--replicas", "2", "--drain-handoff", "on"]) as cluster:
        d0 = cluster.daemons[0]
        addrs = [d.addr for d in cluster.daemons]
        x, y = candidates(addrs, {}, d0.addr, APP, 1)
        (p,) = [a for a in (x, y) if candidates(addrs, {}, a, APP, 1)[0] == d0.addr]
        (q,) = [a for a in (x, y) if a != p]  # the primary p's other candidate
        clients = {addr: await AsyncClient.connect(addr) for addr in addrs}
        await push(clients[d0.addr], APP, 1, 1, SIZES)  # on d0 and x
        await push(clients[y], APP, 1, 1, SIZES)  # and on y (its replicas refuse: they hold it)
        await push(clients[d0.addr], APP, 1, 2, SIZES)  # on d0 and x: one copy to y
        await push(clients[p], APP, 1, 3, SIZES)  # on p and, as its replica, d0: one copy to q
        before = {a: (await clients[a].stats())["store"] for a in (x, y)}
        with pytest.raises(InvalidRequest, match="peer daemons only"):
            await clients[x].session.admin_request("holds", {"app": APP, "shuffle": 1, "attempts": [1]})
        d0.proc.send_signal(signal.SIGTERM)
        assert await exited(d0) == 0
        drained = logged(d0, "drained")
        assert (drained["to_copy"], drained["copied"], drained["copy_failed"]) == ("2", "2", "0")
        after = {a: (await clients[a].stats())["store"] for a in (x, y)}
        assert after[y]["commits"] == before[y]["commits"] + 1 + (q == y)
        assert after[x]["commits"] == before[x]["commits"] + (q == x)
        assert after[q]["replica_attempts"] == before[q]["replica_attempts"] + 1 + (q == y)
        got = await read_by_attempt(clients[y], 1, 0, len(SIZES), {"": [1, 2]}, app=APP)
        assert got == expected([1, 2], SIZES)
        got = await read_by_attempt(clients[q], 1, 0, len(SIZES), {"": [3]}, app=APP)
        assert got == expected([3], SIZES)
        for addr in (x, y):  # a read naming the drained daemon fails over to a copy, whoever relays it
            got = await read_by_attempt(clients[addr], 1, 0, len(SIZES), {d0.addr: [1, 2]}, app=APP)
            assert got == expected([1, 2], SIZES)
        for c in clients.values():
            await c.close()
        # Restarted on its data dir, d0 serves all of it again and still knows attempt 3 is p's.
        d0 = cluster.daemons[0] = start_daemon(d0.host, d0.port, extra=["--peers", ",".join(addrs)])
        c0 = await AsyncClient.connect(d0.addr)
        got = await read_by_attempt(c0, 1, 0, len(SIZES), {"": [1, 2, 3]}, app=APP)
        assert got == expected([1, 2, 3], SIZES)
        assert (await c0.stats())["store"]["replica_attempts"] == 1
        await c0.close()


@within(60)
async def test_a_refused_copy_goes_to_the_next_candidate_or_is_counted_and_the_drain_goes_on() -> None:
    """The first candidate is draining itself (it refuses every copy, and is not tried again); the second
    has attempt 1 open from a client (it refuses that copy): the other attempts are copied there,
    attempt 1 is counted failed, and the daemon still drains and exits."""

    with Cluster(3, extra=["--replicas", "1", "--drain-timeout", "60"]) as cluster:  # x drains all along
        d0 = cluster.daemons[0]
        addrs = [d.addr for d in cluster.daemons]
        x, y = candidates(addrs, {}, d0.addr, APP, 1)
        by_addr = {d.addr: d for d in cluster.daemons}
        c0, cx, cy = [await AsyncClient.connect(a) for a in (d0.addr, x, y)]
        for attempt in range(1, 9):
            await push(c0, APP, 1, attempt, SIZES)
        held = await cx.open_writer("other-app", 5, 0, 1, 1)  # keeps x draining, refusing pushes
        await held.write(0, b"x" * 100)
        by_addr[x].proc.send_signal(signal.SIGTERM)
        await wait_until(cx.stats, lambda s: s["drain"]["state"] == "pushes", what="x draining")
        open_on_y = await cy.open_writer(APP, 1, 1, 1, len(SIZES))  # attempt 1, never committed
        await c0.drain()
        assert await exited(d0) == 0
        drained = logged(d0, "drained")
        assert (drained["to_copy"], drained["copied"], drained["copy_failed"]) == ("8", "7", "1")
        failures = [line for line in d0.log if 'msg="hand-over copy failed"' in line]
        assert any(f"peer={x}" in f and "shutting down" in f for f in failures)
        assert len([f for f in failures if f"peer={x}" in f]) <= PARALLEL < 8  # only those already on their way
        assert [f for f in failures if f"peer={y}" in f and "attempt=1" in f]
        copied = list(range(2, 9))
        assert await read_by_attempt(cy, 1, 0, len(SIZES), {"": copied}, app=APP) == expected(copied, SIZES)
        await open_on_y.abort()
        await held.abort()
        for c in (c0, cx, cy):
            await c.close()


@within(60)
async def test_closing_refuses_new_client_reads_while_an_open_one_completes() -> None:
    host = "127.0.0.1"
    d = start_daemon(host, free_port([host]))
    try:
        c = await AsyncClient.connect(d.addr)
        w = await c.open_writer(APP, 1, 0, 1, 1)
        data = payload(1, 0, 2 * MiB)
        await w.write(0, data)
        assert await w.commit() == [len(data)]
        # Two buffers of credit and no floating ones: the read stays open until it is consumed.
        slow = await AsyncClient.connect(d.addr, exclusive=2, floating=0)
        reader = slow.read(APP, 1, 0, 1, {"": [1]})
        first = await reader.next_chunk()
        assert first is not None
        got = bytearray(first.data)
        assert await c.drain(handoff=False) == {"state": "pushes"}
        s = await wait_until(c.stats, lambda s: s["drain"]["state"] == "closing", what="closing")
        assert s["draining"] and not s["ready"] and s["streams"]["served"] == 1
        with pytest.raises(ShuttingDown):
            await read_by_attempt(c, 1, 0, 1, {"": [1]}, app=APP)
        while (chunk := await reader.next_chunk()) is not None:
            got += chunk.data
        assert bytes(got) == data
        assert await exited(d) == 0
        await slow.close()
        await c.close()
    finally:
        d.stop()


async def challenged(c: AsyncClient, peer_secret: bytes) -> tuple[str, str]:
    """A `drain_challenge` on `c`'s connection, its proof checked: (our nonce, the daemon's)."""
    nonce = new_nonce()
    answer = await c.drain_challenge(nonce)
    assert answer["client"] == c.local_address
    expected = drain_challenge_proof(peer_secret, nonce, answer["nonce"], answer["node"], answer["client"])
    assert proof_matches(expected, answer["proof"]), answer
    return nonce, answer["nonce"]


@within(60)
async def test_with_a_peer_secret_only_its_holders_may_drain(tmp_path: Path) -> None:
    """A drain's proof is made with the peer secret, over the last `drain_challenge` answered on the same
    connection, for the request's own arguments, and is good once."""

    host = "127.0.0.1"
    flags = secret_flags(tmp_path, "drain-secret")
    d = start_daemon(host, free_port([host]), extra=flags)
    try:
        c, other = [await AsyncClient.connect(d.addr, secret="drain-secret") for _ in range(2)]
        peer = b"peer-drain-secret"
        bad: dict[str, Any]  # the loops below try arguments of several kinds
        for bad in ({}, {"nonce": "ab" * 8}, {"nonce": 5}):
            with pytest.raises(AuthFailed, match="no valid nonce"):
                await c.session.admin_request("drain_challenge", bad)
        with pytest.raises(AuthFailed, match="peer secret"):  # no challenge answered on this connection
            await c.drain(proof="0" * 64)
        mine, theirs = await challenged(c, peer)
        right = drain_proof(peer, mine, theirs, True, None)
        refused: list[tuple[AsyncClient, str]] = [
            (other, right),  # the challenge was answered on another connection
            (c, drain_proof(b"drain-secret", mine, theirs, True, None)),  # the cluster secret
            (c, right),  # the challenge was used up by the try before
        ]
        for client, proof in refused:
            with pytest.raises(AuthFailed, match="peer secret"):
                await client.drain(proof=proof)
        for args in ({"handoff": False}, {"timeout": 0}, {"proof": 5}):  # other arguments than proved
            mine, theirs = await challenged(c, peer)
            with pytest.raises(AuthFailed, match="peer secret"):
                await c.session.admin_request("drain", {"proof": drain_proof(peer, mine, theirs, True, None), **args})
        s = await c.stats()
        assert s["drain"]["state"] == "serving" and s["ready"]
        for bad in ({"timeout": -1}, {"timeout": 1.5}, {"handoff": "yes"}):
            await challenged(c, peer)
            with pytest.raises(InvalidRequest):
                await c.session.admin_request("drain", bad)
        mine, theirs = await challenged(c, peer)
        assert await c.drain(timeout=5, proof=drain_proof(peer, mine, theirs, True, 5)) == {"state": "pushes"}
        assert await exited(d) == 0
        for client in (c, other):
            await client.close()
    finally:
        d.stop()


@within(60)
async def test_a_restarted_daemon_hands_data_over_under_the_token_its_application_is_bound_to() -> None:
    """The application's binding survives a restart (journaled with the shuffle): the drain's copies carry
    it, so the copy serves the application's own token and nobody else."""

    with Cluster(2, extra=["--replicas", "1"]) as cluster:
        d0, d1 = cluster.daemons
        c0 = await AsyncClient.connect(d0.addr, app_secret="one")
        await push(c0, APP, 1, 1, SIZES)
        await c0.flush(APP, 1)
        await c0.close()
        d0.stop()
        d0 = cluster.daemons[0] = start_daemon(d0.host, d0.port, extra=["--peers", f"{d0.addr},{d1.addr}"])
        c0 = await AsyncClient.connect(d0.addr)
        with pytest.raises(AuthFailed):  # bound to "one" again, before any new push
            await read_by_attempt(c0, 1, 0, len(SIZES), {"": [1]}, app=APP)
        await c0.drain()
        assert await exited(d0) == 0
        drained = logged(d0, "drained")
        assert (drained["to_copy"], drained["copied"], drained["copy_failed"]) == ("1", "1", "0")
        c1, anyone = await AsyncClient.connect(d1.addr, app_secret="one"), await AsyncClient.connect(d1.addr)
        assert await read_by_attempt(c1, 1, 0, len(SIZES), {"": [1]}, app=APP) == expected([1], SIZES)
        with pytest.raises(AuthFailed):
            await read_by_attempt(anyone, 1, 0, len(SIZES), {"": [1]}, app=APP)
        for c in (c0, c1, anyone):
            await c.close()


@within(60)
async def test_a_silent_peer_does_not_keep_the_drain_from_copying_to_a_healthy_one() -> None:
    """One candidate is SIGSTOPped with its connection open (its `holds` would wait admin-timeout, 30 s,
    beyond the drain's 4 s): asked for a share of the drain's time only, it holds nothing, and the
    healthy candidate gets the copy before the drain's deadline."""

    with Cluster(3, extra=["--replicas", "1", "--drain-timeout", "4"]) as cluster:
        d0, silent, healthy = cluster.daemons
        ring = [d.addr for d in cluster.daemons]
        shuffle = next(s for s in range(1, 50) if candidates(ring, {}, d0.addr, APP, s) == [healthy.addr, silent.addr])
        c0, cs = await AsyncClient.connect(d0.addr), await AsyncClient.connect(silent.addr)
        await push(c0, APP, shuffle, 1, SIZES)
        await push(cs, APP, 99, 7, SIZES[:1])
        await read_by_attempt(c0, 99, 0, 1, {silent.addr: [7]}, app=APP)  # d0 now has a link to it
        silent.proc.send_signal(signal.SIGSTOP)
        try:
            await c0.drain()
            assert await exited(d0) == 0  # within the drain's deadline
        finally:
            silent.proc.send_signal(signal.SIGCONT)
        drained = logged(d0, "drained")
        assert (drained["copied"], drained["copy_failed"]) == ("1", "0"), drained
        ch = await AsyncClient.connect(healthy.addr)
        got = await read_by_attempt(ch, shuffle, 0, len(SIZES), {"": [1]}, app=APP)
        assert got == expected([1], SIZES)
        for c in (c0, cs, ch):
            await c.close()


@within(60)
async def test_with_a_daemon_lost_copies_it_cannot_place_are_short_not_failed() -> None:
    """Replicas 2, three daemons, one of them lost. Draining d0, whose attempt also has its
    replica on x, cannot make the second copy elsewhere (only y could take it, and y is gone): the
    attempt still has a copy on x, so that copy is `short`, not `failed`, and `shuffled drain --wait`
    exits 0 (not a failed copy with `hand-over incomplete` in the log). An attempt with no
    copy anywhere else would be `failed`: see test_cli."""

    with Cluster(3, extra=["--replicas", "2"]) as cluster:
        d0 = cluster.daemons[0]
        addrs = [d.addr for d in cluster.daemons]
        x, y = candidates(addrs, {}, d0.addr, APP, 1)
        async with await AsyncClient.connect(d0.addr) as c0:
            await push(c0, APP, 1, 1, SIZES)  # on d0 and, as its replica, x
        lost = next(d for d in cluster.daemons if d.addr == y)
        lost.proc.kill()
        await asyncio.to_thread(lost.proc.wait)
        cmd = [sys.executable, "-m", "shuffled", "drain", d0.addr, "--wait", "--timeout", "20"]
        done = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert "failed=0 short=1 state=done" in done.stdout and "every attempt has a copy" in done.stderr
        drained = logged(d0, "drained")
        assert (drained["copy_failed"], drained["copy_short"]) == ("0", "1"), drained
        assert not [line for line in d0.log if "hand-over incomplete" in line]
        async with await AsyncClient.connect(x) as cx:
            got = await read_by_attempt(cx, 1, 0, len(SIZES), {d0.addr: [1]}, app=APP)
            assert got == expected([1], SIZES)


@within(60)
async def test_an_idle_client_of_a_stopping_daemon_is_told_to_retry_elsewhere() -> None:
    """When the drained daemon stops, it tells its client connections SHUTTING_DOWN (retryable)
    before it closes them; a Python client then fails every later call with ShuttingDown, not with
    ConnectionLost (a fetch failure)."""

    host = "127.0.0.1"
    d = start_daemon(host, free_port([host]))
    try:
        idle, c = await AsyncClient.connect(d.addr), await AsyncClient.connect(d.addr)
        await c.drain(handoff=False)
        assert await exited(d) == 0
        with pytest.raises(ShuttingDown):
            await read_by_attempt(idle, 1, 0, 1, {"": [1]}, app=APP)
        with pytest.raises(ShuttingDown):
            await idle.stats()
        for client in (idle, c):
            await client.close()
    finally:
        d.stop()
