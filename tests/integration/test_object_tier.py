"""The object-store tier (server/storage/tier.py) with real daemons and a real S3 server (SeaweedFS on
loopback): a daemon without a data dir spills to objects and reads them back; spill files over the disk
quota move to objects and are served from there, also after a restart; durable commits survive their
daemon killed and are read through another daemon, which checks the application's token; a restarted
daemon without a data dir serves what it made durable and nothing it had not; uploads that fail (the
server killed mid-upload, slow, refusing with 503s, a full bucket) never count as durable and are retried;
the sweep deletes what a crashed daemon left. Every test ends with no object and no incomplete upload
under its prefix."""

from __future__ import annotations

import asyncio
import hashlib
import random
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from shuffled.server.storage.lease import lease_node
from shuffled.server.storage.object_format import node_dir, shuffle_prefix
from shuffled.server.storage.objects import ObjectStore
from shuffled_client import AsyncClient, PartitionNotFound, ShuffledError, StorageError
from tests.aio import within
from tests.cluster import DaemonProcess, free_port, pool_settled, rss, secret_flags, wait_until
from tests.integration.faultproxy import FaultProxy
from tests.seaweedfs import SeaweedFS, environ_without_aws, seaweedfs_fixture
from tests.units import MiB

APP = "app-tier"
#: a second application, for quotas of one application
OTHER = "app-tier-other"
PART = "5M"
#: a lease short enough for a test to see one expire (it must be more than twice both timeouts)
SHORT_LEASE = ("--object-store-lease", "4", "--peer-timeout", "1.5", "--admin-timeout", "1.5")

s3 = seaweedfs_fixture()


def data(attempt: int, partition: int, size: int) -> bytes:
    """Bytes that differ at every offset, per attempt and partition: a piece out of place shows."""
    return random.Random(f"{attempt}/{partition}").randbytes(size)


@dataclass
class Tier:
    """Daemons sharing one prefix of the bucket; at the end, checked to leave nothing there."""

    s3: SeaweedFS
    prefix: str = field(default_factory=lambda: f"tier-{uuid.uuid4().hex[:12]}")
    daemons: list[DaemonProcess] = field(default_factory=list)

    def flags(self, endpoint: str | None = None, *extra: str) -> list[str]:
        return [
            "--object-store",
            self.s3.url(self.prefix),
            "--object-store-endpoint",
            endpoint or self.s3.endpoint,
            "--object-store-path-style",
            "on",
            "--object-store-part-size",
            PART,
            "--object-store-durable-delay",
            "0.2",
            "--object-store-timeout",
            "10",
            "--object-store-retries",
            "1",
            "--drain-timeout",
            "5",
            *extra,
        ]

    def start(
        self, host: str, port: int, pool: str = "16M", data_dir: Path | None = None, extra: tuple[str, ...] = ()
    ) -> DaemonProcess:
        flags = ["--data-dir", str(data_dir) if data_dir else "none", *self.flags(None, *extra)]
        d = DaemonProcess(host, port, pool, flags, env=environ_without_aws(self.s3.admin.env())).wait_ready()
        self.daemons.append(d)
        return d

    def store(self) -> ObjectStore:
        return ObjectStore(self.s3.store_config(self.prefix), environ=self.s3.admin.env())

    async def objects(self) -> list[str]:
        """The keys of the data objects (not the daemons' leases)."""
        return [k for k in await self.keys() if lease_node(k) is None]

    async def keys(self) -> list[str]:
        return [o.key for o in await self.store().list_objects()]


@pytest_asyncio.fixture
async def tier(s3: SeaweedFS) -> AsyncIterator[Tier]:
    t = Tier(s3)
    yield t
    for d in t.daemons:
        d.stop()
    left = await t.keys()
    assert [k for k in left if lease_node(k) is None] == [], f"objects left under the test's prefix: {left}"
    await t.store().delete(left)  # the daemons' leases, which stay to expire
    assert s3.incomplete_uploads() == []


@pytest.fixture
def stopped() -> Iterator[Callable[[DaemonProcess], None]]:
    """Kill -9 a daemon; its process is reaped."""

    def kill(d: DaemonProcess) -> None:
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)

    yield kill


async def push(
    client: AsyncClient, shuffle: int, attempt: int, sizes: list[int], durability: str | None = None, app: str = APP
) -> None:
    w = await client.open_writer(app, shuffle, attempt, attempt, len(sizes), durability=durability)
    for p, size in enumerate(sizes):
        await w.write(p, data(attempt, p, size))
    assert await w.commit() == sizes


async def check(
    client: AsyncClient, shuffle: int, locations: dict[str, list[int]], sizes: list[int], app: str = APP
) -> None:
    """Every partition of every attempt reads back byte-exact, one partition at a time."""
    for p, size in enumerate(sizes):
        got: dict[int, Any] = {}
        async with client.read(app, shuffle, p, p + 1, locations) as reader:
            async for chunk in reader:
                got.setdefault(chunk.attempt, hashlib.sha256()).update(chunk.data)
        attempts = [a for attempts in locations.values() for a in attempts]
        want = {a: hashlib.sha256(data(a, p, size)).digest() for a in attempts}
        assert {a: h.digest() for a, h in got.items()} == want, f"partition {p}"


async def durable(client: AsyncClient, n: int) -> dict[str, Any]:
    return await wait_until(client.stats, lambda s: s["tier"]["durable_attempts"] >= n, 30, f"{n} attempts durable")  # type: ignore[no-any-return]


@within(180)
async def test_a_daemon_without_a_data_dir_spills_to_objects_and_reads_them_back(tier: Tier) -> None:
    """Six times a 16 MiB pool through a daemon with no data dir: its spills go to objects of at least a part
    each (at most one PUT per part of data), RSS stays near the pool, every byte reads back, locally and
    relayed by a second daemon; unregistering deletes every object. Its ready line says where spills go."""

    hosts = ["127.0.0.1", "127.0.0.2"]
    port = free_port(hosts)
    peers = ("--peers", ",".join(f"{h}:{port}" for h in hosts))
    a, b = (tier.start(h, port, extra=peers) for h in hosts)
    assert 'data_dir="none (spills go to the object store)"' in a.ready_line, a.ready_line
    ca, cb = await AsyncClient.connect(a.addr), await AsyncClient.connect(b.addr)
    sizes = [2 * MiB] * 6
    peak = 0
    for attempt in range(1, 9):
        await push(ca, 1, attempt, sizes)
        peak = max(peak, rss(a.pid))
    s = await ca.stats()
    spilled = s["tier"]
    assert spilled["spilled_objects"] >= 4 and s["disk"]["spills"] == 0, spilled
    assert spilled["spilled_bytes"] >= spilled["spilled_objects"] * 4 * MiB, "objects smaller than a part"
    assert s["object_store"]["requests"]["put"] <= spilled["spilled_objects"] + 1 + spilled["leases_written"]  # probe
    await check(ca, 1, {"": list(range(1, 9))}, sizes)
    await check(cb, 1, {a.addr: list(range(1, 9))}, sizes)
    peak = max(peak, rss(a.pid))
    assert peak < a.pool_size + 120 * MiB, f"peak RSS {peak / MiB:.0f} MiB"
    await cb.unregister_shuffle(APP, 1)
    settled = await pool_settled(ca)
    assert settled["pool"]["used"] == 0 and settled["object_store"]["objects_held"] == 1  # its lease
    assert await tier.objects() == []
    await ca.close()
    await cb.close()


@within(180)
async def test_spill_files_over_the_disk_quota_move_to_objects_and_survive_a_restart(
    tier: Tier, tmp_path: Path
) -> None:
    """A daemon whose spill files may hold 8 MiB moves the oldest pieces of 40 MiB to objects and punches
    them out of its file; everything reads back, also after a restart on the data dir (its journal says which
    object holds what); removing the application deletes files and objects."""

    host = "127.0.0.1"
    port = free_port([host])
    quota = ("--disk-quota", "8M")
    d = tier.start(host, port, data_dir=tmp_path / "data", extra=quota)
    c = await AsyncClient.connect(d.addr)
    sizes = [1 * MiB] * 8
    for attempt in range(1, 6):
        await push(c, 1, attempt, sizes)
    await c.flush(APP, 1)
    s = await wait_until(
        c.stats,
        lambda s: s["tier"]["moved_objects"] > 0 and s["disk"]["used_bytes"] <= 8 * MiB,
        30,
        "spill files moved below the quota",
    )
    assert s["disk"]["reclaimed_bytes"] >= 24 * MiB, s["disk"]
    await check(c, 1, {"": [1, 2, 3, 4, 5]}, sizes)
    await c.close()
    d.stop()
    tier.daemons.remove(d)
    d = tier.start(host, port, data_dir=tmp_path / "data", extra=quota)
    c = await AsyncClient.connect(d.addr)
    await check(c, 1, {"": [1, 2, 3, 4, 5]}, sizes)
    await c.remove_application(APP)
    assert await tier.objects() == []
    assert [p for p in (tmp_path / "data").rglob("*") if p.is_file() and p.name != "LOCK"] == []
    await c.close()


@within(180)
async def test_an_application_over_its_own_disk_quota_moves_only_its_own_spills(tier: Tier, tmp_path: Path) -> None:
    """Two applications spill to the data dir and one passes `--app-disk-quota` (the daemon has no quota of
    its own) with three shuffles of 4 MiB: only its pieces move to objects, though the other application's
    one shuffle of 6 MiB is larger, older and unread, and it is brought down to its quota; both read back
    byte-exact."""
    host = "127.0.0.1"
    port = free_port([host])
    d = tier.start(host, port, data_dir=tmp_path / "data", extra=("--app-disk-quota", "8M"))
    c = await AsyncClient.connect(d.addr)
    await push(c, 9, 1, [2 * MiB] * 3, app=OTHER)
    await c.flush(OTHER, 9)
    sizes = [1 * MiB] * 4
    for shuffle in (1, 2, 3):
        await push(c, shuffle, 1, sizes)
        await c.flush(APP, shuffle)
    await wait_until(
        c.stats,
        lambda s: s["tier"]["moved_objects"] > 0 and s["disk"]["used_bytes"] <= 6 * MiB + 8 * MiB,
        30,
        "the application over its quota brought down to it",
    )
    moved = await tier.objects()
    assert moved and all(k.startswith(tuple(shuffle_prefix(APP, s) for s in (1, 2, 3))) for k in moved), moved
    for shuffle in (1, 2, 3):
        await check(c, shuffle, {"": [1]}, sizes)
    await check(c, 9, {"": [1]}, [2 * MiB] * 3, app=OTHER)
    for app in (APP, OTHER):
        await c.remove_application(app)
    assert await tier.objects() == []
    await c.close()


@within(180)
async def test_a_durable_commit_survives_its_daemon_killed(
    tier: Tier, tmp_path: Path, stopped: Callable[[DaemonProcess], None]
) -> None:
    """Map outputs pushed with durability object-store to a daemon that is then killed (-9) are read, byte-exact,
    through another daemon from the objects, without a replica: the read fails over to the object store. A
    reader with another application's token gets none of it; removing the application deletes the objects."""

    hosts = ["127.0.0.1", "127.0.0.2"]
    port = free_port(hosts)
    extra = ("--peers", ",".join(f"{h}:{port}" for h in hosts), *secret_flags(tmp_path, "cluster"))
    a, b = (tier.start(h, port, pool="32M", extra=extra) for h in hosts)

    async def connect(d: DaemonProcess, app_secret: str) -> AsyncClient:
        return await AsyncClient.connect(d.addr, secret="cluster", app_secret=app_secret)

    ca = await connect(a, "owner")
    sizes = [512 << 10, 3 * MiB, 1, 700 << 10]
    for attempt in (11, 12, 13):
        await push(ca, 1, attempt, sizes, durability="object-store")
    await push(ca, 1, 14, sizes)  # not durable
    s = await durable(ca, 3)
    assert s["tier"]["durable_attempts"] == 3 and s["tier"]["pending_attempts"] == 0, s["tier"]
    await ca.close()
    stopped(a)
    other = await connect(b, "intruder")
    with pytest.raises(ShuffledError):  # its token is not the one the objects' application is bound to
        await check(other, 1, {a.addr: [11]}, sizes)
    await other.close()
    cb = await connect(b, "owner")
    await check(cb, 1, {a.addr: [11, 12, 13]}, sizes)
    with pytest.raises(ShuffledError):  # the attempt that was not durable is gone with its daemon
        await check(cb, 1, {a.addr: [14]}, sizes)
    s = await cb.stats()
    assert s["tier"]["adopted_attempts"] == 3 and s["failover"]["recovered"] >= 4, (s["tier"], s["failover"])
    await cb.remove_application(APP)
    assert await tier.objects() == []
    await cb.close()


@within(180)
async def test_only_the_owners_token_deletes_an_applications_objects(
    tier: Tier, tmp_path: Path, stopped: Callable[[DaemonProcess], None]
) -> None:
    """An application pushes through a daemon without a data dir, so its spilled and its durable pieces are in
    objects. Another application's token, or none, sent to the other daemon as a propagated removal or
    unregistration deletes none of them (the peer refuses, and the objects' footers name their owner), while
    that daemon lives and after it is killed; the owner's own removal through the other daemon deletes every
    one, the lost daemon's too."""

    hosts = ["127.0.0.1", "127.0.0.2"]
    port = free_port(hosts)
    extra = ("--peers", ",".join(f"{h}:{port}" for h in hosts), *secret_flags(tmp_path, "cluster"))
    x, y = (tier.start(h, port, pool="16M", extra=extra) for h in hosts)

    async def connect(d: DaemonProcess, app_secret: str | None) -> AsyncClient:
        return await AsyncClient.connect(d.addr, secret="cluster", app_secret=app_secret)

    owner = await connect(x, "owner")
    durable_sizes, spilled_sizes = [3 * MiB, 1 * MiB], [8 * MiB] * 3
    for attempt in (1, 2):
        await push(owner, 1, attempt, durable_sizes, durability="object-store")
    for attempt in (3, 4):
        await push(owner, 2, attempt, spilled_sizes)
    s = await durable(owner, 2)
    assert s["tier"]["spilled_objects"] >= 1, s["tier"]
    held = sorted(await tier.objects())

    async def intrude(d: DaemonProcess) -> None:
        for secret in ("intruder", None):
            c = await connect(d, secret)
            for result in (await c.unregister_shuffle(APP, 1), await c.remove_application(APP)):
                assert all(answer != "ok" for answer in result.get("peers", {}).values()), result
            await c.close()
        assert set(held) <= set(await tier.objects())  # nothing deleted (a spill under way may add one)

    await intrude(y)
    await check(owner, 1, {"": [1, 2]}, durable_sizes)
    await check(owner, 2, {"": [3, 4]}, spilled_sizes)
    await owner.close()
    stopped(x)
    await intrude(y)  # the daemon that could refuse is gone: the footers still say whose the objects are
    c = await connect(y, "owner")
    assert (await c.stats())["tier"]["kept_objects"] >= 2 * len(held)
    result = await c.remove_application(APP)
    assert list(result["peers"].values()) != ["ok"], result  # the lost daemon did not answer ...
    assert await tier.objects() == []  # ... and its objects went all the same, on the owner's word
    await c.close()


@within(180)
async def test_a_daemon_stopped_longer_than_the_timeouts_keeps_its_objects(tier: Tier) -> None:
    """A live application on a daemon without a data dir holds durable and spilled objects older than the
    application TTL (3 s); the daemon is stopped (SIGSTOP) for several sweeps of the other daemon, each of
    which asks it and gets no answer within the admin timeout (2 s). Its lease is still good, so the sweep
    keeps every object (it used to take the silence for "holds nothing" and delete them all), and once the
    daemon resumes it reads all of them back."""

    hosts = ["127.0.0.1", "127.0.0.2"]
    port = free_port(hosts)
    peers = ",".join(f"{h}:{port}" for h in hosts)
    flags = (
        "--peers",
        peers,
        "--app-ttl",
        "3",
        "--object-store-sweep",
        "1",
        "--admin-timeout",
        "2",
        "--peer-timeout",
        "2",
    )
    x, y = (tier.start(h, port, pool="16M", extra=flags) for h in hosts)
    cx = await AsyncClient.connect(x.addr)
    durable_sizes, spilled_sizes = [2 * MiB, 2 * MiB], [8 * MiB] * 3
    await push(cx, 1, 1, durable_sizes, durability="object-store")
    for attempt in (2, 3):
        await push(cx, 2, attempt, spilled_sizes)
    busy = await cx.open_writer(APP, 3, 9, 9, 1)  # an open push: the application is live on x
    await durable(cx, 1)
    held = sorted(await tier.objects())
    cy = await AsyncClient.connect(y.addr)
    await wait_until(cy.stats, lambda s: s["tier"]["sweep_kept_objects"] >= len(held), 30, "objects past the TTL")
    x.proc.send_signal(signal.SIGSTOP)
    try:
        await _sweeps(cy, 4)
        assert sum("applications not answered" in line for line in y.log) >= 3
        assert set(held) <= set(await tier.objects())  # nothing deleted (a spill under way may add one)
        assert (await cy.stats())["tier"]["swept_objects"] == 0
    finally:
        x.proc.send_signal(signal.SIGCONT)
    await check(cx, 1, {"": [1]}, durable_sizes)
    await check(cx, 2, {"": [2, 3]}, spilled_sizes)
    await busy.abort()
    await cx.remove_application(APP)
    for c in (cx, cy):
        await c.close()


async def _sweeps(c: AsyncClient, n: int) -> None:
    """Until the daemon of `c` has swept `n` times more."""
    before = (await c.stats())["tier"]["sweeps"]
    await wait_until(c.stats, lambda s: s["tier"]["sweeps"] >= before + n, 60, f"{n} more sweeps")


@within(180)
async def test_a_daemon_restarting_keeps_its_objects_through_the_sweep(tier: Tier) -> None:
    """A live application's durable objects, older than the other daemon's TTL, on a daemon without a data
    dir that is killed, or stopped, and started again at once: the other daemon's sweep deleted them (the
    new life had not taken them back and said it held nothing; after a clean stop the lease was gone too).
    The restarted daemon now adopts what its own objects prove at start and says it is still restoring
    until then, and its lease stays through a stop. Nothing is deleted, and everything reads back."""

    hosts = ["127.0.0.1", "127.0.0.2"]
    port = free_port(hosts)
    flags = ("--peers", ",".join(f"{h}:{port}" for h in hosts), "--admin-timeout", "2", "--peer-timeout", "2")
    # x keeps the application (it is live); y sweeps every second what is older than 3 s
    x_flags, y_flags = (*flags, "--app-ttl", "600"), (*flags, "--app-ttl", "3", "--object-store-sweep", "1")
    x, y = tier.start(hosts[0], port, pool="16M", extra=x_flags), tier.start(hosts[1], port, extra=y_flags)
    cx = await AsyncClient.connect(x.addr)
    sizes = [MiB, 2 * MiB]
    for attempt in (1, 2):
        await push(cx, 1, attempt, sizes, durability="object-store")
    await durable(cx, 2)
    held = sorted(await tier.objects())
    await cx.close()
    cy = await AsyncClient.connect(y.addr)
    for how in (signal.SIGKILL, signal.SIGTERM):
        x.proc.send_signal(how)
        x.proc.wait(30)
        tier.daemons.remove(x)
        x = tier.start(hosts[0], port, pool="16M", extra=x_flags)
        await _sweeps(cy, 3)
        assert sorted(await tier.objects()) == held, f"after {how.name} and a restart"
        assert (await cy.stats())["tier"]["swept_objects"] == 0
        cx = await AsyncClient.connect(x.addr)
        await check(cx, 1, {"": [1, 2]}, sizes)
        await cx.close()
    cx = await AsyncClient.connect(x.addr)
    await cx.remove_application(APP)
    for c in (cx, cy):
        await c.close()


@within(180)
async def test_a_restarted_daemon_without_a_data_dir_serves_only_what_it_made_durable(
    tier: Tier, stopped: Callable[[DaemonProcess], None]
) -> None:
    """Killed (-9) and started again on the same address, a daemon with no data dir serves its durable attempts
    from their objects, and not an attempt whose pieces it had spilled to objects without its commit (it
    never claims what its objects do not prove); stopped with SIGTERM it uploads everything committed first,
    and serves all of it after the restart."""

    host = "127.0.0.1"
    port = free_port([host])
    d = tier.start(host, port)
    c = await AsyncClient.connect(d.addr)
    sizes = [2 * MiB] * 5
    await push(c, 1, 1, sizes, durability="object-store")
    await durable(c, 1)
    for attempt in (2, 3, 4):  # 30 MiB through a 16 MiB pool: spilled, not durable
        await push(c, 1, attempt, sizes)
    assert (await c.stats())["tier"]["spilled_objects"] > 0
    await c.close()
    stopped(d)
    tier.daemons.remove(d)
    d = tier.start(host, port)
    c = await AsyncClient.connect(d.addr)
    await check(c, 1, {"": [1]}, sizes)
    with pytest.raises(PartitionNotFound):
        await check(c, 1, {"": [2]}, sizes)
    await push(c, 2, 5, sizes)
    await c.close()
    d.stop()  # SIGTERM: what is committed is uploaded first
    tier.daemons.remove(d)
    d = tier.start(host, port)
    c = await AsyncClient.connect(d.addr)
    await check(c, 2, {"": [5]}, sizes)
    await check(c, 1, {"": [1]}, sizes)
    await c.remove_application(APP)
    await c.close()


@within(240)
@pytest.mark.parametrize("fault", ["refusing", "slow", "killed"])
async def test_a_failed_upload_never_counts_as_durable(
    tier: Tier, tmp_path: Path, fault: str, stopped: Callable[[DaemonProcess], None]
) -> None:
    """The object store behind a fault proxy answers nothing but 503s (its circuit breaker), holds every answer
    past the timeout, or is killed in the middle of the upload: the attempts are not durable and the daemon
    says why (write errors, a logged warning); once the store works again the upload is retried and they
    become durable, and nothing of the failed tries is left."""

    server = tier.s3
    proxy = FaultProxy("127.0.0.1", server.s3_address, frames=False)
    address = await proxy.start()
    host = "127.0.0.1"
    port = free_port([host])
    flags = ["--data-dir", "none", *tier.flags(f"http://{address}", "--object-store-timeout", "3")]
    d = DaemonProcess(host, port, "32M", flags, env=environ_without_aws(server.admin.env())).wait_ready()
    tier.daemons.append(d)
    c = await AsyncClient.connect(d.addr)
    await wait_until(c.stats, lambda s: s["object_store"]["state"] == "ready", 30, "the probe")
    sizes = [2 * MiB] * 4  # one object: its commit record goes with its pieces
    try:
        if fault == "refusing":
            await asyncio.to_thread(server.limit_writes, server.bucket, 0)
        elif fault == "slow":
            proxy.down.delay = 8.0
        else:
            proxy.up.rate = 4 * MiB
        before = proxy.up.passed
        await push(c, 1, 1, sizes, durability="object-store")
        if fault == "killed":
            await wait_until(lambda: _now(proxy.up.passed), lambda n: n > before + MiB, 30, "an upload under way")
            await asyncio.to_thread(server.kill)
        s = await wait_until(c.stats, lambda s: s["tier"]["write_errors"] >= 1, 60, "an upload failed")
        assert s["tier"]["durable_attempts"] == 0 and s["tier"]["pending_attempts"] == 1, s["tier"]
        await asyncio.to_thread(d.logged, "durable upload failed")
    finally:
        proxy.down.delay, proxy.up.rate = 0.0, 0
        if fault == "refusing":
            await asyncio.to_thread(server.limit_writes, server.bucket, None)
        if fault == "killed":
            await asyncio.to_thread(server.start)
            server.shell("s3.clean.uploads -timeAgo=0s")
    s = await durable(c, 1)
    assert s["tier"]["pending_attempts"] == 0
    await check(c, 1, {"": [1]}, sizes)
    await c.remove_application(APP)
    await c.close()
    d.stop()
    tier.daemons.remove(d)
    await proxy.close()


async def _now(value: int) -> int:
    return value


@within(120)
async def test_the_sweep_deletes_what_a_crashed_daemon_left(
    tier: Tier, stopped: Callable[[DaemonProcess], None]
) -> None:
    """A daemon killed (-9) leaves objects of an application no daemon holds any more: another daemon's sweep
    (every second, application TTL 2 s) deletes them once the killed daemon's lease expired (4 s), saying
    why, and keeps the objects of an application it holds; then the dead daemon's lease goes too."""

    hosts = ["127.0.0.1", "127.0.0.2"]
    port = free_port(hosts)
    peers = ",".join(f"{h}:{port}" for h in hosts)
    short = ("--peers", peers, *SHORT_LEASE)
    a = tier.start(hosts[0], port, extra=short)
    b = tier.start(hosts[1], port, extra=(*short, "--object-store-sweep", "1", "--app-ttl", "2"))
    ca, cb = await AsyncClient.connect(a.addr), await AsyncClient.connect(b.addr)
    sizes = [2 * MiB] * 4
    await push(ca, 1, 1, sizes, durability="object-store")
    await durable(ca, 1)
    kept = "app-kept"
    w = await cb.open_writer(kept, 1, 1, 1, 1, durability="object-store")
    await w.write(0, b"kept" * 1000)
    await w.commit()
    await durable(cb, 1)
    busy = await cb.open_writer(kept, 1, 2, 2, 1)  # an open push: the application does not expire on b
    await ca.close()
    stopped(a)
    await wait_until(cb.stats, lambda s: s["tier"]["swept_expired"] >= 1, 30, "the crashed daemon's objects swept")
    await asyncio.to_thread(b.logged, "past its lease", "object store swept")
    await wait_until(tier.keys, lambda keys: not any(lease_node(k) == node_dir(a.addr) for k in keys))
    left = await tier.objects()
    assert left and all(k.startswith("app-app-kept/") for k in left), left
    await busy.abort()
    await cb.remove_application(kept)
    await cb.close()


@within(120)
async def test_a_full_store_fails_the_pushes_that_need_its_room(tmp_path: Path) -> None:
    """A store that is full (every volume of the server used) answers writes with 500: the daemon without a data
    dir says so to the pushes that wait for room (STORAGE_ERROR naming the store), at once rather than after
    their timeout, marks nothing durable that is not, and keeps serving what it holds."""
    server = SeaweedFS(tmp_path / "s3", volume_size_mb=8, volume_max=2)
    await asyncio.to_thread(server.start)
    full = Tier(server)
    try:
        host = "127.0.0.1"
        d = full.start(host, free_port([host]))
        c = await AsyncClient.connect(d.addr)
        sizes = [1 * MiB] * 4
        pushed: list[int] = []
        with pytest.raises(StorageError, match="object store"):
            for attempt in range(1, 40):
                await push(c, 1, attempt, sizes, durability="object-store")
                pushed.append(attempt)
        s = await c.stats()
        assert s["tier"]["write_errors"] >= 1 and s["object_store"]["errors"].get("put", 0) >= 1, s["tier"]
        assert s["tier"]["durable_attempts"] < len(pushed), "more durable than the store could take"
        await check(c, 1, {"": pushed[-2:]}, sizes)
        await c.remove_application(APP)
        await c.close()
        for d in full.daemons:
            d.stop()
        assert await full.objects() == []
    finally:
        await asyncio.to_thread(server.close)


@within(180)
async def test_durable_objects_of_a_fast_map_stage_are_a_part_or_more(tier: Tier) -> None:
    """Map outputs committed while an upload is under way wait for a part's worth of their own: the bytes in
    flight do not count as pending (they made a fast stage of 62 MiB into objects of 3.5 MiB upwards, 99
    PUTs per GiB). Every durable object but the last holds at least a part (`--object-store-part-size`)."""
    part = int(PART.rstrip("M")) * MiB
    # the stage's end (no commit for the delay) may leave a small object: not before it, however busy the machine
    d = tier.start("127.0.0.1", free_port(["127.0.0.1"]), pool="96M", extra=("--object-store-durable-delay", "5"))
    clients = [await AsyncClient.connect(d.addr) for _ in range(4)]
    sizes = [640 * 1024] * 4  # 2.5 MiB a map output, 16 of them

    async def stage(c: AsyncClient, first: int) -> None:
        for attempt in range(first, first + 4):
            await push(c, 1, attempt, sizes, durability="object-store")

    await asyncio.gather(*(stage(c, 1 + 4 * i) for i, c in enumerate(clients)))
    await durable(clients[0], 16)
    objects = sorted(o.size for o in await tier.store().list_objects() if lease_node(o.key) is None)
    assert objects[0] > 0 and all(size >= part for size in objects[1:]), [f"{s / MiB:.1f} MiB" for s in objects]
    await check(clients[0], 1, {"": list(range(1, 17))}, sizes)
    await clients[0].remove_application(APP)
    for c in clients:
        await c.close()
