"""The object-store layer (shuffled/server/storage/objects.py) against a real S3 server, SeaweedFS on loopback:
large objects round trip byte for byte and read back in ranges, uploads stay within 64 PUTs per GiB, a
failed upload leaves nothing behind and never reports success, a slow or refusing server gives a clear
error within the timeouts, the sweep deletes by prefix and age, credentials come from the environment or
the shared AWS files, and a daemon whose store cannot be used is not ready and says why, without ever
showing a secret. Every test ends with nothing under its prefix."""

from __future__ import annotations

import asyncio
import itertools
import mmap
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from functools import partial
from pathlib import Path

import pytest
import pytest_asyncio

from shuffled.protocol.errors import StorageError
from shuffled.server.storage.lease import lease_node
from shuffled.server.storage.object_format import node_dir
from shuffled.server.storage.objects import ObjectNotFound, ObjectStore
from shuffled.server.storage.probe import ObjectStoreProbe, probe
from tests.aio import run, within
from tests.cluster import DaemonProcess, http_get, poll_until, wait_until
from tests.integration.faultproxy import FaultProxy
from tests.seaweedfs import SeaweedFS, environ_without_aws, seaweedfs_fixture
from tests.units import MiB

SEGMENT = 32 << 10
PART = 5 * MiB

s3 = seaweedfs_fixture()


def _store(
    server: SeaweedFS,
    prefix: str,
    *,
    endpoint: str | None = None,
    environ: dict[str, str] | None = None,
    bucket: str | None = None,
    **settings: float,
) -> ObjectStore:
    config = server.store_config(prefix, bucket, endpoint, part_size=int(settings.pop("part_size", PART)), **settings)
    return ObjectStore(config, environ=environ if environ is not None else server.admin.env())


@pytest_asyncio.fixture
async def store(s3: SeaweedFS) -> AsyncIterator[ObjectStore]:
    """A store under a prefix of the test's own, checked empty (no object, no upload under way) at the end."""
    objects = _store(s3, f"test-{uuid.uuid4().hex[:12]}", timeout=10.0, retries=2)
    yield objects
    await asyncio.wait_for(objects.close(), 60)
    assert await asyncio.wait_for(objects.list_objects(), 30) == []
    assert s3.incomplete_uploads() == []


def _segments(data: bytes | mmap.mmap) -> list[memoryview]:
    """The data as 32 KiB memoryviews, as pool segments hand it to the layer."""
    view = memoryview(data)
    return [view[i : i + SEGMENT] for i in range(0, len(view), SEGMENT)]


def _pool(nbytes: int, seed: int) -> mmap.mmap:
    """Anonymous memory (like the daemon's pool) filled with bytes that differ at every offset."""
    pool = mmap.mmap(-1, nbytes)
    rng = random.Random(seed)
    block = rng.randbytes(MiB + 7)
    for i in range(0, nbytes, MiB):
        pool[i : i + MiB] = block[i % 7 : i % 7 + min(MiB, nbytes - i)]
    return pool


@within(120)
async def test_large_objects_round_trip_and_read_back_in_ranges(store: ObjectStore) -> None:
    """A 21 MiB object written from pool memoryviews (five parts) and a small one (one PUT) read back byte for
    byte in ranges, including ranges that cross part boundaries, into several target segments at once."""

    pool = _pool(21 * MiB + 12345, seed=1)
    assert await store.write("shuffle/big", _segments(pool)) == len(pool)
    small = os.urandom(100_000)
    assert await store.write("shuffle/small", [small]) == len(small)
    assert sorted((o.key, o.size) for o in await store.list_objects("shuffle/")) == [
        ("shuffle/big", len(pool)),
        ("shuffle/small", len(small)),
    ]
    assert store.stats.parts == 5 and store.stats.objects_held == 2
    rng = random.Random(2)
    ranges = [(0, SEGMENT), (len(pool) - 4000, 4000), (PART - 1, 2), (2 * PART - 100_000, 3 * MiB)]
    ranges += [(k * PART - rng.randrange(1, SEGMENT), rng.randrange(SEGMENT, 4 * MiB)) for k in (1, 2, 3, 4)]
    for start, length in ranges:
        length = min(length, len(pool) - start)
        target = bytearray(length)
        view = memoryview(target)
        cut = [0, *sorted(rng.sample(range(1, length), min(3, length - 1))), length]
        assert await store.read_into("shuffle/big", start, [view[a:b] for a, b in itertools.pairwise(cut)])
        assert target == pool[start : start + length], (start, length)
    back = bytearray(len(small))
    await store.read_into("shuffle/small", 0, [memoryview(back)])
    assert back == small
    with pytest.raises(StorageError, match="asked for 100 bytes"):
        await store.read_into("shuffle/small", len(small) - 50, [memoryview(bytearray(100))])
    assert await store.delete_prefix("shuffle/") == 2
    for start in (
        0,
        10,
    ):  # an object that is gone is ObjectNotFound (a read of it: PartitionNotFound), whole or a range
        with pytest.raises(ObjectNotFound, match="no such object"):
            await store.read_into("shuffle/small", start, [memoryview(bytearray(100))])
    assert store.stats.objects_held == 0 and store.stats.bytes_held == 0


@within(120)
async def test_at_most_64_puts_per_gib(s3: SeaweedFS) -> None:
    """128 MiB written as two objects with the default 16 MiB parts: the server counts 8 PUT requests, 64 per
    GiB (retries included: the count is the server's), and the layer's own part count agrees."""

    objects = _store(s3, f"test-{uuid.uuid4().hex[:12]}", part_size=16 * MiB)
    pool = _pool(128 * MiB, seed=3)
    half = len(pool) // 2
    before = s3.request_counts().get("PUT", 0)
    for i, chunk in enumerate((_segments(pool)[: half // SEGMENT], _segments(pool)[half // SEGMENT :])):
        await objects.write(f"run/{i}", chunk)
    puts = s3.request_counts().get("PUT", 0) - before
    assert puts == objects.stats.parts == 8, (puts, objects.stats.parts)
    assert puts / (len(pool) / (1 << 30)) <= 64
    await objects.delete_prefix("")
    assert await objects.list_objects() == []


@within(120)
async def test_an_upload_cut_mid_way_raises_and_leaves_nothing(s3: SeaweedFS) -> None:
    """Every connection is cut 1 MiB into its upstream bytes (before any 5 MiB part is through): the write
    raises after its retries, the client aborted the multipart upload, and neither an object nor an
    incomplete upload is left; once the cutting stops the same write succeeds."""

    proxy = FaultProxy("127.0.0.1", s3.s3_address, frames=False)
    address = await proxy.start()
    objects = _store(s3, f"test-{uuid.uuid4().hex[:12]}", endpoint=f"http://{address}", timeout=5.0, retries=1)
    try:
        proxy.up.cut_after = MiB
        pool = _pool(12 * MiB, seed=4)
        with pytest.raises(StorageError, match="object store put") as failed:
            await objects.write("cut/obj", _segments(pool))
        assert proxy.up.fired.is_set(), "the cut never happened"
        assert objects.stats.objects_held == 0 and objects.stats.bytes_up == 0, failed.value
        assert await objects.list_objects() == []
        assert s3.incomplete_uploads() == []
        proxy.up.cut_after = None
        await objects.write("cut/obj", _segments(pool))
        await objects.delete("cut/obj")
        assert await objects.list_objects() == []
    finally:
        await proxy.close()


@within(120)
async def test_a_caller_that_stops_waiting_mid_upload_leaves_nothing(s3: SeaweedFS) -> None:
    """The caller of a throttled 12 MiB write is cancelled while the multipart upload is under way (the
    server lists it): the client is never told to drop it half-way (which would leave the upload
    incomplete), so it completes, and its object is deleted; `close` waits for that."""

    proxy = FaultProxy("127.0.0.1", s3.s3_address, frames=False)
    address = await proxy.start()
    objects = _store(s3, f"test-{uuid.uuid4().hex[:12]}", endpoint=f"http://{address}", timeout=20.0)
    try:
        proxy.up.rate = 4 * MiB
        write = asyncio.ensure_future(objects.write("gone/obj", _segments(_pool(12 * MiB, seed=6))))
        await asyncio.to_thread(poll_until, s3.incomplete_uploads, 20, "the upload under way")
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        await asyncio.wait_for(objects.close(), 60)
        assert objects.stats.objects_held == 0
        assert await objects.list_objects() == []
        assert s3.incomplete_uploads() == []
    finally:
        await proxy.close()


@within(180)
async def test_the_server_killed_mid_upload_fails_the_write_within_its_bounds(tmp_path: Path) -> None:
    """The server is killed while a 40 MiB upload is under way (throttled through the proxy so it is): the
    write raises (the retries find nothing listening) within one request's bound, and after a restart on the
    same data the object does not exist. The upload the dead server could not be told to abort is still
    there, as it would be on any S3 (a lifecycle rule removes those): the test shows it, then cleans it."""

    server = SeaweedFS(tmp_path).start()
    proxy = FaultProxy("127.0.0.1", server.s3_address, frames=False)
    address = await proxy.start()
    try:
        objects = _store(server, "crash", endpoint=f"http://{address}", timeout=3.0, retries=1)
        proxy.up.rate = 8 * MiB
        write = asyncio.ensure_future(objects.write("crash/obj", _segments(_pool(40 * MiB, seed=5))))
        await asyncio.to_thread(poll_until, lambda: server.request_counts().get("PUT", 0) >= 1, 30, "a part uploaded")
        server.kill()
        started = time.monotonic()
        with pytest.raises(StorageError, match="object store put"):
            await write
        assert time.monotonic() - started < objects.config.request_bound() * 2
        await asyncio.to_thread(server.start)
        proxy.up.rate = 0
        assert await objects.list_objects() == []
        assert objects.stats.objects_held == 0
        assert len(server.incomplete_uploads()) <= 1
        server.shell("s3.clean.uploads -timeAgo=0s")
        assert server.incomplete_uploads() == []
    finally:
        await proxy.close()
        server.close()


@within(60)
async def test_503s_give_a_clear_error_within_the_timeout(s3: SeaweedFS) -> None:
    """The server's circuit breaker answers every write to a bucket 503: the write fails after its retries,
    quickly, naming the status and the server's error code; lifting the limit lets writes through again."""

    bucket = f"busy-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(s3.create_bucket, bucket)
    objects = _store(s3, "p", bucket=bucket, timeout=2.0, retries=2)

    async def write_until(refused: bool) -> None:
        """The gateway applies a breaker change when the filer tells it: write until it has."""
        deadline = time.monotonic() + 20
        while True:
            try:
                await objects.write("x", [b"payload"])
                if not refused:
                    return
                await objects.delete("x")
            except StorageError as exc:
                if refused and "503" in exc.message:
                    return
            assert time.monotonic() < deadline, "the circuit breaker change never took effect"

    await asyncio.to_thread(s3.limit_writes, bucket, 0)
    try:
        await write_until(refused=True)
        started = time.monotonic()
        with pytest.raises(StorageError, match="503") as failed:
            await objects.write("x", [b"payload"])
        assert time.monotonic() - started < objects.config.request_bound()
        assert "ErrTooManyRequest" in failed.value.message
        assert objects.stats.objects_held == 0
    finally:
        await asyncio.to_thread(s3.limit_writes, bucket, None)
    await write_until(refused=False)
    await objects.delete("x")
    assert await objects.list_objects() == []


@within(120)
@pytest.mark.parametrize("fault", ["delay", "blackhole"])
async def test_a_slow_or_silent_server_times_out(s3: SeaweedFS, fault: str) -> None:
    """Answers held back 4 s, or swallowed, against a 1 s request timeout and one retry: writes, reads and
    listings fail with the timeout named, within the bound the settings give, and never hang."""

    objects = _store(s3, f"test-{uuid.uuid4().hex[:12]}", timeout=10.0, retries=1)
    await objects.write("slow/obj", [b"x" * 1000])
    proxy = FaultProxy("127.0.0.1", s3.s3_address, frames=False)
    address = await proxy.start()
    slow = _store(s3, objects.config.prefix, endpoint=f"http://{address}", timeout=1.0, retries=1)
    if fault == "delay":
        proxy.down.delay = 4.0
    else:
        proxy.down.blackhole = True
    bound = slow.config.request_bound() + 1.0
    try:
        for call in (
            slow.write("slow/other", [b"y" * 1000]),
            slow.read_into("slow/obj", 0, [memoryview(bytearray(10))]),
            slow.list_objects("slow/"),
        ):
            started = time.monotonic()
            with pytest.raises(StorageError, match=r"did not answer within 1s|no answer within|did not complete"):
                await call
            assert time.monotonic() - started < bound
        await slow.close()
    finally:
        await proxy.close()
    await objects.delete_prefix("slow/")
    assert await objects.list_objects() == []


@within(60)
async def test_credentials_from_the_shared_files_and_the_environment_first(s3: SeaweedFS, tmp_path: Path) -> None:
    """A profile in the shared credentials file (AWS_PROFILE), or in the config file as `[profile NAME]`,
    is used when the environment has no keys; keys in the environment win over the files."""

    creds = tmp_path / "credentials"
    creds.write_text(
        f"[default]\naws_access_key_id = {s3.reader.access_key}\naws_secret_access_key = {s3.reader.secret_key}\n"
        f"[writer]\naws_access_key_id = {s3.admin.access_key}\naws_secret_access_key = {s3.admin.secret_key}\n"
    )
    config = tmp_path / "config"
    config.write_text(
        f"[profile cfg]\naws_access_key_id = {s3.admin.access_key}\n"
        f"aws_secret_access_key = {s3.admin.secret_key}\nregion = us-east-1\n"
    )
    files = {"AWS_SHARED_CREDENTIALS_FILE": str(creds), "AWS_CONFIG_FILE": str(config), "HOME": str(tmp_path)}
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    cases = [
        ({**files, "AWS_PROFILE": "writer"}, None),
        ({**files, "AWS_PROFILE": "cfg"}, None),
        (files, "access denied"),  # [default] is the read-only identity
        ({**files, **s3.admin.env()}, None),  # the environment first
    ]
    for environ, failure in cases:
        objects = _store(s3, prefix, environ=environ, timeout=5.0, retries=0)
        reason = await probe(objects)
        assert (reason is None) if failure is None else (failure in (reason or "")), (environ, reason)
        assert s3.admin.secret_key not in repr(objects) and s3.reader.secret_key not in repr(objects)
    assert await _store(s3, prefix).list_objects() == []


def _daemon(server: SeaweedFS, url: str, env: dict[str, str], endpoint: str | None = None) -> DaemonProcess:
    flags = [
        "--data-dir",
        "none",
        "--object-store",
        url,
        "--object-store-endpoint",
        endpoint or server.endpoint,
        "--object-store-path-style",
        "on",
        "--object-store-timeout",
        "2",
        "--object-store-retries",
        "1",
    ]
    return DaemonProcess("127.0.0.1", 0, "16M", flags, env=environ_without_aws(env)).wait_ready()


def _readyz(d: DaemonProcess) -> tuple[int, str]:
    return http_get(d.http, "/readyz")


def _probed(d: DaemonProcess) -> tuple[int, str] | None:
    """/readyz once the object-store probe has an outcome (None while it runs)."""
    status, text = _readyz(d)
    return None if "probing" in text or "starting" in text else (status, text)


def test_a_daemon_is_ready_only_once_its_object_store_works(s3: SeaweedFS) -> None:
    """With a usable store the daemon becomes ready and its stats and metrics say so; with wrong credentials, a
    missing bucket, an endpoint nobody listens on or a read-only identity /readyz fails with that reason.
    No secret shows in the log, /readyz, /metrics or the stats."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    wrong = {"AWS_ACCESS_KEY_ID": s3.admin.access_key, "AWS_SECRET_ACCESS_KEY": "not-the-" + s3.admin.secret_key}
    cases = [
        ("ok", s3.url(prefix), s3.admin.env(), None, "ready"),
        ("wrong credentials", s3.url(prefix), wrong, None, "wrong credentials"),
        ("no bucket", s3.url(prefix, "no-such-bucket"), s3.admin.env(), None, "no such bucket 'no-such-bucket'"),
        ("unreachable", s3.url(prefix), s3.admin.env(), "http://127.0.0.1:9", "unreachable (Connection refused)"),
        ("read-only", s3.url(prefix), s3.reader.env(), None, "access denied"),
    ]
    secrets = (s3.admin.secret_key, s3.reader.secret_key, wrong["AWS_SECRET_ACCESS_KEY"])
    for name, url, env, endpoint, expected in cases:
        d = _daemon(s3, url, env, endpoint)
        try:
            status, text = poll_until(partial(_probed, d), 30, f"{name}: the probe's outcome")
            assert expected in text, (name, status, text)
            assert status == (200 if name == "ok" else 503), (name, text)
            metrics = http_get(d.http, "/metrics")[1]
            state = "ready" if name == "ok" else "failed"
            assert f'shuffled_object_store_state{{state="{state}"}} 1.0' in metrics
            visible = "".join(d.log) + text + metrics
            assert not any(secret in visible for secret in secrets), name
        finally:
            d.stop()
    assert s3.incomplete_uploads() == []


def test_no_probe_object_is_left_behind(s3: SeaweedFS) -> None:
    """The probes of the daemons above (and of a daemon started now) delete what they wrote: what is left is
    the daemon's lease, which stays to expire."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    d = _daemon(s3, s3.url(prefix), s3.admin.env())
    try:
        poll_until(lambda: _readyz(d)[0] == 200, 30, "ready")
    finally:
        d.stop()

    async def listing() -> Sequence[str]:
        return [o.key for o in await _store(s3, prefix).list_objects()]

    left = run(listing(), 30)
    assert [lease_node(k) for k in left] == [node_dir(d.addr)], (left, "".join(d.log))


@within(60)
async def test_a_probe_under_way_at_stop_still_deletes_its_object(s3: SeaweedFS) -> None:
    """A daemon stopping while its probe reads back what it wrote (every request held back 0.5 s each way)
    waits for the probe to delete its object: cancelled there, the probe's delete was still on its way when
    the daemon's loop ended, and the object stayed under the daemon's prefix."""
    objects = _store(s3, f"test-{uuid.uuid4().hex[:12]}", timeout=10.0, retries=1)
    proxy = FaultProxy("127.0.0.1", s3.s3_address, frames=False)
    address = await proxy.start()
    proxy.up.delay = proxy.down.delay = 0.5
    slow = _store(s3, objects.config.prefix, endpoint=f"http://{address}", timeout=10.0, retries=1)
    checker = ObjectStoreProbe(slow, slow.stats)
    try:
        checker.start()

        async def written() -> int:
            return slow.stats.requests.get("put", 0)

        await wait_until(written, lambda n: n > 0, 10, "the probe's object written")
        await checker.close()
        assert await objects.list_objects() == []
    finally:
        await proxy.close()
    assert slow.stats.state == "ready", slow.stats.reason
    await objects.close()


def test_a_daemon_becomes_ready_when_its_store_comes_right(s3: SeaweedFS) -> None:
    """A failed probe is tried again (every 10 s): once the missing bucket exists, /readyz turns 200."""
    bucket = f"later-{uuid.uuid4().hex[:8]}"
    d = _daemon(s3, s3.url("p", bucket), s3.admin.env())
    try:
        status, text = poll_until(lambda: _probed(d), 30, "the first probe's outcome")
        assert status == 503 and "no such bucket" in text, text
        s3.create_bucket(bucket)
        poll_until(lambda: _readyz(d)[0] == 200, 40, "ready once the bucket exists")
    finally:
        d.stop()
