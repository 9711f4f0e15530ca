"""Encryption at rest in the object store (a real S3 server): with `--at-rest-key-file` a canary uploaded as a
durable copy, spilled to objects or moved there from spill files appears in no object (without the key it
does), reads back through its daemon, after a restart and through another daemon that adopts the objects of
a killed one; a daemon without the key adopts nothing of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from shuffled.server.storage.objects import ObjectNotFound
from shuffled_client import AsyncClient, ShuffledError
from tests.aio import within
from tests.cluster import DaemonProcess, free_port, wait_until
from tests.integration.test_object_tier import Tier, s3, stopped, tier  # noqa: F401  (fixtures)

APP = "sealed-objects"
CANARY = b"object-canary-91d3e" * 55_000  # ~1 MiB: several pieces
SIZES = [len(CANARY), 4096]


def _key(path: Path) -> tuple[str, ...]:
    path.write_text("x" * 48 + "\n")
    return ("--at-rest-key-file", str(path))


async def _push(c: AsyncClient, shuffle: int, attempt: int, durability: str | None = None) -> None:
    w = await c.open_writer(APP, shuffle, attempt, attempt, 2, durability=durability)
    await w.write(0, CANARY)
    await w.write(1, CANARY[:4096])
    assert await w.commit() == SIZES


async def _read(c: AsyncClient, shuffle: int, where: dict[str, list[int]]) -> bytes:
    async with c.read(APP, shuffle, 0, 2, where) as reader:
        return await reader.read_all()


def _peers(tmp_path: Path | None = None) -> tuple[list[str], int, tuple[str, ...]]:
    """Two loopback hosts on one port, and the flags that make them peers (sealing, given a key's dir)."""
    hosts = ["127.0.0.1", "127.0.0.2"]
    port = free_port(hosts)
    flags = ("--peers", ",".join(f"{h}:{port}" for h in hosts))
    return hosts, port, (*flags, *_key(tmp_path / "key")) if tmp_path else flags


async def _canary_in_objects(t: Tier) -> bool:
    store = t.store()
    for info in await store.list_objects():
        body = bytearray(info.size)
        try:
            await store.read_into(info.key, 0, [memoryview(body)])
        except ObjectNotFound:  # gone since the listing: a daemon's start-up probe, written and deleted at once
            continue
        if CANARY[:19] in body:
            return True
    return False


@within(180)
async def test_sealed_durable_objects_hold_no_canary_and_another_daemon_with_the_key_serves_them(
    tier: Tier,  # noqa: F811
    tmp_path: Path,
    stopped: Callable[[DaemonProcess], None],  # noqa: F811
) -> None:
    hosts, port, extra = _peers(tmp_path)
    a, b = (tier.start(h, port, pool="32M", extra=extra) for h in hosts)
    ca = await AsyncClient.connect(a.addr)
    for attempt in (1, 2):
        await _push(ca, 1, attempt, durability="object-store")
    await wait_until(ca.stats, lambda s: s["tier"]["durable_attempts"] >= 2, 30, "durable")
    assert await tier.objects(), "nothing was uploaded"
    assert not await _canary_in_objects(tier), "an object holds the canary in plain text"
    await ca.close()
    stopped(a)
    cb = await AsyncClient.connect(b.addr)
    assert await _read(cb, 1, {a.addr: [1, 2]}) == (CANARY + CANARY[:4096]) * 2
    assert (await cb.stats())["tier"]["adopted_attempts"] == 2
    await cb.remove_application(APP)
    await cb.close()


@within(180)
async def test_spills_and_moves_to_objects_are_sealed_and_survive_a_restart(tier: Tier, tmp_path: Path) -> None:  # noqa: F811
    key = _key(tmp_path / "key")
    host = "127.0.0.1"
    no_dir = tier.start(host, free_port([host]), pool="16M", extra=key)  # spills go to objects
    c = await AsyncClient.connect(no_dir.addr)
    for attempt in range(1, 25):  # 24 MiB through a 16 MiB pool
        await _push(c, 2, attempt)
    assert (await c.stats())["tier"]["spilled_objects"] > 0
    assert await _read(c, 2, {"": [7]}) == CANARY + CANARY[:4096]
    assert not await _canary_in_objects(tier)
    await c.remove_application(APP)
    await c.close()

    port = free_port([host])
    flags = ("--disk-quota", "2M", *key)
    d = tier.start(host, port, data_dir=tmp_path / "data", extra=flags)  # spill files move to objects
    c = await AsyncClient.connect(d.addr)
    for attempt in range(1, 6):
        await _push(c, 3, attempt)
    await c.flush(APP, 3)
    await wait_until(c.stats, lambda s: s["tier"]["moved_objects"] > 0, 30, "spill files moved")
    assert not await _canary_in_objects(tier)
    await c.close()
    d.stop()
    tier.daemons.remove(d)
    d = tier.start(host, port, data_dir=tmp_path / "data", extra=flags)
    c = await AsyncClient.connect(d.addr)
    for attempt in range(1, 6):
        assert await _read(c, 3, {"": [attempt]}) == CANARY + CANARY[:4096]
    await c.remove_application(APP)
    await c.close()


@within(180)
async def test_without_the_key_the_canary_is_in_the_objects_and_sealed_ones_are_not_adopted(
    tier: Tier,  # noqa: F811
    tmp_path: Path,
    stopped: Callable[[DaemonProcess], None],  # noqa: F811
) -> None:
    hosts, port, peers = _peers()
    plain = tier.start(hosts[0], port, pool="32M", extra=peers)
    c = await AsyncClient.connect(plain.addr)
    await _push(c, 4, 1, durability="object-store")
    await wait_until(c.stats, lambda s: s["tier"]["durable_attempts"] >= 1, 30, "durable")
    assert await _canary_in_objects(tier), "the check above could not fail"
    await c.remove_application(APP)
    await c.close()
    plain.stop()
    tier.daemons.remove(plain)

    sealed = tier.start(hosts[0], port, pool="32M", extra=(*peers, *_key(tmp_path / "key")))
    keyless = tier.start(hosts[1], port, pool="32M", extra=peers)
    c = await AsyncClient.connect(sealed.addr)
    await _push(c, 5, 1, durability="object-store")
    await wait_until(c.stats, lambda s: s["tier"]["durable_attempts"] >= 1, 30, "durable")
    await c.close()
    stopped(sealed)
    c = await AsyncClient.connect(keyless.addr)
    with pytest.raises(ShuffledError):
        await _read(c, 5, {sealed.addr: [1]})
    keyless.logged("objects not adopted", "at-rest key")
    await c.remove_application(APP)
    await c.close()
