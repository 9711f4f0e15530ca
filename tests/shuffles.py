"""Pushing and reading known data through the Python client: one map attempt of partitions of given sizes,
filled with `payload` (bytes that differ per attempt and partition, so a mix-up shows), and the bytes a
read of a range gives. The integration tests share these; a test that needs another shape (halves with
a flush between them, writes of odd sizes, a read that checks the order of runs) writes its own."""

from __future__ import annotations

from shuffled_client import AsyncClient
from tests.cluster import payload
from tests.units import MiB


async def push(
    client: AsyncClient,
    app: str,
    shuffle: int,
    attempt: int,
    sizes: list[int],
    *,
    map_index: int | None = None,
    durability: str | None = None,
) -> None:
    """One map attempt (of map task `attempt % 1000` unless `map_index` says): partition p holds
    `payload(attempt, p, sizes[p])`, written a MiB at a time (the client packs them into segments), then
    committed; the daemon's lengths must be the sizes."""
    index = attempt % 1000 if map_index is None else map_index
    w = await client.open_writer(app, shuffle, index, attempt, len(sizes), durability=durability)
    for p, size in enumerate(sizes):
        data = payload(attempt, p, size)
        for i in range(0, size, MiB):
            await w.write(p, data[i : i + MiB])
    assert await w.commit() == sizes


async def read_range(
    client: AsyncClient, app: str, shuffle: int, start: int, end: int, locations: dict[str, list[int]]
) -> bytes:
    """Everything a read of partitions [start, end) at `locations` gives, in the order it came."""
    async with client.read(app, shuffle, start, end, locations) as reader:
        return await reader.read_all()


def pushed(attempt: int, sizes: list[int], start: int = 0, end: int | None = None) -> bytes:
    """What `push` wrote of partitions [start, end) of one attempt, in partition order (what a read of that
    attempt alone gives)."""
    return b"".join(payload(attempt, p, sizes[p]) for p in range(start, len(sizes) if end is None else end))
