"""A replica link's lag gate as the send loop drives it: the pusher hears of progress once, at half the lag,
and every forwarded buffer goes out and comes back to its owner. A link whose push ends while it opens
is aborted."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from shuffled.buffers import Buffer, GlobalPool
from shuffled.config import DaemonConfig
from shuffled.net.sender import Sender
from shuffled.net.streams import Payload
from shuffled.protocol.frames import REPLICA, OpenMapOutput
from shuffled.server.cluster.replication import ReplicaLink, ReplicaService
from tests.aio import within
from tests.transports import InstantTransport
from tests.turns import until

SEG = 4096
LAG = 8
TIMEOUT = 10


class Transport(InstantTransport):
    """Counts the PushData payloads written."""

    def __init__(self) -> None:
        self.payloads = 0

    def writelines(self, parts: list[Any]) -> None:
        self.payloads += sum(1 for p in parts if len(p) == SEG)


def _link(sender: Sender) -> ReplicaLink:
    link = ReplicaLink(DaemonConfig(replica_lag=LAG))
    proto: Any = SimpleNamespace(features=frozenset([REPLICA]))
    conn: Any = SimpleNamespace(node="replica", proto=proto, sender=sender, replicas=ReplicaService(proto))
    link.conn = conn
    link.stream.stream = 1
    return link


def _forward(link: ReplicaLink, pool: GlobalPool, stored: list[Buffer]) -> None:
    """A stored buffer (the store's reference dropped at once) forwarded by reference."""
    (buf,) = pool.try_take(1) or []
    buf.refs, buf.length = 1, SEG
    buf.set_recycler(pool.give)
    stored.append(buf)
    buf.retain()
    link.send(Payload(buf))
    buf.release()


@within(TIMEOUT)
async def test_the_pusher_hears_once_at_half_the_lag_and_every_buffer_comes_back() -> None:
    pool = GlobalPool(64 * SEG, SEG)
    transport = Transport()
    sender = Sender(transport)  # type: ignore[arg-type]
    link = _link(sender)
    progress: list[int] = []
    link.on_progress = lambda: progress.append(link.stream.queued)
    stored: list[Buffer] = []
    for _ in range(LAG):  # no credit yet: everything waits
        _forward(link, pool, stored)
    assert link.lagging()
    for _ in range(LAG // 2 - 1):  # sent one by one: the link still lags above half
        link.stream.add_credit(1)
        link.credited()
        sender._flush()
    assert progress == [], "the pusher waits until half the lag is sent"
    link.stream.add_credit(1)
    link.credited()
    sender._flush()
    assert progress == [LAG // 2], "the pusher hears once, at half the lag"
    assert link.stream.on_progress is None, "the send loop reports buffers only while the link lags"
    link.stream.add_credit(LAG)  # the 4 still queued and 4 more go out on the send loop's next turn
    link.credited()
    for _ in range(16):
        _forward(link, pool, stored)
    await until(lambda: transport.payloads == LAG + 4)  # the send loop's flush, on its own
    assert progress == [LAG // 2], "no more progress calls while the link does not lag"
    assert link.lagging(), "12 buffers wait for credit again"
    link.stream.add_credit(12)
    link.credited()
    sender._flush()
    assert transport.payloads == LAG + 16
    assert all(buf.refs == 0 for buf in stored), "every forwarded buffer is recycled once written"
    assert pool.free == 64


@within(TIMEOUT)
async def test_a_link_whose_credit_arrives_with_the_cancel_of_its_opening_is_aborted() -> None:
    """Found by the live fuzzer: a push that ends while its replica link opens cancels the
    opening. When the replica's first credit arrived in the same loop turn, asyncio.wait_for returned it
    and dropped the cancel, so the link stayed open and the replica kept the push's window for as long as
    the peer link lived. Now the cancel goes through and the replica is told to abort the push."""

    sent: list[str] = []
    proto: Any = SimpleNamespace(
        features=frozenset([REPLICA]),
        streams=SimpleNamespace(new_id=lambda: 1),
        open_push=lambda req, stream: sent.append("open"),
        abort_push=lambda writer: sent.append("abort"),
    )
    sender = SimpleNamespace(wake=lambda stream: None)
    conn: Any = SimpleNamespace(node="replica", proto=proto, sender=sender, replicas=ReplicaService(proto))
    link = ReplicaLink(DaemonConfig())
    opening = asyncio.create_task(link.open(conn, OpenMapOutput(0, "app", 1, 0, 1, 1, replica_of="primary")))
    await until(lambda: sent == ["open"])
    link.credited()  # the replica's first credit, and in the same turn the push ends
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    assert sent == ["open", "abort"] and link.done and not conn.replicas.outgoing
