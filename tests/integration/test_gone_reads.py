"""A read of a shuffle that is gone fails with why (unregistered, removed, expired), locally and relayed,
for its owner only; it never reads as empty, and a shuffle pushed again is read again."""

from __future__ import annotations

import pytest

from shuffled.protocol.errors import AuthFailed
from shuffled_client import AsyncClient, PartitionNotFound
from tests.aio import within
from tests.cluster import Cluster, DaemonProcess, start_daemon, wait_until
from tests.shuffles import push, pushed, read_range

APP = "gone-app"
SIZES = [700, 40_000]
PARTS = len(SIZES)


@within(120)
async def test_a_read_of_a_dropped_shuffle_says_why_to_its_owner_and_nothing_to_others() -> None:
    with Cluster(2) as cluster:
        a, b = cluster.daemons
        owner = await AsyncClient.connect(b.addr, app_secret="owner")
        relay = await AsyncClient.connect(a.addr, app_secret="owner")
        other = await AsyncClient.connect(b.addr, app_secret="someone-else")
        for shuffle in (1, 2, 3):
            await push(owner, APP, shuffle, 7, SIZES)
        assert await read_range(relay, APP, 1, 0, PARTS, {b.addr: [7]}) == pushed(7, SIZES)
        await owner.unregister_shuffle(APP, 1)
        for c, where in ((owner, ""), (relay, b.addr)):
            with pytest.raises(PartitionNotFound, match=rf"shuffle {APP}/1 was unregistered on this daemon"):
                await read_range(c, APP, 1, 0, PARTS, {where: [7]})
        with pytest.raises(AuthFailed):  # the application is still bound here: a stranger learns nothing
            await read_range(other, APP, 1, 0, PARTS, {"": [7]})
        assert await read_range(owner, APP, 2, 0, PARTS, {"": [7]}) == pushed(7, SIZES)  # its siblings are untouched
        await owner.remove_application(APP)
        for shuffle in (2, 3):
            with pytest.raises(PartitionNotFound, match="was removed with its application"):
                await read_range(owner, APP, shuffle, 0, PARTS, {"": [7]})
        with pytest.raises(PartitionNotFound) as refused:  # unbound now: a stranger is told it is not held
            await read_range(other, APP, 2, 0, PARTS, {"": [7]})
        assert "not held" in str(refused.value), refused.value
        # The ids in use again: the shuffle reads again, what is not pushed again is still not held.
        await push(owner, APP, 2, 8, SIZES)
        assert await read_range(relay, APP, 2, 0, PARTS, {b.addr: [8]}) == pushed(8, SIZES)
        with pytest.raises(PartitionNotFound, match="not committed here"):
            await read_range(owner, APP, 2, 0, PARTS, {"": [7]})
        await owner.remove_application(APP)
        for c in (owner, relay, other):
            await c.close()


@within(90)
async def test_a_read_of_an_expired_application_says_it_expired() -> None:
    d: DaemonProcess = start_daemon("127.0.0.1", 0, "16M", ["--app-ttl", "1", "--data-dir", "none"])
    try:
        c = await AsyncClient.connect(d.addr)
        await push(c, APP, 1, 3, SIZES)

        async def held() -> int:
            return int((await c.stats())["store"]["applications"])

        await wait_until(held, lambda n: n == 0, 30, "the idle application expired")
        with pytest.raises(PartitionNotFound, match="removed when its application expired"):
            await read_range(c, APP, 1, 0, PARTS, {"": [3]})
        await c.close()
    finally:
        d.stop()
