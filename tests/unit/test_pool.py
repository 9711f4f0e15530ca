"""The buffer pool: fixed size, awaitable waits, reserve, local pools, reference counts."""

from __future__ import annotations

import asyncio

import pytest

from shuffled.buffers import FRAME, LOAD, GlobalPool, PoolExhausted
from tests.aio import within
from tests.turns import until

SEG = 4096
TIMEOUT = 10


def test_segments_are_views_of_one_region() -> None:
    pool = GlobalPool(8 * SEG, SEG)
    (a, b) = pool.try_take(2) or []
    a.memory[:3] = b"abc"
    assert bytes(a.memory[:3]) == b"abc"
    assert a.index != b.index and len(a.memory) == SEG
    assert pool.free == 6 and pool.used == 2


def test_pool_never_grows_and_reserve_is_kept_for_readers() -> None:
    pool = GlobalPool(8 * SEG, SEG, reserve=2)
    assert pool.try_take(7) is None  # would eat into the reserve
    got = pool.try_take(6)
    assert got is not None and pool.free == 2
    assert pool.try_take(1) is None
    assert pool.try_take(2, FRAME) is not None
    assert pool.free == 0 and pool.total == 8


def test_release_recycles_once_and_double_release_is_an_error() -> None:
    pool = GlobalPool(4 * SEG, SEG)
    (buf,) = pool.try_take(1) or []
    buf.set_recycler(pool.give)
    buf.retain()
    buf.release()
    assert pool.free == 3
    buf.release()
    assert pool.free == 4
    with pytest.raises(RuntimeError):
        buf.release()


@within(30)
async def test_exhaustion_waits_then_resumes_when_a_buffer_is_recycled() -> None:
    pool = GlobalPool(2 * SEG, SEG)
    held = pool.try_take(2) or []
    waiter = pool.take_later(1)
    assert not waiter.done() and pool.waiting == 1
    held[0].set_recycler(pool.give)
    held[0].release()
    got = await asyncio.wait_for(waiter, TIMEOUT)
    assert len(got) == 1 and pool.free == 0


@within(30)
async def test_reader_is_not_blocked_behind_a_waiting_pusher() -> None:
    pool = GlobalPool(4 * SEG, SEG, reserve=1)
    held = pool.try_take(3) or []
    pusher = pool.take_later(1)  # needs free > reserve: waits
    reader = pool.take_later(1, FRAME)
    got = await asyncio.wait_for(reader, TIMEOUT)
    assert len(got) == 1 and not pusher.done() and pool.waiting == 1
    for b in held:
        b.set_recycler(pool.give)
        b.release()
    assert len(await asyncio.wait_for(pusher, TIMEOUT)) == 1


@within(30)
async def test_request_larger_than_pool_fails_fast() -> None:
    pool = GlobalPool(4 * SEG, SEG, reserve=1)
    with pytest.raises(PoolExhausted):
        await pool.take(4)


@within(30)
async def test_cancelled_waiter_leaks_nothing() -> None:
    pool = GlobalPool(2 * SEG, SEG)
    held = pool.try_take(2) or []
    waiter = asyncio.ensure_future(pool.take(2))
    registered = pool.take_later(1)  # a second waiter proves the first is queued by the time it runs
    task_done = asyncio.ensure_future(asyncio.wait_for(registered, TIMEOUT))
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    for b in held:
        b.set_recycler(pool.give)
        b.release()
    (extra,) = await task_done
    pool.give(extra)
    assert pool.free == 2 and pool.waiting == 0


@within(30)
async def test_local_pool_min_max_and_redistribution() -> None:
    pool = GlobalPool(16 * SEG, SEG)
    a = await asyncio.wait_for(pool.create_local_pool(2, 10), TIMEOUT)
    assert a.available == 2 and a.target == 10  # alone: may use all its max
    b = await asyncio.wait_for(pool.create_local_pool(2, 10), TIMEOUT)
    assert a.target == b.target == 8  # 12 spare segments shared by two pools
    assert a.grow(100) == 6, "up to its target"
    assert a.size == 8 and a.grow() == 0
    bufs = [a.request() for _ in range(8)]
    assert all(bufs) and a.request() is None
    b.destroy()
    assert a.target == 10
    for buf in bufs:
        assert buf is not None
        buf.release()
    a.destroy()
    assert pool.free == 16 and len(pool.locals) == 0


@within(30)
async def test_a_local_pool_grows_at_once_only_by_what_the_global_pool_has_free() -> None:
    pool = GlobalPool(16 * SEG, SEG)
    a = await pool.create_local_pool(1, 16)
    held = pool.try_take(12)
    assert held is not None and a.target == 16
    assert a.grow(100) == 3 and pool.free == 0 and a.grow() == 0
    for buf in held:
        pool.give(buf)
    assert a.grow(100) == 12 and a.size == 16
    a.destroy()
    assert pool.free == 16


@within(30)
async def test_local_pool_returns_excess_when_target_shrinks() -> None:
    pool = GlobalPool(16 * SEG, SEG)
    a = await pool.create_local_pool(1, 16)
    assert a.grow(3) == 3 and a.grow(100) == 12, "as far as asked, then up to its target"
    assert a.size == 16
    b = await asyncio.wait_for(pool.create_local_pool(1, 16), TIMEOUT)
    assert a.size <= a.target and a.size + b.size + pool.free == 16
    a.destroy()
    b.destroy()
    assert pool.free == 16


@within(30)
async def test_push_credit_promised_is_counted_in_the_global_pool_until_used_or_destroyed() -> None:
    """The global pool knows how much memory writers hold as unused credit (what a memory-only daemon
    must not count as memory that comes back by itself)."""
    pool = GlobalPool(16 * SEG, SEG)
    a = await asyncio.wait_for(pool.create_local_pool(4, 4, holder="app-a"), TIMEOUT)
    b = await asyncio.wait_for(pool.create_local_pool(2, 2, holder="app-b"), TIMEOUT)
    a.promise(4)
    b.promise(2)
    assert pool.promised == 6 and pool.promised_by == {"app-a": 4, "app-b": 2}
    used = a.request()
    assert used is not None and a.promised == 3 and pool.promised == 5  # pushed: no longer idle credit
    b.destroy()
    assert pool.promised == 3 and pool.promised_by == {"app-a": 3}
    used.release()
    a.destroy()
    assert pool.promised == 0 and pool.promised_by == {} and pool.free == 16


@within(30)
async def test_floating_segments_are_spare_memory_only_and_go_back() -> None:
    """A read gate's floating buffers: held only while more than twice the read reserve is free (they
    must not take what pushes wait for), given back at once when the credit is dropped (or on recycle
    if the segment is in use)."""
    pool = GlobalPool(10 * SEG, SEG, reserve=2)
    gate = await asyncio.wait_for(pool.create_local_pool(2, 2, gate=True), TIMEOUT)
    assert pool.free == 8
    assert gate.hold_extra() and gate.hold_extra() and gate.hold_extra() and gate.hold_extra()
    assert gate.size == 6 and pool.free == 4
    assert not gate.hold_extra(), "floating buffers must leave twice the read reserve free"
    assert pool.try_take(2) is not None, "a push can still get memory"
    bufs = [gate.request() for _ in range(6)]
    assert all(bufs) and gate.request() is None
    gate.drop_extra()  # its segment is in use: it goes back when recycled, not before
    assert pool.free == 2
    first = bufs.pop()
    assert first is not None
    first.release()
    assert pool.free == 3 and gate.size == 5
    for buf in bufs:
        assert buf is not None
        buf.release()
    assert gate.available == 5  # two exclusive + three floating still backed
    gate.drop_extra()
    assert pool.free == 4 and gate.size == 4
    gate.destroy()
    assert not gate.hold_extra()
    gate.drop_extra()
    assert pool.free == 8 and len(pool.locals) == 0


@within(30)
async def test_floating_budget_follows_the_spill_watermark() -> None:
    """With a spilling daemon's budget, floating buffers fill the pool up to the mark they are given (stored
    data sitting between the watermarks leaves them room), never the read reserve, and none while anyone
    waits for memory or stored data is being spilled; the count comes back to zero when the gate goes."""
    pool = GlobalPool(100 * SEG, SEG, reserve=12)
    stored = pool.try_take(78)  # stored data between the watermarks (70 % and 85 %)
    assert stored is not None
    gate = await asyncio.wait_for(pool.create_local_pool(2, 2, gate=True), TIMEOUT)
    assert not gate.hold_extra(), "the default budget leaves twice the reserve free (used must stay below 76)"
    pool.set_floating_budget(85)
    held = gate.hold_extra(64)  # a channel asks for its whole backlog at once and gets what the budget allows
    assert held == 5 and not gate.hold_extra()
    assert pool.used == 85 and pool.floating == 5, "floating fills the pool up to the high mark"
    assert pool.free - pool.reserve == 3, "pushes keep the memory above the reserve beyond the mark"
    pool.give(stored[0])
    pool.set_floating_budget(99)
    assert gate.hold_extra(64) == 3, "the ceiling is kept clear of the read reserve"
    assert pool.free == pool.reserve + 1
    gate.drop_extra(2)
    waiter = pool.take_later(pool.push_room + 1)  # a push that must wait for memory
    assert not waiter.done() and not gate.hold_extra(), "no floating buffer while someone waits for memory"
    waiter.cancel()
    gate.drop_extra(1)  # a segment comes back: the withdrawn wait no longer counts
    assert not pool.wanted and gate.hold_extra() == 1
    pool.spilling = True
    assert pool.wanted and not gate.hold_extra(), "no floating buffer takes the room a spill makes"
    pool.spilling = False
    gate.destroy()
    assert pool.floating == 0 and pool.used == 77 and len(pool.locals) == 0


@within(30)
async def test_reads_hold_the_reserve_only_each_kind_in_its_own_line() -> None:
    """However much is free, reads hold the reserve only: loads leave frames its last eighth and read gates'
    exclusive buffers its last quarter; pushes may have what reads hold of it (they keep free only the
    rest), and a gate waiting for exclusive buffers holds up no frame."""
    pool = GlobalPool(64 * SEG, SEG, reserve=16)  # loads: up to 14, exclusive buffers: up to 12
    gate = await asyncio.wait_for(pool.create_local_pool(12, 12, gate=True), TIMEOUT)
    assert pool.exclusive == pool.reading == 12
    second = asyncio.ensure_future(pool.create_local_pool(2, 2, gate=True))
    await until(lambda: pool.waiting == 1)  # three quarters of the reserve are exclusive buffers already
    loads = pool.try_take(2, LOAD)
    assert loads is not None and pool.try_take(1, LOAD) is None, "loads leave frames the last eighth"
    frames = pool.try_take(2, FRAME)
    assert frames is not None and pool.try_take(1, FRAME) is None, "frames fill the reserve, no more"
    assert pool.free == 48 and pool.push_room == 48, "the reserve is all held: pushes have the rest"
    pushed = pool.try_take(48)
    assert pushed is not None and pool.free == 0
    pool.give(frames.pop())
    assert pool.push_room == 0 and pool.try_take(1) is None, "pushes keep free what reads do not hold"
    assert not second.done()
    gate.destroy()
    assert (await asyncio.wait_for(second, TIMEOUT)).size == 2 and pool.exclusive == 2
    for buf in [*loads, *frames, *pushed]:
        pool.give(buf)
    assert pool.reading == 2 and pool.free == 62
