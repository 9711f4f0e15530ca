"""Credit-based flow control, driven by hypothesis through random interleavings.

A sender (OutboundStreams + SendScheduler) and a receiver (ChannelCredits sharing
one FloatingPool whose buffers need memory that may run short) talk over two FIFO
"wires". Hypothesis chooses the order of sends, deliveries, credit announcements, recycles, cancels and new data; after
every step the invariants must hold, and at the end everything drains: every
buffer recycled exactly once, every floating buffer back in the pool.
"""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shuffled.protocol.credit import (
    ANNOUNCE_BATCH,
    ChannelCredit,
    FloatingPool,
    OutboundStream,
    SendScheduler,
    SequenceChecker,
)
from shuffled.protocol.errors import CreditViolation, ProtocolError, SequenceGap


class ScarceMemory:
    """Memory behind floating buffers, of which there may be too little (the daemon's pool when full)."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.backed = 0

    def hold_extra(self, n: int) -> int:
        got = min(n, self.free)
        self.free -= got
        self.backed += got
        return got

    def drop_extra(self, n: int) -> None:
        self.free += n
        self.backed -= n

    @property
    def wanted(self) -> bool:
        return self.free == 0  # short of memory: a channel's spare floating buffer goes back


class CreditMachine(RuleBasedStateMachine):
    @initialize(
        channels=st.integers(1, 4),
        exclusive=st.integers(1, 3),
        floating=st.integers(0, 6),
        memory=st.integers(0, 8),
        data=st.lists(st.integers(0, 12), min_size=4, max_size=4),
    )
    def setup(self, channels: int, exclusive: int, floating: int, memory: int, data: list[int]) -> None:
        self.memory = ScarceMemory(memory)
        self.pool = FloatingPool(floating, self.memory)
        self.floating_size = floating
        self.recv = [ChannelCredit(exclusive, self.pool, owner=i) for i in range(channels)]
        self.checkers = [SequenceChecker() for _ in range(channels)]
        self.send = [OutboundStream[int](i, self.recv[i].sender_credit) for i in range(channels)]
        self.sched: SendScheduler[int] = SendScheduler()
        self.to_recv: deque[tuple[str, int, int, int]] = deque()
        self.to_send: deque[tuple[str, int, int]] = deque()
        self.announce: set[int] = set()
        self.in_use: list[tuple[int, int]] = []  # (channel, token)
        self.recycled: set[int] = set()
        self.next_token = 0
        self.delivered = [0] * channels
        self.queued = [0] * channels
        self.finished = [False] * channels
        self.ended = [False] * channels
        self.cancelled = [False] * channels
        for i in range(channels):
            self._queue(i, data[i])

    def _queue(self, ch: int, n: int) -> None:
        for _ in range(n):
            self.send[ch].push_data(self.next_token)
            self.next_token += 1
        self.queued[ch] += n

    def _announce_from(self, others: list[ChannelCredit]) -> None:
        for o in others:
            assert isinstance(o.owner, int)
            self.announce.add(o.owner)

    @rule(ch=st.integers(0, 3), n=st.integers(1, 5))
    def more_data(self, ch: int, n: int) -> None:
        if ch < len(self.send) and not self.finished[ch] and not self.send[ch].closed:
            self._queue(ch, n)

    @rule(ch=st.integers(0, 3))
    def finish(self, ch: int) -> None:
        if ch < len(self.send) and not self.finished[ch] and not self.send[ch].closed:
            self.finished[ch] = True
            self.send[ch].push_event(-1)

    @rule(steps=st.integers(1, 8))
    def sender_sends(self, steps: int) -> None:
        for s in self.send:
            self.sched.wake(s)
        for _ in range(steps):
            nxt = self.sched.next()
            if nxt is None:
                return
            stream, _, seq, backlog, is_event = nxt
            assert stream.credit >= 0
            kind = "end" if is_event else "buf"
            self.to_recv.append((kind, stream.stream, seq, backlog))

    @precondition(lambda self: bool(self.to_recv))
    @rule()
    def deliver_to_receiver(self) -> None:
        kind, ch, seq, backlog = self.to_recv.popleft()
        credit = self.recv[ch]
        if self.cancelled[ch]:
            return  # late frames of a cancelled stream are dropped without touching credit
        self.checkers[ch].check(seq)
        if kind == "end":
            self.ended[ch] = True
            self._announce_from(credit.close())
            return
        # The property under test: the sender never sent without credit.
        if credit.on_buffer(backlog):
            self.announce.add(ch)
        self.in_use.append((ch, self.next_token))
        self.next_token += 1
        self.delivered[ch] += 1

    @rule()
    def flush_announcements(self) -> None:
        for ch in sorted(self.announce):
            n = self.recv[ch].take_announcement()
            if n:
                assert not self.recv[ch].closed
                self.to_send.append(("credit", ch, n))
        self.announce.clear()

    @precondition(lambda self: bool(self.to_send))
    @rule()
    def deliver_to_sender(self) -> None:
        kind, ch, n = self.to_send.popleft()
        stream = self.send[ch]
        if kind == "cancel":
            stream.close()
        elif not stream.closed:
            stream.add_credit(n)

    @precondition(lambda self: bool(self.in_use))
    @rule(i=st.integers(0, 1000))
    def recycle(self, i: int) -> None:
        ch, token = self.in_use.pop(i % len(self.in_use))
        assert token not in self.recycled, "buffer recycled twice"
        self.recycled.add(token)
        mine, others = self.recv[ch].on_recycle()
        if mine:
            self.announce.add(ch)
        self._announce_from(others)

    @rule(n=st.integers(1, 3))
    def memory_frees(self, n: int) -> None:
        """Others give memory back; channels short of floating buffers find it with their next buffer."""
        self.memory.free += n

    @rule(ch=st.integers(0, 3))
    def cancel(self, ch: int) -> None:
        if ch < len(self.recv) and not self.recv[ch].closed:
            self.cancelled[ch] = True
            self._announce_from(self.recv[ch].close())
            self.to_send.append(("cancel", ch, 0))

    @invariant()
    def credit_accounting(self) -> None:
        held_floating = 0
        for c in self.recv:
            assert c.sender_credit >= 0 and c.unannounced >= 0 and c.available >= 0
            assert c.floating >= 0 and c.in_use >= 0
            assert c.exclusive + c.floating == c.available + c.in_use
            if not c.closed:
                assert c.available == c.sender_credit + c.unannounced
            held_floating += c.floating
        assert 0 <= self.pool.free <= self.floating_size
        assert self.pool.free + held_floating == self.floating_size
        # Every floating buffer held (as credit or in use) is backed by memory, and no more memory is held.
        assert self.memory.backed == held_floating
        for s, c in zip(self.send, self.recv, strict=True):
            assert s.credit >= 0
            if not c.closed:
                in_flight = sum(1 for f in self.to_recv if f[0] == "buf" and f[1] == s.stream)
                granted = sum(f[2] for f in self.to_send if f[0] == "credit" and f[1] == s.stream)
                # What the sender may still send never exceeds the receiver's free buffers.
                assert s.credit + in_flight <= c.sender_credit
                assert s.credit + in_flight + granted == c.sender_credit

    def teardown(self) -> None:
        if not hasattr(self, "send"):
            return
        for ch, s in enumerate(self.send):
            if not self.finished[ch] and not s.closed:
                self.finished[ch] = True
                s.push_event(-1)
        for _ in range(10_000):
            progressed = False
            self.flush_announcements()
            while self.to_send:
                self.deliver_to_sender()
                progressed = True
            for s in self.send:
                self.sched.wake(s)
            while (nxt := self.sched.next()) is not None:
                stream, _, seq, backlog, is_event = nxt
                self.to_recv.append(("end" if is_event else "buf", stream.stream, seq, backlog))
                progressed = True
            while self.to_recv:
                self.deliver_to_receiver()
                progressed = True
            while self.in_use:
                self.recycle(0)
                progressed = True
            self.credit_accounting()
            if not progressed and not self.announce:
                break
        else:
            pytest.fail("flow control did not drain: deadlock")
        for ch, c in enumerate(self.recv):
            assert c.closed, f"channel {ch} never ended"
            assert c.in_use == 0 and c.floating == 0 and c.available == c.exclusive
            if not self.cancelled[ch]:
                assert self.ended[ch]
                assert self.delivered[ch] == self.queued[ch], "a data buffer was lost"
        assert self.pool.free == self.floating_size, "floating buffers leaked"
        assert self.memory.backed == 0, "memory behind floating buffers leaked"
        assert len(self.recycled) == sum(self.delivered), "a buffer was not recycled exactly once"


CreditMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
test_credit_state_machine = CreditMachine.TestCase


def test_sender_refuses_data_without_credit() -> None:
    s = OutboundStream[str](1, 0)
    s.push_data("a")
    assert not s.ready()
    with pytest.raises(CreditViolation):
        s.pop()
    s.push_event("end")  # queued behind data: order is kept, so still not ready
    assert not s.ready()
    s.add_credit(1)
    assert s.pop() == ("a", 0, 0, False)
    assert s.pop() == ("end", 1, 0, True)


def test_events_need_no_credit() -> None:
    s = OutboundStream[str](1, 0)
    s.push_event("end")
    assert s.ready()
    assert s.pop() == ("end", 0, 0, True)


def test_receiver_rejects_buffer_beyond_credit() -> None:
    c = ChannelCredit(2, FloatingPool(0))
    c.on_buffer(0)
    c.on_buffer(0)
    with pytest.raises(CreditViolation):
        c.on_buffer(0)


def test_backlog_takes_floating_and_announces_once() -> None:
    pool = FloatingPool(8)
    c = ChannelCredit(2, pool)
    # One buffer in use, backlog 5: wants 5 + 2 free, has 1 -> takes 6 floating.
    assert c.on_buffer(5) is True
    assert c.floating == 6 and pool.free == 2
    assert c.take_announcement() == 6
    assert c.take_announcement() == 0
    # Recycling while above need returns floating buffers to the pool instead of announcing.
    c.on_backlog(0)
    mine, _ = c.on_recycle()
    assert mine is False and pool.free == 3


def test_credit_is_held_back_until_a_batch_unless_the_sender_runs_short() -> None:
    """A sender with plenty of credit is not sent every freed buffer; one running short gets credit at once."""
    c = ChannelCredit(2, FloatingPool(31))
    assert c.on_buffer(100) is True  # takes all 31 floating buffers: announced at once
    assert c.take_announcement() == 31 and c.sender_credit == 32
    for _ in range(11):
        assert c.on_buffer(100) is False  # no new credit, and the sender still holds plenty
    due = [c.on_recycle()[0] for _ in range(11)]
    assert due == [False] * (ANNOUNCE_BATCH - 1) + [True] * (12 - ANNOUNCE_BATCH)
    assert c.take_announcement() == 11 and c.sender_credit == 32
    while c.sender_credit > ANNOUNCE_BATCH:  # the sender uses its credit down to the threshold...
        assert c.on_buffer(100) is False
    assert c.on_recycle()[0] is False
    assert c.on_buffer(100) is True, "...then any unannounced credit is due at once"
    assert c.take_announcement() == 1


def test_spare_floating_stays_while_the_backlog_counts_down() -> None:
    """A short stream's backlog falls by one per buffer: its floating buffers stay as credit instead of
    going back and forth with every buffer, and go back once the backlog is gone, another channel waits
    for one, or the stream ends."""
    memory = ScarceMemory(8)
    pool = FloatingPool(8, memory)
    c = ChannelCredit(2, pool)
    assert c.on_buffer(6) and c.floating == 7 and memory.backed == 7
    c.take_announcement()
    for backlog in (5, 4, 3):
        c.on_recycle()
        c.on_buffer(backlog)
        c.take_announcement()
        assert c.floating == 7 and memory.backed == 7, "a counting-down backlog must not churn floating buffers"
    c.on_recycle()
    other = ChannelCredit(2, pool)
    other.on_buffer(20)  # takes the last free one, then waits for more
    assert other.waiting and pool.free == 0
    c.on_buffer(2)
    _, given = c.on_recycle()  # surplus while another channel waits: it goes there
    assert given == [other] and c.floating == 6 and other.floating == 2
    c.take_announcement()
    c.on_buffer(0)  # the last data buffer: the backlog is gone
    c.on_recycle()
    assert c.floating == 5, "with no backlog left a spare floating buffer goes back when recycled"
    c.close()
    other.close()
    for ch in (c, other):
        for _ in range(ch.in_use):
            ch.on_recycle()
    assert memory.backed == 0 and pool.free == 8


def test_floating_goes_to_waiting_channel_first_come_first_served() -> None:
    pool = FloatingPool(1)
    a, b = ChannelCredit(1, pool, owner="a"), ChannelCredit(1, pool, owner="b")
    a.on_buffer(3)  # takes the only floating buffer, still wants more
    b.on_buffer(2)  # waits
    assert pool.free == 0
    a.on_backlog(0)
    _, others = a.on_recycle()  # a no longer needs it: goes to b
    assert [o.owner for o in others] == ["b"]
    assert b.floating == 1


def test_sequence_gap_is_an_error() -> None:
    chk = SequenceChecker()
    chk.check(0)
    chk.check(1)
    with pytest.raises(SequenceGap):
        chk.check(3)


def test_add_credit_must_be_positive() -> None:
    with pytest.raises(ProtocolError):
        OutboundStream[int](1, 0).add_credit(0)


def test_round_robin_serves_every_ready_stream() -> None:
    sched: SendScheduler[int] = SendScheduler()
    streams = [OutboundStream[int](i, 100) for i in range(3)]
    for s in streams:
        for k in range(4):
            s.push_data(k)
        sched.wake(s)
    order = []
    while (nxt := sched.next()) is not None:
        order.append(nxt[0].stream)
    assert order == [0, 1, 2] * 4
