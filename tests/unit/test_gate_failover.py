"""The InputGate's failover rules, with fake peers (tests/integration/test_failover.py runs real daemons).

Which errors fail over and which fail the read; a candidate without the `replica` feature is used only
while nothing was relayed (it would not understand `resume`); the request sent to a copy resumes exactly
where the relayed chunks stop; a new channel gets new exclusive buffers from the read reserve, and every
segment is back in the global pool when the read is over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from shuffled.buffers import Chunk, GlobalPool
from shuffled.config import DaemonConfig
from shuffled.protocol.auth import token_digest
from shuffled.protocol.errors import (
    AuthFailed,
    ConnectionLost,
    ErrorCode,
    InternalError,
    InvalidRequest,
    LimitExceeded,
    PeerUnavailable,
    ShuffledError,
    StorageError,
)
from shuffled.protocol.frames import REPLICA, PartitionRequest
from shuffled.protocol.resume import Resume
from shuffled.server.accounting.counters import Counters
from shuffled.server.cluster.membership import Membership
from shuffled.server.serving.input_gate import InputGate, LocalInputChannel, RemoteInputChannel
from shuffled.server.storage.manager import open_storage
from shuffled.server.storage.store import Store
from tests.aio import within
from tests.pieces import pack, push, unpack

SEGMENT = 4096
ME, PRIMARY, OTHER = "n1:1", "n2:1", "n3:1"
#: shuffle 0's candidates for PRIMARY are [OTHER, ME]; shuffle 1's are [ME, OTHER]
SHUFFLE = 0


@dataclass
class FakeReads:
    features: frozenset[str]
    channels: dict[int, RemoteInputChannel] = field(default_factory=dict)
    requests: list[PartitionRequest] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    ids: int = 0
    is_open: bool = True

    def new_stream_id(self) -> int:
        self.ids += 1
        return self.ids

    def open_channel(self, ch: RemoteInputChannel, req: PartitionRequest) -> None:
        self.channels[ch.receiver] = ch
        self.requests.append(req)

    @property
    def reading(self) -> int:
        return len(self.channels)

    def close_channel(self, receiver: int, cancel: bool) -> None:
        self.channels.pop(receiver, None)
        if cancel:
            self.cancelled.append(receiver)

    def announce(self, ch: RemoteInputChannel) -> None:
        pass


@dataclass
class FakePeers:
    links: dict[str, FakeReads]

    async def get(self, addr: str) -> Any:
        if addr not in self.links:
            raise PeerUnavailable(f"cannot reach daemon {addr}")
        return SimpleNamespace(requests=self.links[addr])


@dataclass
class FakeOut:
    stream: int = 1
    closed: bool = False
    ended: bool = False
    upstream: int = 0
    chunks: list[Chunk] = field(default_factory=list)
    #: the view readers queueing on it (a failover to this daemon's own copy), and what waits unsent: nothing
    feeds: list[Any] = field(default_factory=list)
    queued: int = 0

    def push_many(self, chunks: list[Chunk]) -> None:
        self.chunks += chunks

    def end(self) -> None:
        self.ended = True

    def shutdown(self) -> None:
        self.closed = True


@dataclass
class FakeClient:
    out: FakeOut
    sender: Any = field(default_factory=lambda: SimpleNamespace(wake=lambda stream: None))
    errors: list[ShuffledError] = field(default_factory=list)
    gates_closed: list[int] = field(default_factory=list)

    def fail_read(self, rid: int, exc: ShuffledError) -> None:
        self.out.shutdown()
        self.errors.append(exc)

    def gate_closed(self, rid: int) -> None:
        self.gates_closed.append(rid)


async def _gate(
    links: dict[str, FakeReads],
    shuffle: int = SHUFFLE,
    stored: Callable[[Store], None] = lambda _: None,
    token: str | None = None,
) -> tuple[InputGate, FakeClient, FakeOut, GlobalPool]:
    """A gate of this daemon (`ME`, memory only, holding what `stored` puts in its store) reading `shuffle`."""
    cfg = DaemonConfig(peers=[ME, PRIMARY, OTHER], exclusive_buffers=2, floating_buffers=4)
    pool = GlobalPool(64 * SEGMENT, SEGMENT, reserve=32)
    storage = open_storage(cfg, pool, None)
    stored(storage.store)
    services = SimpleNamespace(
        config=cfg, pool=pool, storage=storage, counters=Counters(), membership=Membership(cfg, ME)
    )
    out = FakeOut()
    client = FakeClient(out)
    req = PartitionRequest(1, 8, "app", shuffle, 0, 4, {PRIMARY: [7]}, token)
    gate = InputGate(client, out, req, {PRIMARY: [7]}, services, FakePeers(links), ME)  # type: ignore[arg-type]
    await gate.open()
    return gate, client, out, pool


async def _failed_over(gate: InputGate) -> None:
    while gate.failover.tasks:
        await asyncio.wait(set(gate.failover.tasks))


def _relay(ch: RemoteInputChannel, partition: int, attempt: int, n: int) -> None:
    """n payloads of one group each: 100 bytes of pair (partition, attempt)."""
    group = pack(attempt, [(partition, b"x" * 100)])
    for _ in range(n):
        buf = ch.gate.pool.request()  # type: ignore[union-attr]
        assert buf is not None
        buf.memory[: len(group)] = group
        buf.length = len(group)
        ch.deliver(buf, 0)


async def _served(local: LocalInputChannel) -> None:
    """Returns once the local channel's reader has served its whole view."""
    reader = local.reader
    if reader.view.finished:
        return
    served: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done = reader.done

    def finished() -> None:
        done()
        served.set_result(None)

    reader.done = finished
    await served


def _end(gate: InputGate, out: FakeOut, pool: GlobalPool) -> None:
    for chunk in out.chunks:
        chunk.buffer.release()
    gate.close()
    assert pool.free == pool.total


@within(10)
async def test_a_copy_gets_the_resume_point_and_new_exclusive_buffers() -> None:
    primary, other = FakeReads(frozenset({REPLICA})), FakeReads(frozenset({REPLICA}))
    gate, client, out, pool = await _gate({PRIMARY: primary, OTHER: other})
    (ch,) = primary.channels.values()
    _relay(ch, 2, 7, 2)  # both exclusive buffers, still on their way to the client
    ch.fail(ConnectionLost("lost"))
    await _failed_over(gate)
    (req,) = other.requests
    assert req.locations == {"": [7]} and (req.start, req.end) == (0, 4)  # the original range (§10.6)
    assert req.resume == Resume((), 7, 2, 200)
    assert gate.pool is not None and gate.pool.min == 2 * 2  # the failed channel's set may be in flight
    (ch2,) = other.channels.values()
    _relay(ch2, 3, 7, 2)  # the new channel's buffers exist while the old ones are still out
    assert len(out.chunks) == 4
    counters = gate.env.counters
    assert not client.errors and counters.failover_tries == {"CONNECTION_LOST": 1}
    assert counters.failover_recovered == 0  # a try so far, not a success
    ch2.on_end()
    assert out.ended and counters.failover_recovered == 1 and counters.failover_exhausted == 0
    _end(gate, out, pool)


@within(10)
async def test_a_candidate_without_the_feature_is_skipped_once_bytes_were_relayed() -> None:
    for relayed in (0, 2):
        primary, old = FakeReads(frozenset({REPLICA})), FakeReads(frozenset())
        gate, client, out, pool = await _gate({PRIMARY: primary, OTHER: old})
        (ch,) = primary.channels.values()
        _relay(ch, 0, 7, relayed)
        ch.fail(ConnectionLost("lost"))
        await _failed_over(gate)
        if relayed:
            # OTHER skipped, ME (this daemon) lacks the data: the first error reaches the client.
            assert not old.requests and [e.code for e in client.errors] == [ErrorCode.CONNECTION_LOST]
            assert gate.env.counters.failover_exhausted == 1
        else:
            (req,) = old.requests
            assert req.resume is None and not client.errors
        _end(gate, out, pool)


@within(10)
async def test_errors_that_are_not_about_the_copy_fail_the_read() -> None:
    for exc in (AuthFailed("other credentials"), InvalidRequest("bad range")):
        primary, other = FakeReads(frozenset({REPLICA})), FakeReads(frozenset({REPLICA}))
        gate, client, out, pool = await _gate({PRIMARY: primary, OTHER: other})
        (ch,) = primary.channels.values()
        ch.fail(exc)
        assert client.errors == [exc] and not gate.failover.tasks and not other.requests
        _end(gate, out, pool)


@within(10)
@pytest.mark.parametrize(
    "refusal",
    [
        InvalidRequest("resume point does not match this copy"),
        AuthFailed("application bound to other credentials"),
        LimitExceeded("max-streams-per-connection"),
        StorageError("disk failed"),
        InternalError("a bug"),
    ],
)
async def test_any_error_of_a_copy_moves_on_and_the_read_ends_with_the_first_error(refusal: ShuffledError) -> None:
    """Once failing over, a copy's error is about that copy: the read goes on to the next candidate and,
    with none left, fails with the primary's error (a fetch failure: Spark recomputes, not retries)."""

    other = FakeReads(frozenset({REPLICA}))
    gate, client, out, pool = await _gate({OTHER: other})  # the primary cannot be dialled
    await _failed_over(gate)
    (ch,) = other.channels.values()
    assert gate.env.counters.failover_tries == {"PEER_UNAVAILABLE": 1}
    ch.fail(refusal)  # not the first request: next copy
    await _failed_over(gate)
    assert [e.code for e in client.errors] == [ErrorCode.PEER_UNAVAILABLE]  # ME lacks it: the first error
    _end(gate, out, pool)


@within(10)
async def test_a_failover_to_this_daemons_own_copy_serves_only_the_token_it_is_bound_to() -> None:
    """The store checks the token as it serves: the read arrived before the application had a binding
    here, the copy here was pushed with another token meanwhile, so the failover to it is refused and the
    read ends with the primary's error; with the owner's token the copy is served."""

    buffers = GlobalPool(8 * SEGMENT, SEGMENT)
    stores: list[Store] = []

    def stored(store: Store) -> None:
        stores.append(store)
        store.app_keys.bind("app", token_digest("owner"))
        out = store.open_map_output("app", 1, 0, 7, 4)
        push(buffers, store, out, pack(7, [(2, b"x" * 100)]))
        store.commit(out)

    for token, served in (("tenant", False), (None, False), ("owner", True)):
        gate, client, out_stream, pool = await _gate({}, shuffle=1, stored=stored, token=token)  # ME first
        await _failed_over(gate)
        if served:
            (local,) = gate.local_channels
            await asyncio.wait_for(_served(local), 10)
            assert not client.errors and [unpack(c.buffer.data()) for c in out_stream.chunks] == [[(7, 2, b"x" * 100)]]
        else:
            assert not gate.local_channels and not out_stream.chunks
            assert [e.code for e in client.errors] == [ErrorCode.PEER_UNAVAILABLE]
        _end(gate, out_stream, pool)
    for store in stores:
        store.remove_application("app")
    assert buffers.free == buffers.total
