"""A load of spilled pieces sizes its batch of segments when it takes them, not when it decides to load."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from shuffled.buffers import GlobalPool
from shuffled.server.feed import PieceLoader
from tests.turns import until

SEG = 4096
TIMEOUT = 10


def _stream(pool: GlobalPool) -> PieceLoader:
    services: Any = SimpleNamespace(pool=pool, disk=object())
    return PieceLoader(services)


@pytest.mark.asyncio
async def test_batch_takes_what_is_free_when_memory_is_taken() -> None:
    """Short of memory, a batch takes the one segment free instead of waiting for all it wanted; when it
    had to wait, it takes what the wait freed, not only the one it waited for."""
    pool = GlobalPool(8 * SEG, SEG, reserve=2)
    held = pool.try_take(7, use_reserve=True)
    assert held is not None
    stream = _stream(pool)
    got = await asyncio.wait_for(stream.take(4), TIMEOUT)
    assert len(got) == 1, "a batch must not wait for memory that is not free"
    assert pool.free == 0
    later = asyncio.ensure_future(stream.take(4))
    await until(lambda: pool.waiting == 1)  # the batch runs up to its wait
    assert not later.done()
    for buf in held[:5]:
        pool.give(buf)
    refilled = await asyncio.wait_for(later, TIMEOUT)
    assert len(refilled) == 4, "after the wait the batch takes what memory freed meanwhile"
    assert pool.free == 1
    for buf in [*got, *refilled]:
        pool.give(buf)
    assert pool.free == 6


@pytest.mark.asyncio
async def test_a_waiting_push_leaves_the_reserve_to_a_batch() -> None:
    """Pushes never use the read reserve, so one waiting for memory does not shrink a load of spilled pieces's batch
    to one segment (a cold read under push back-pressure would pay a thread hand-off per segment); a
    waiting reader does keep what is free."""
    pool = GlobalPool(32 * SEG, SEG, reserve=8)
    held = pool.try_take(26, use_reserve=True)  # 6 free, all inside the reserve
    assert held is not None
    push = pool.take_later(4)
    assert not push.done() and pool.waiting == 1
    stream = _stream(pool)
    got = await asyncio.wait_for(stream.take(16), TIMEOUT)
    assert len(got) == 6, "the free reserve is the reads' while only pushes wait"
    reader = pool.take_later(1, use_reserve=True)
    pool.give(got.pop())
    assert reader.done(), "a waiting reader is served first"
    pool.give(got.pop())
    rest = await asyncio.wait_for(stream.take(16), TIMEOUT)
    assert len(rest) == 1, "what is free inside the reserve, not a wait for all 16"
    push.cancel()
    for buf in [*got, *rest, *held, *reader.result()]:
        pool.give(buf)
    assert pool.free == 32 and pool.floating == 0
