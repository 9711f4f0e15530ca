"""Authentication, per-application isolation and integrity against real daemon processes.

A wrong or missing secret is refused at the handshake with AUTH_FAILED, a log line, and nothing
created; a client with another application's secret cannot read, remove or push that application's
data; a flipped byte is caught by the daemon on push and by the reader on arrival (CORRUPT_DATA).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from shuffled.protocol import codec
from shuffled.protocol.auth import dialer_proof
from shuffled.protocol.connection import Side
from shuffled.protocol.errors import (
    AuthFailed,
    CorruptData,
    ErrorCode,
    LimitExceeded,
    PeerUnavailable,
    ShuffledError,
)
from shuffled.protocol.events import AdminRequested, Authenticated, HelloReceived
from shuffled.protocol.frames import (
    AuthChallenge,
    BufferKind,
    ErrorResponse,
    Hello,
    HelloAck,
    OpenMapOutput,
    PartitionRequest,
    PushCredit,
    Role,
)
from shuffled.protocol.packed import group_bytes
from shuffled_client import AsyncClient, MapWriter
from tests.aio import within
from tests.cluster import Cluster, DaemonProcess, free_port, payload, pool_settled, start_daemon
from tests.integration.test_bad_input import Raw
from tests.protocol_pair import MemoryConnection
from tests.shuffles import push, read_range

SECRET = "s3cret-of-the-cluster"
#: what only daemons know; every application knows SECRET
PEER_SECRET = "only-daemons-know-this"
TIMEOUT = 60


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "secret"
    path.write_text(SECRET + "\n")  # a trailing newline (echo > file) does not count
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def secrets(secret_file: Path) -> list[str]:
    """The flags of a daemon that authenticates: the cluster secret and the peer secret."""
    peer = secret_file.with_name("peer-secret")
    peer.write_text(PEER_SECRET)
    peer.chmod(0o600)
    return ["--secret-file", str(secret_file), "--peer-secret-file", str(peer)]


@pytest.fixture(scope="module")
def pair(secrets: list[str]) -> Iterator[list[DaemonProcess]]:
    """Two daemons sharing the cluster and peer secrets, each told about the other."""
    with Cluster(2, "16M", secrets) as cluster:
        yield cluster.daemons


def _logged(d: DaemonProcess, *texts: str) -> bool:
    return any(all(text in line for text in texts) for line in d.log)


async def _wait_logged(d: DaemonProcess, *texts: str) -> None:
    await asyncio.to_thread(d.logged, *texts)


async def _connect(d: DaemonProcess, app_secret: str | None = None) -> AsyncClient:
    return await AsyncClient.connect(d.addr, secret=SECRET, app_secret=app_secret, timeout=10)


async def _challenged(addr: str, role: Role, info: dict[str, Any]) -> tuple[Raw, AuthChallenge]:
    """A raw connection that sent Hello (with `info`) and got the daemon's AuthChallenge."""
    raw = await Raw.open(addr)
    await raw.send(codec.encode(Hello(role, info=info)))
    challenge = await raw.frame()
    assert isinstance(challenge, AuthChallenge)
    return raw, challenge


def _state(stats: dict[str, Any]) -> tuple[Any, ...]:
    """What a refused dialer must not change."""
    return stats["store"], stats["connections"], stats["streams"], stats["pool"]["used"]


@within(TIMEOUT)
async def test_right_secret_works_and_wrong_or_missing_ones_are_refused(pair: list[DaemonProcess]) -> None:
    d = pair[0]
    c = await _connect(d)
    await push(c, "auth-app", 1, 1, [100, 50_000])
    assert await read_range(c, "auth-app", 1, 0, 2, {"": [1]}) == payload(1, 0, 100) + payload(1, 1, 50_000)
    before = _state(await c.stats())
    with pytest.raises(AuthFailed, match="secrets differ"):
        await AsyncClient.connect(d.addr, secret="not the secret", timeout=10)
    with pytest.raises(AuthFailed, match="has no secret configured"):
        await AsyncClient.connect(d.addr, timeout=10)
    await _wait_logged(d, "no secret configured")
    assert _logged(d, 'msg="authentication failed"')
    assert _state(await c.stats()) == before
    # the connection that did authenticate is unaffected
    assert await read_range(c, "auth-app", 1, 0, 1, {"": [1]}) == payload(1, 0, 100)
    await c.remove_application("auth-app")
    await c.close()


@within(TIMEOUT)
async def test_a_dialer_that_skips_or_fakes_the_proof_gets_nothing(pair: list[DaemonProcess]) -> None:
    """Raw clients: no nonce, a request instead of AuthResponse, a proof for other nonces."""

    d = pair[0]
    c = await _connect(d)
    before = _state(await c.stats())
    raw = await Raw.open(d.addr)
    await raw.send(codec.encode(Hello(Role.CLIENT, info={"name": "no-nonce"})))
    err = await raw.frame()
    assert isinstance(err, ErrorResponse) and err.stream == 0 and err.code == ErrorCode.AUTH_FAILED
    assert await raw.closed()

    raw, _ = await _challenged(d.addr, Role.CLIENT, {"nonce": "a" * 32})
    await raw.send(codec.encode(OpenMapOutput(1, "sneaky", 1, 0, 1, 1)))
    err = await raw.frame()
    assert isinstance(err, ErrorResponse) and err.code == ErrorCode.AUTH_FAILED
    assert "did not authenticate" in err.message

    raw, challenge = await _challenged(d.addr, Role.DAEMON, {"node": "10.9.9.9:1", "nonce": "b" * 32})
    replayed = dialer_proof(SECRET.encode(), "c" * 32, challenge.nonce)  # right secret, other nonce
    await raw.send(codec.encode_auth_response(replayed))
    err = await raw.frame()
    assert isinstance(err, ErrorResponse) and err.code == ErrorCode.AUTH_FAILED
    assert "wrong proof" in err.message
    stats = await c.stats()
    assert _state(stats) == before
    assert stats["connections"]["peers"] <= 1  # only the real peer, never the fake node
    await c.close()


@within(TIMEOUT)
async def test_the_secret_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """$SHUFFLED_SECRET instead of --secret-file (e.g. a Kubernetes secret as an environment variable)."""
    monkeypatch.setenv("SHUFFLED_SECRET", SECRET + "\n")
    monkeypatch.setenv("SHUFFLED_PEER_SECRET", PEER_SECRET)
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "16M")

    try:
        c = await AsyncClient.connect(d.addr, secret=SECRET, timeout=10)
        await c.close()
        with pytest.raises(AuthFailed):
            await AsyncClient.connect(d.addr, secret="not the secret", timeout=10)
        assert not any("authentication off" in line for line in d.log)
    finally:
        d.stop()


@within(TIMEOUT)
async def test_a_dialer_that_never_answers_the_challenge_times_out(secrets: list[str]) -> None:
    """The handshake timeout covers the whole exchange: a dialer that takes the challenge and goes quiet
    is closed with TIMEOUT, having created nothing."""
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "16M", [*secrets, "--handshake-timeout", "1"])

    try:
        raw, _ = await _challenged(d.addr, Role.CLIENT, {"nonce": "d" * 32})
        err = await raw.frame()  # nothing sent after the challenge
        assert isinstance(err, ErrorResponse) and (err.stream, err.code) == (0, ErrorCode.TIMEOUT), err
        assert await raw.closed()
        c = await _connect(d)
        assert (await c.stats())["connections"]["clients"] == 1  # only this one
        await c.close()
    finally:
        d.stop()


@within(120)
async def test_a_client_with_a_secret_refuses_a_daemon_without_one(tmp_path: Path) -> None:
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "16M")
    try:
        await asyncio.wait_for(_wait_logged(d, 'msg="authentication off"'), TIMEOUT)
        with pytest.raises(AuthFailed, match="does not authenticate"):
            await asyncio.wait_for(AsyncClient.connect(d.addr, secret=SECRET, timeout=10), TIMEOUT)
    finally:
        d.stop()


def test_a_cluster_secret_without_a_peer_secret_does_not_start(secret_file: Path) -> None:
    """Peers proving the cluster secret would prove nothing: every application has it."""
    cmd = [sys.executable, "-m", "shuffled", "serve", "--port", "0", "--data-dir", "none"]
    done = subprocess.run([*cmd, "--secret-file", str(secret_file)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "set peer-secret-file" in done.stderr, done.stderr


@within(TIMEOUT)
async def test_peers_prove_the_peer_secret_which_clients_do_not_have(
    pair: list[DaemonProcess], secrets: list[str], tmp_path: Path
) -> None:
    """A relayed read works between daemons sharing the peer secret. A daemon with the cluster secret
    but another peer secret is refused; so is a client that claims to be daemon ``a`` to ``b`` (it
    could otherwise close b's real connection to a and answer reads for a's data with forged bytes)."""

    a, b = pair
    ca, cb = await _connect(a), await _connect(b)
    await push(ca, "peer-app", 1, 2, [10, 70_000])
    expected = payload(2, 0, 10) + payload(2, 1, 70_000)
    assert await read_range(cb, "peer-app", 1, 0, 2, {a.addr: [2]}) == expected

    wrong = tmp_path / "wrong"
    wrong.write_text("another peer secret")
    rogue = start_daemon(
        "127.0.0.3",
        free_port(["127.0.0.3"]),
        "16M",
        [*secrets[:2], "--peer-secret-file", str(wrong), "--peers", b.addr],
    )
    try:
        cr = await _connect(rogue)
        before = _state(await cb.stats())
        with pytest.raises(PeerUnavailable, match="secrets differ"):
            await read_range(cr, "peer-app", 1, 0, 2, {b.addr: [2]})
        await _wait_logged(b, "authentication failed")
        assert _state(await cb.stats()) == before
        await cr.close()
    finally:
        rogue.stop()

    impostor = {"node": a.addr, "nonce": "i" * 32, "segment_size": 32 * 1024}
    raw, challenge = await _challenged(b.addr, Role.DAEMON, impostor)
    await raw.send(codec.encode_auth_response(dialer_proof(SECRET.encode(), "i" * 32, challenge.nonce)))
    err = await raw.frame()
    assert isinstance(err, ErrorResponse) and err.code == ErrorCode.AUTH_FAILED, err
    assert await raw.closed()
    assert not any("superseded" in line for line in b.log + a.log)
    assert await read_range(cb, "peer-app", 1, 0, 2, {a.addr: [2]}) == expected
    await ca.remove_application("peer-app")
    for c in (ca, cb):
        await c.close()


@within(TIMEOUT)
async def test_an_application_is_kept_from_other_application_secrets(pair: list[DaemonProcess]) -> None:
    a, b = pair
    owner = await _connect(b, app_secret="secret-of-app-1")
    await push(owner, "app-1", 1, 3, [500, 40_000])
    expected = payload(3, 0, 500) + payload(3, 1, 40_000)
    other = await _connect(b, app_secret="secret-of-app-2")
    nobody = await _connect(b)
    relay = await _connect(a, app_secret="secret-of-app-2")
    for c in (other, nobody):
        with pytest.raises(AuthFailed, match="belongs to other credentials"):
            await read_range(c, "app-1", 1, 0, 2, {"": [3]})
        with pytest.raises(AuthFailed):
            await c.unregister_shuffle("app-1", 1, propagate=False)
        with pytest.raises(AuthFailed):
            await c.remove_application("app-1", propagate=False)
        with pytest.raises(AuthFailed):
            await c.open_writer("app-1", 1, 1, 4, 2)
    with pytest.raises(AuthFailed):  # a relaying daemon forwards the token; the data's daemon checks it
        await read_range(relay, "app-1", 1, 0, 2, {b.addr: [3]})
    await _wait_logged(b, 'msg="request refused"')
    # Nothing was removed, the refused connections still work for their own application.
    assert await read_range(owner, "app-1", 1, 0, 2, {"": [3]}) == expected
    await push(other, "app-2", 1, 5, [7, 7])
    assert await read_range(owner, "app-1", 1, 0, 2, {"": [3]}) == expected
    # The owner reads through the other daemon too, and removes its application everywhere.
    relay_owner = await _connect(a, app_secret="secret-of-app-1")
    assert await read_range(relay_owner, "app-1", 1, 0, 2, {b.addr: [3]}) == expected
    result = await owner.remove_application("app-1")
    assert result["freed_segments"] > 0 and result["peers"] == {a.addr: "ok"}
    await other.remove_application("app-2")
    for c in (owner, other, nobody, relay, relay_owner):
        await c.close()


@within(TIMEOUT)
async def test_a_tenant_without_the_token_gets_nothing_through_a_peer(pair: list[DaemonProcess]) -> None:
    """Someone who knows the cluster secret but not app-7's: a read relayed by the other daemon with no
    token and a removal propagated by it with no token meet the token check where the data is, so neither
    gets the data nor removes it. Claiming to be a daemon instead ends at the handshake: see the peer
    secret test."""

    a, b = pair
    owner = await _connect(b, app_secret="secret-of-app-7")
    await push(owner, "app-7", 1, 2, [300, 9_000])
    expected = payload(2, 0, 300) + payload(2, 1, 9_000)
    tenant = await _connect(a)  # the cluster secret only
    with pytest.raises(AuthFailed, match="belongs to other credentials"):
        await read_range(tenant, "app-7", 1, 0, 2, {b.addr: [2]})
    result = await tenant.remove_application("app-7")
    assert "AUTH_FAILED" in str(result["peers"][b.addr]), result
    assert await read_range(owner, "app-7", 1, 0, 2, {"": [2]}) == expected
    await owner.remove_application("app-7")
    for c in (owner, tenant):
        await c.close()


@asynccontextmanager
async def silent_daemon(host: str, port: int) -> AsyncIterator[tuple[asyncio.Event, Callable[[], None]]]:
    """A listener on a daemon's port at another address: it accepts a dial and never answers. Yields the
    event set once dialled and a function that drops the dialled connection (the dial then fails)."""
    dialled = asyncio.Event()
    accepted: list[asyncio.StreamWriter] = []

    def accept(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.append(w)
        dialled.set()

    def drop() -> None:
        for w in accepted:
            w.transport.abort()

    server = await asyncio.start_server(accept, host, port)
    try:
        yield dialled, drop
    finally:
        drop()
        server.close()


@within(TIMEOUT)
async def test_a_read_failing_over_checks_the_token_where_it_is_served(pair: list[DaemonProcess]) -> None:
    """A tenant reads app-8 before app-8 has any data (so no binding) naming a silent
    daemon on the daemons' port; the owner pushes meanwhile, the dial fails, and the read fails over to
    the copies: the relaying daemon's own store and its peer's. Each checks the tenant's token against
    the binding as it serves (the store's `snapshot`), so the tenant gets the primary's error, not a byte
    (when only the peer checked, it got all of app-8's bytes from the relaying daemon's own store)."""

    a, b = pair
    port = int(a.addr.rsplit(":", 1)[1])
    async with silent_daemon("127.0.0.6", port) as (dialled, drop):
        tenant = await _connect(a, app_secret="tenant")
        reading = asyncio.create_task(read_range(tenant, "app-8", 1, 0, 2, {f"127.0.0.6:{port}": [1]}))
        await asyncio.wait_for(dialled.wait(), TIMEOUT)
        owners = [await _connect(d, app_secret="owner") for d in (a, b)]
        for owner in owners:  # every candidate holds a copy
            await push(owner, "app-8", 1, 1, [400, 30_000])
        drop()
        with pytest.raises(ShuffledError) as err:
            await reading
        assert err.value.code is ErrorCode.PEER_UNAVAILABLE, err.value
    for d in (a, b):  # the relaying daemon refused its own copy, its peer the resumed read
        await _wait_logged(d, 'msg="request refused"', "app=app-8")
    expected = payload(1, 0, 400) + payload(1, 1, 30_000)
    assert await read_range(owners[0], "app-8", 1, 0, 2, {"": [1]}) == expected
    await owners[0].remove_application("app-8")
    for c in (tenant, *owners):
        await pool_settled(c)
        await c.close()


@within(TIMEOUT)
async def test_a_read_with_the_wrong_token_is_refused_before_any_dial(pair: list[DaemonProcess]) -> None:
    """app-9 is bound on the relaying daemon; another tenant's read of it naming a location elsewhere is
    AUTH_FAILED at once, and the daemon dials nothing (it used to dial and answer PEER_UNAVAILABLE: a fetch
    failure, with the dial as the tenant's lever)."""

    a, _ = pair
    port = int(a.addr.rsplit(":", 1)[1])
    owner = await _connect(a, app_secret="owner-of-app-9")
    await push(owner, "app-9", 1, 1, [100, 100])
    async with silent_daemon("127.0.0.7", port) as (dialled, _drop):
        tenant = await _connect(a, app_secret="tenant")
        with pytest.raises(AuthFailed, match="belongs to other credentials"):
            await read_range(tenant, "app-9", 1, 0, 2, {f"127.0.0.7:{port}": [1]})
        assert not dialled.is_set()
    await owner.remove_application("app-9")
    for c in (tenant, owner):
        await c.close()


@within(TIMEOUT)
async def test_a_tenant_filling_a_replica_link_takes_no_copies_of_others(secrets: list[str]) -> None:
    """With two copies every push to p opens a replica push to r over one peer link.
    One tenant opens as many map outputs on p as its share there allows and leaves them open; their
    replica pushes hold as much of r's push memory as one application may. Another tenant's push still
    gets its copy: replica pushes count against their application's share on r, not against the link's
    (it committed with no copy: `replication.degraded` went up, nothing told the client)."""

    with Cluster(2, "8M", [*secrets, "--replicas", "2"]) as cluster:
        p, r = cluster.daemons
        hog = await _connect(p, app_secret="hog")
        held: list[MapWriter] = []
        with pytest.raises(LimitExceeded, match="push-share"):
            while len(held) < 1000:
                held.append(await hog.open_writer("hog-app", 1, 0, len(held) + 1, 1))
        async with await AsyncClient.connect(p.addr, secret=SECRET) as cp:
            assert (await cp.stats())["replication"]["degraded"] == 0  # every one of them has its copy
        victim = await _connect(p, app_secret="victim")
        await push(victim, "victim-app", 1, 1, [5_000, 70_000])
        async with await AsyncClient.connect(p.addr, secret=SECRET) as cp:
            assert (await cp.stats())["replication"]["degraded"] == 0
        reader = await _connect(r, app_secret="victim")
        assert (await reader.stats())["store"]["replica_attempts"] == 1
        expected = payload(1, 0, 5_000) + payload(1, 1, 70_000)
        assert await read_range(reader, "victim-app", 1, 0, 2, {"": [1]}) == expected
        for w in held:
            await w.abort()
        await victim.remove_application("victim-app")
        for c in (hog, victim, reader):
            await pool_settled(c)
            await c.close()


@asynccontextmanager
async def impostor(victim: str, host: str) -> AsyncIterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """Whoever answers at an address with the cluster secret only (a tenant's process on a port a daemon
    left, say): it passes every admin call on to the `victim` daemon over a client connection of its own,
    answers with what the victim says, and turns a `drain` into one that copies nothing and stops at once.
    Yields its address and the calls it saw."""
    seen: list[tuple[str, dict[str, Any]]] = []

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        proto = MemoryConnection(Side.ACCEPTOR, Role.DAEMON)
        async with await AsyncClient.connect(victim, secret=SECRET) as upstream:
            while data := await r.read(1 << 16):
                for ev in proto.receive_data(data):
                    if isinstance(ev, HelloReceived):
                        proto.challenge(SECRET.encode())
                    elif isinstance(ev, Authenticated):
                        proto.accept({"node": victim, "segment_size": 32 << 10})
                    elif isinstance(ev, AdminRequested):
                        op, args = ev.request.op, ev.request.args
                        seen.append((op, args))
                        if op == "drain":
                            args = {**args, "handoff": False, "timeout": 0}
                        try:
                            proto.answer_admin(ev.request.request, await upstream.session.admin_request(op, args))
                        except ShuffledError as exc:
                            proto.fail_admin(ev.request.request, exc)
                w.write(proto.data_to_send())
                await w.drain()

    server = await asyncio.start_server(serve, host, 0)
    try:
        yield f"{host}:{server.sockets[0].getsockname()[1]}", seen
    finally:
        server.close()


@within(TIMEOUT)
async def test_shuffled_drain_sends_no_proof_to_whoever_answers(
    pair: list[DaemonProcess], secret_file: Path, secrets: list[str]
) -> None:
    """`shuffled drain ADDRESS` with the peer secret, where an impostor holding only the
    cluster secret answers and relays to daemon a. The daemon proves the peer secret first and names the
    address it sees the command at: relayed, that is the impostor's, so the command stops before sending
    a proof. (A command that took node and start time from the impostor's `stats` and sent a proof over
    them let the impostor replay it as a drain without copies that stopped a at once.)"""

    a = pair[0]
    async with impostor(a.addr, "127.0.0.8") as (address, seen):
        cmd = [sys.executable, "-m", "shuffled", "drain", address, "--secret-file", str(secret_file)]
        done = await asyncio.to_thread(
            subprocess.run, [*cmd, "--peer-secret-file", secrets[3]], capture_output=True, text=True, timeout=60
        )
    async with await AsyncClient.connect(a.addr, secret=SECRET) as c:
        s = await c.stats()
        assert s["drain"]["state"] == "serving" and not s["draining"], s["drain"]
        assert done.returncode == 1 and "relays" in done.stderr, done.stderr
        assert "drain" not in [op for op, _ in seen] and not any("proof" in args for _, args in seen), seen
        for proof in ("0" * 64, None):  # a proof with no challenge answered on the connection
            with pytest.raises(AuthFailed, match="peer secret"):
                await c.drain(proof=proof)


@within(TIMEOUT)
async def test_a_client_cannot_make_a_daemon_connect_anywhere(pair: list[DaemonProcess]) -> None:
    """A read naming a location on another port (an internal service, say) fails with PEER_UNAVAILABLE
    and the daemon never connects there; its peers, on the daemons' own port, are still read from."""

    a, b = pair
    connected = asyncio.Event()
    server = await asyncio.start_server(lambda r, w: connected.set(), "127.0.0.5", 0)
    port = server.sockets[0].getsockname()[1]
    c = await _connect(a)
    with pytest.raises(PeerUnavailable, match="is not a known daemon"):
        await read_range(c, "dial-app", 1, 0, 2, {f"127.0.0.5:{port}": [1]})
    cb = await _connect(b)
    await push(cb, "dial-app", 1, 1, [10, 10])
    assert await read_range(c, "dial-app", 1, 0, 2, {b.addr: [1]}) == payload(1, 0, 10) + payload(1, 1, 10)
    assert not connected.is_set()
    server.close()
    await cb.remove_application("dial-app")
    for x in (c, cb):
        await x.close()


@within(TIMEOUT)
async def test_a_flipped_byte_in_a_push_is_refused_and_the_attempt_discarded(pair: list[DaemonProcess]) -> None:
    d = pair[0]
    c = await _connect(d)
    raw, challenge = await _challenged(d.addr, Role.CLIENT, {"nonce": "d" * 32})
    await raw.send(codec.encode_auth_response(dialer_proof(SECRET.encode(), "d" * 32, challenge.nonce)))
    assert isinstance(await raw.frame(), HelloAck)
    await raw.send(codec.encode(OpenMapOutput(1, "crc-app", 1, 0, 9, 2)))
    assert isinstance(await raw.frame(), PushCredit)
    data = b"x" * 1000
    good = codec.encode_push_data(1, 0, group_bytes(9, [(0, data)]))
    flipped = bytearray(codec.encode_push_data(1, 1, group_bytes(9, [(1, data)])))
    flipped[-17] ^= 0x01  # one bit of the payload, after the CRC was computed
    await raw.send(good + bytes(flipped))
    err = await raw.frame()
    while isinstance(err, PushCredit):
        err = await raw.frame()
    assert isinstance(err, ErrorResponse) and err.stream == 1 and err.code == ErrorCode.CORRUPT_DATA
    assert "CRC32C" in err.message
    s = await pool_settled(c)
    assert s["store"]["open_map_outputs"] == 0 and s["store"]["stored_segments"] == 0, s
    assert s["errors"].get("CORRUPT_DATA", 0) >= 1
    # the connection survives: the same raw client may push again
    await raw.send(codec.encode(OpenMapOutput(2, "crc-app", 1, 0, 10, 2)))
    assert isinstance(await raw.frame(), PushCredit)
    raw.writer.close()
    await c.close()


def _bad_crc(req: PartitionRequest) -> bytes:
    data = group_bytes(1, [(req.start, b"rows" * 100)])
    return codec.encode_buffer_response(req.receiver, 0, 0, BufferKind.DATA, data, 12345)


@asynccontextmanager
async def corrupting_peer(answer: Callable[[PartitionRequest], bytes] = _bad_crc) -> AsyncIterator[str]:
    """A 'daemon' without a secret that answers every read with `answer`: by default one buffer whose CRC32C
    does not match."""

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        raw = Raw(r, w)
        hello = await raw.frame()
        assert isinstance(hello, Hello)
        await raw.send(codec.encode(HelloAck(Role.DAEMON, info={"node": node, "segment_size": 32 << 10})))
        try:
            while True:
                req = await raw.frame()
                if isinstance(req, PartitionRequest):
                    await raw.send(answer(req))
        except (TimeoutError, EOFError, ConnectionError):
            return

    server = await asyncio.start_server(serve, "127.0.0.7", 0)
    node = f"127.0.0.7:{server.sockets[0].getsockname()[1]}"
    try:
        yield node
    finally:
        server.close()


@within(TIMEOUT)
@pytest.mark.parametrize(("relay_check", "relay_finds"), [("none", False), ("crc", True)])
async def test_a_flipped_byte_on_arrival_fails_the_read_with_corrupt_data(relay_check: str, relay_finds: bool) -> None:
    """The Python reader checks every buffer; a daemon relaying another daemon's data forwards the writer's
    CRC32C for its reader to check, and with --relay-check crc checks it itself (and counts it)."""

    async with corrupting_peer() as peer:
        direct = await AsyncClient.connect(peer, timeout=10)
        with pytest.raises(CorruptData, match="CRC32C"):
            await read_range(direct, "c-app", 1, 0, 2, {"": [1]})
        d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "16M", ["--relay-check", relay_check])
        try:
            c = await AsyncClient.connect(d.addr, timeout=10)
            with pytest.raises(CorruptData, match="CRC32C"):
                await read_range(c, "c-app", 1, 0, 2, {peer: [1]})
            s = await pool_settled(c)
            assert s["pool"]["used"] == 0 and (s["errors"].get("CORRUPT_DATA", 0) >= 1) == relay_finds, s
            await c.close()
        finally:
            d.stop()
        await direct.close()


def test_stats_command_with_the_secret_file(pair: list[DaemonProcess], secret_file: Path) -> None:
    cmd = [sys.executable, "-m", "shuffled", "stats", pair[0].addr]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "has no secret configured" in refused.stderr
    ok = subprocess.run([*cmd, "--secret-file", str(secret_file)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["node"] == pair[0].addr
