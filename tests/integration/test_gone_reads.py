"""A read of a shuffle that is gone fails with why (unregistered, removed, expired), locally and relayed,
for its owner only; it never reads as empty, and a shuffle pushed again is read again."""

from __future__ import annotations

import pytest

from shuffled.protocol.errors import AuthFailed
from shuffled_client import AsyncClient, PartitionNotFound
from tests.aio import within
from tests.cluster import Cluster, DaemonProcess, payload, start_daemon, wait_until

APP = "gone-app"
SIZES = [700, 40_000]


async def _push(c: AsyncClient, shuffle: int, attempt: int, app: str = APP) -> None:
    w = await c.open_writer(app, shuffle, 0, attempt, len(SIZES))
    for p, n in enumerate(SIZES):
        await w.write(p, payload(attempt, p, n))
    assert await w.commit() == SIZES


async def _read(c: AsyncClient, shuffle: int, locations: dict[str, list[int]], app: str = APP) -> bytes:
    async with c.read(app, shuffle, 0, len(SIZES), locations) as reader:
        return await reader.read_all()


def _expected(attempt: int) -> bytes:
    return b"".join(payload(attempt, p, n) for p, n in enumerate(SIZES))


@within(120)
async def test_a_read_of_a_dropped_shuffle_says_why_to_its_owner_and_nothing_to_others() -> None:
    with Cluster(2) as cluster:
        a, b = cluster.daemons
        owner = await AsyncClient.connect(b.addr, app_secret="owner")
        relay = await AsyncClient.connect(a.addr, app_secret="owner")
        other = await AsyncClient.connect(b.addr, app_secret="someone-else")
        for shuffle in (1, 2, 3):
            await _push(owner, shuffle, 7)
        assert await _read(relay, 1, {b.addr: [7]}) == _expected(7)
        await owner.unregister_shuffle(APP, 1)
        for c, where in ((owner, ""), (relay, b.addr)):
            with pytest.raises(PartitionNotFound, match=rf"shuffle {APP}/1 was unregistered on this daemon"):
                await _read(c, 1, {where: [7]})
        with pytest.raises(AuthFailed):  # the application is still bound here: a stranger learns nothing
            await _read(other, 1, {"": [7]})
        assert await _read(owner, 2, {"": [7]}) == _expected(7)  # its siblings are untouched
        await owner.remove_application(APP)
        for shuffle in (2, 3):
            with pytest.raises(PartitionNotFound, match="was removed with its application"):
                await _read(owner, shuffle, {"": [7]})
        with pytest.raises(PartitionNotFound) as refused:  # unbound now: a stranger is told it is not held
            await _read(other, 2, {"": [7]})
        assert "not held" in str(refused.value), refused.value
        # The ids in use again: the shuffle reads again, what is not pushed again is still not held.
        await _push(owner, 2, 8)
        assert await _read(relay, 2, {b.addr: [8]}) == _expected(8)
        with pytest.raises(PartitionNotFound, match="not committed here"):
            await _read(owner, 2, {"": [7]})
        await owner.remove_application(APP)
        for c in (owner, relay, other):
            await c.close()


@within(90)
async def test_a_read_of_an_expired_application_says_it_expired() -> None:
    d: DaemonProcess = start_daemon("127.0.0.1", 0, "16M", ["--app-ttl", "1", "--data-dir", "none"])
    try:
        c = await AsyncClient.connect(d.addr)
        await _push(c, 1, 3)

        async def held() -> int:
            return int((await c.stats())["store"]["applications"])

        await wait_until(held, lambda n: n == 0, 30, "the idle application expired")
        with pytest.raises(PartitionNotFound, match="removed when its application expired"):
            await _read(c, 1, {"": [3]})
        await c.close()
    finally:
        d.stop()
