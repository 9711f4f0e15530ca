"""Real daemon processes on loopback addresses for the integration tests."""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Re-exported: the tests take the daemon process and a free port from this harness.
from shuffled.launch import DaemonProcess as DaemonProcess
from shuffled.launch import free_port as free_port
from shuffled_client import AsyncClient
from tests.wheel import Installed

#: the test run's data dirs (the daemons' default, data-dir auto, is a system directory that outlives the run)
_DATA_ROOT = Path(tempfile.mkdtemp(prefix="shuffled-test-data-"))
atexit.register(shutil.rmtree, _DATA_ROOT, True)


def daemon_data_dir(host: str, port: int) -> str:
    """The data dir of the daemon on this address, as `data-dir auto` would give it: a restart on the same
    address finds its data again. Port 0 names no address, so such a daemon gets a directory of its own."""
    if port == 0:
        return tempfile.mkdtemp(prefix=f"{host}-", dir=_DATA_ROOT)
    return str(_DATA_ROOT / f"{host}-{port}")


def start_daemon(
    host: str,
    port: int,
    pool_size: str = "64M",
    extra: list[str] | None = None,
    preexec: Callable[[], None] | None = None,
    installed: Installed | None = None,
) -> DaemonProcess:
    """A ready daemon with the test run's data dir for its address, unless the test names one; the tree's
    package, or the one `installed` from a wheel (tests/wheel.py)."""
    flags = extra or []
    if "--data-dir" not in flags:
        flags = ["--data-dir", daemon_data_dir(host, port), *flags]
    if installed is None:
        return DaemonProcess(host, port, pool_size, flags, preexec=preexec).wait_ready()
    return DaemonProcess(
        host, port, pool_size, flags, preexec=preexec, interpreter=installed.interpreter, env=installed.env
    ).wait_ready()


class Cluster:
    """Daemons that are each other's peers, one per loopback address (``n`` of them: 127.0.0.1 upwards),
    all on one port; stopped on leaving a ``with`` block. `installed`: daemons of a wheel (tests/wheel.py)."""

    def __init__(
        self,
        hosts: int | list[str],
        pool_size: str = "64M",
        extra: list[str] | None = None,
        installed: Installed | None = None,
    ) -> None:
        if isinstance(hosts, int):
            hosts = [f"127.0.0.{i + 1}" for i in range(hosts)]
        port = free_port(hosts)
        peers = ",".join(f"{h}:{port}" for h in hosts)
        self.daemons: list[DaemonProcess] = []
        try:
            for h in hosts:
                flags = ["--peers", peers, *(extra or [])]
                self.daemons.append(start_daemon(h, port, pool_size, flags, installed=installed))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for d in self.daemons:
            d.stop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cluster_fixture(hosts: int | list[str], pool_size: str = "64M", extra: list[str] | None = None) -> Any:
    """A module-scoped fixture of a running `Cluster`, named by the test module's assignment
    (``pair = cluster_fixture(2)``): the daemons start once per module, as starting them takes a second."""

    @pytest.fixture(scope="module")
    def running() -> Iterator[Cluster]:
        with Cluster(hosts, pool_size, extra) as cluster:
            yield cluster

    return running


async def wait_until(
    probe: Callable[[], Awaitable[Any]], check: Callable[[Any], bool], timeout: float = 20.0, what: str = ""
) -> Any:
    """Poll a condition (e.g. daemon stats) until it holds; fail with the last value seen."""
    deadline = time.monotonic() + timeout
    value = await probe()
    while not check(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s ({what}): last value {value!r}")
        await asyncio.sleep(0.02)
        value = await probe()
    return value


def secret_flags(directory: Path, secret: str) -> list[str]:
    """A daemon's flags for authentication: the cluster secret (every application has it) and a peer
    secret (only daemons have it), written to files in ``directory``."""
    flags = []
    files = (("--secret-file", "secret", secret), ("--peer-secret-file", "peer-secret", "peer-" + secret))
    for flag, name, value in files:
        path = directory / name
        path.write_text(value + "\n")
        path.chmod(0o600)
        flags += [flag, str(path)]
    return flags


def poll_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """The blocking counterpart of `wait_until`, for tests without an event loop (Spark, HTTP probes)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what}")
        time.sleep(0.05)


async def pool_settled(client: AsyncClient, timeout: float = 20.0) -> dict[str, Any]:
    """Wait until the daemon holds exactly its stored data: no reads, pushes or lent buffers left, no push
    window counted against a share (see shuffled/server/accounting/shares.py) and no shared-memory push slot
    held."""

    def settled(s: dict[str, Any]) -> bool:
        streams, credit = s["streams"], s["credit"]
        return bool(
            s["pool"]["used"] == s["store"]["stored_segments"]
            and credit["push_floor_segments"] == 0
            and credit["push_slots"] == 0
            and credit["push_extra_segments"] == 0
            and s["pool"]["local_pools"] == 0
            and streams["served"] == 0
            and streams["pushing"] == 0
            and streams["remote_channels"] == 0
            and streams["inflight_buffers"] == 0
        )

    return await wait_until(client.stats, settled, timeout, "pool holds only stored data")  # type: ignore[no-any-return]


def payload(attempt: int, partition: int, size: int) -> bytes:
    """Deterministic bytes that differ per attempt and partition (so a mix-up shows)."""
    seed = f"{attempt}:{partition}:".encode()
    block = (seed * (64 // len(seed) + 1))[:64]
    return (block * (size // 64 + 1))[:size]


def rss(pid: int) -> int:
    import psutil

    return int(psutil.Process(pid).memory_info().rss)


def env_without_proxy() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}


def http_get(address: str, path: str, timeout: float = 10.0) -> tuple[int, str]:
    """GET http://address/path → (status, body); HTTP errors are returned, not raised."""
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback never goes through a proxy
    try:
        with opener.open(f"http://{address}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric_samples(exposition: str) -> dict[str, float]:
    """Prometheus text exposition → {'name{labels}': value} (labels as written by the daemon)."""
    out: dict[str, float] = {}
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
