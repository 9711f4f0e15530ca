"""A disk-fed read sizes its batch of segments when it takes them, not when it decides to load."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from shuffled.buffers import GlobalPool
from shuffled.server.feed import DiskFedStream

SEG = 4096
TIMEOUT = 10


def _stream(pool: GlobalPool) -> DiskFedStream:
    services: Any = SimpleNamespace(pool=pool)
    return DiskFedStream(1, 16, lambda _: None, services, [], lambda: None, lambda _: None)


@pytest.mark.asyncio
async def test_batch_takes_what_is_free_when_memory_is_taken() -> None:
    """Short of memory, a batch takes the one segment free instead of waiting for all it wanted; when it
    had to wait, it takes what the wait freed, not only the one it waited for."""
    pool = GlobalPool(8 * SEG, SEG, reserve=2)
    held = pool.try_take(7, use_reserve=True)
    assert held is not None
    stream = _stream(pool)
    got = await asyncio.wait_for(stream._take(4), TIMEOUT)
    assert len(got) == 1, "a batch must not wait for memory that is not free"
    assert pool.free == 0
    later = asyncio.ensure_future(stream._take(4))
    await asyncio.sleep(0)  # one turn of the loop (not a timed wait): the batch runs up to its wait
    assert not later.done() and pool.waiting == 1
    for buf in held[:5]:
        pool.give(buf)
    refilled = await asyncio.wait_for(later, TIMEOUT)
    assert len(refilled) == 4, "after the wait the batch takes what memory freed meanwhile"
    assert pool.free == 1
    for buf in [*got, *refilled]:
        pool.give(buf)
    assert pool.free == 6
