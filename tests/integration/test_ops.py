"""Operating real daemons: metrics that count what moved, health and readiness probes,
structured logs, and graceful shutdown on SIGTERM."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import threading
from typing import Any, cast

import pytest
import uvloop

from shuffled.config import DATA_DIR_NONE, DaemonConfig
from shuffled.server.daemon import Daemon
from shuffled_client import AsyncClient, PartitionNotFound, ShuffledError, ShuttingDown
from tests.aio import run, within
from tests.cluster import (
    Cluster,
    DaemonProcess,
    cluster_fixture,
    free_port,
    http_get,
    metric_samples,
    payload,
    poll_until,
    start_daemon,
    wait_until,
)
from tests.shuffles import push
from tests.units import KiB

SEGMENT = 32 * KiB


pair = cluster_fixture(2, pool_size="64M")


async def _scrape(d: DaemonProcess) -> dict[str, float]:
    status, body = await asyncio.to_thread(http_get, d.http, "/metrics")
    assert status == 200, body
    return metric_samples(body)


@within(60)
async def test_metrics_count_bytes_pushed_served_and_relayed(pair: Cluster) -> None:
    """Counters match exactly what a push, a local read and a relayed read moved."""

    da, db = pair.daemons
    a, b = await AsyncClient.connect(da.addr), await AsyncClient.connect(db.addr)
    before_a, before_b = await _scrape(da), await _scrape(db)
    sizes = [100 * KiB, 40 * KiB, 3 * SEGMENT]
    await push(a, "m-app", 1, 1, sizes)
    await push(b, "m-app", 1, 2, sizes)
    async with a.read("m-app", 1, 0, 3, {"": [1], db.addr: [2]}) as reader:
        got = await reader.read_all()
    assert len(got) == 2 * sum(sizes)
    with pytest.raises(PartitionNotFound):
        async with a.read("m-app", 1, 0, 1, {"": [99]}) as missing:
            await missing.read_all()
    stats = await a.stats()
    after_a, after_b = await _scrape(da), await _scrape(db)

    def floats(value: Any) -> list[Any]:
        if isinstance(value, dict):
            return [f for v in value.values() for f in floats(v)]
        return [value] if isinstance(value, float) else []

    assert not floats(stats), "admin bodies are MessagePack without floats (JVM clients refuse them)"

    def delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
        return after[key] - before.get(key, 0.0)

    total = sum(sizes)
    # Data bytes (as Spark counts them), in packed groups filled to the segment size.
    assert delta(after_a, before_a, "shuffled_pushed_bytes_total") == total
    assert delta(after_a, before_a, "shuffled_pushed_buffers_total") == -(-total // SEGMENT)
    assert delta(after_a, before_a, "shuffled_map_outputs_committed_total") == 1
    assert delta(after_a, before_a, 'shuffled_served_bytes_total{source="local"}') == total
    assert delta(after_a, before_a, 'shuffled_served_bytes_total{source="relayed"}') == total
    assert delta(after_b, before_b, 'shuffled_served_bytes_total{source="local"}') == total  # to A, a peer
    assert delta(after_a, before_a, 'shuffled_transport_sent_bytes_total{role="client"}') > 2 * total
    assert delta(after_b, before_b, 'shuffled_transport_sent_bytes_total{role="peer"}') > total
    assert delta(after_a, before_a, 'shuffled_transport_received_bytes_total{role="client"}') > total
    assert delta(after_a, before_a, 'shuffled_errors_total{code="PARTITION_NOT_FOUND"}') == 1
    assert delta(after_a, before_a, "shuffled_push_duration_seconds_count") == 1
    assert delta(after_a, before_a, 'shuffled_read_duration_seconds_count{source="relayed"}') == 1
    assert delta(after_a, before_a, 'shuffled_admin_duration_seconds_count{op="stats"}') == 1
    assert delta(after_a, before_a, 'shuffled_credit_granted_total{kind="push"}') >= 7
    assert delta(after_a, before_a, 'shuffled_credit_granted_total{kind="read"}') >= 2
    assert after_a['shuffled_connections{role="client"}'] == 1
    assert after_a['shuffled_connections{role="peer"}'] == 1
    assert after_a["shuffled_store_bytes"] >= total
    assert (
        after_a["shuffled_pool_used_segments"] + after_a["shuffled_pool_free_segments"]
        == (after_a["shuffled_pool_segments"])
    )
    await a.close()
    await b.close()


@within(30)
async def test_a_daemon_started_in_this_process_runs_on_uvloop() -> None:
    """Daemons the tests start in their own process run on uvloop, as `shuffled serve` runs them: the tests'
    loop is uvloop's, and so is the transport the daemon serves a client's connection on (tests/conftest.py)."""
    daemon = Daemon(DaemonConfig(port=0, metrics_port=-1, pool_size=4 << 20, data_dir="none"))
    await daemon.start()
    try:
        async with await AsyncClient.connect(daemon.node) as c:
            await c.stats()
            [served] = daemon.connections
            assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
            assert type(served.transport).__module__.startswith("uvloop"), type(served.transport)
    finally:
        await daemon.stop()


def test_healthz_fails_while_the_event_loop_is_stalled() -> None:
    """A loop blocked by a stuck callback turns /healthz to 503 (the probe restarts it);
    /metrics and /readyz do not hang either. When the loop runs again, /healthz recovers."""
    started, release, stop_flag = threading.Event(), threading.Event(), threading.Event()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        config = DaemonConfig(port=0, metrics_port=0, pool_size=4 << 20, stall_timeout=0.5, data_dir=DATA_DIR_NONE)
        daemon = Daemon(config)
        await daemon.start()
        holder["daemon"], holder["loop"] = daemon, asyncio.get_running_loop()
        started.set()
        while not stop_flag.is_set():
            await asyncio.sleep(0.05)
        await daemon.stop()

    thread = threading.Thread(target=lambda: run(serve(), 120), daemon=True)
    thread.start()
    assert started.wait(30)
    daemon, loop = holder["daemon"], holder["loop"]
    try:
        address = daemon.ops.address
        assert http_get(address, "/healthz") == (200, "ok\n")
        assert http_get(address, "/readyz") == (200, "ready\n")
        loop.call_soon_threadsafe(release.wait, 30)  # the stall under test
        _, text = poll_until(lambda: (r := http_get(address, "/healthz"))[0] == 503 and r, 20, "healthz 503")
        assert "event loop stalled" in text
        assert http_get(address, "/metrics", timeout=15)[0] == 503
        assert http_get(address, "/readyz", timeout=15)[0] == 503
        release.set()
        poll_until(lambda: http_get(address, "/healthz")[0] == 200, 20, "healthz back to 200")
        assert http_get(address, "/nope")[0] == 404
    finally:
        release.set()
        stop_flag.set()
        thread.join(30)


@within(90)
async def test_readyz_follows_the_pool_and_the_drain() -> None:
    """Ready while pushes can get memory; not ready when only the read reserve is left (a new push
    then waits for memory another push holds, counted as back-pressure), ready again once the data is
    unregistered, not ready once draining. Memory only (data-dir none): with a disk it would spill instead."""
    # One connection of one application fills the pool here: their shares must be all of it.
    shares = ["--push-share-per-connection", "1", "--push-share-per-application", "1"]
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "2M", ["--data-dir", "none", *shares])

    async def ready() -> tuple[int, str]:
        return await asyncio.to_thread(http_get, d.http, "/readyz")

    try:
        c = await AsyncClient.connect(d.addr)
        assert await ready() == (200, "ready\n")
        pool = (await c.stats())["pool"]
        window = 16  # push-window: what one open map output may hold
        await push(c, "r-app", 0, 1, [(pool["total"] - pool["reserve"] - window) * SEGMENT])
        hog = await c.open_writer("r-app", 3, 0, 4, 1)  # its credit takes the rest: only the reserve is free
        _, text = await wait_until(ready, lambda r: r[0] == 503, what="not ready when the pool is full")
        assert "pool exhausted" in text
        # A new push now waits for memory with no credit (the hog's window comes back when it ends):
        # back-pressure shows in the metrics.
        blocked = asyncio.create_task(c.open_writer("r-app", 2, 0, 3, 1))
        await wait_until(
            lambda: _scrape(d),
            lambda m: m['shuffled_zero_credit_seconds_total{kind="push"}'] > 0 and m["shuffled_pool_waiting_requests"],
            what="push back-pressure counted",
        )
        await hog.abort()
        await c.unregister_shuffle("r-app", 0)
        await wait_until(ready, lambda r: r[0] == 200, what="ready after unregister")
        await (await blocked).abort()
        w = await c.open_writer("r-app", 1, 0, 2, 1)  # keeps the drain waiting
        d.proc.send_signal(signal.SIGTERM)
        _, text = await wait_until(ready, lambda r: r[0] == 503, what="not ready when draining")
        assert "draining" in text
        await w.commit()
        assert d.proc.wait(30) == 0
    finally:
        d.stop()


@within(90)
async def test_sigterm_refuses_new_pushes_and_finishes_open_work() -> None:
    """SIGTERM: new pushes get the retryable SHUTTING_DOWN; a push in flight commits, a read in
    progress reads everything; then the daemon exits 0 by itself."""
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "32M", ["--drain-timeout", "60"])

    try:
        pusher, reader_client, late = [await AsyncClient.connect(d.addr) for _ in range(3)]
        sizes = [2 << 20, 1 << 20]
        await push(reader_client, "s-app", 0, 1, sizes)
        w = await pusher.open_writer("s-app", 0, 1, 2, 2)
        await w.write(0, payload(2, 0, 100 * KiB))
        reader = reader_client.read("s-app", 0, 0, 2, {"": [1]})
        first = await reader.next_chunk()
        assert first is not None
        got = bytearray(first.data)
        # The reader holds its credit: the daemon's stream waits with a backlog (read back-pressure).
        await wait_until(
            lambda: _scrape(d),
            lambda m: m['shuffled_zero_credit_seconds_total{kind="read"}'] > 0 and m["shuffled_backlog_buffers"] > 0,
            what="read back-pressure counted",
        )

        d.proc.send_signal(signal.SIGTERM)
        await wait_until(lambda: asyncio.to_thread(http_get, d.http, "/readyz"), lambda r: r[0] == 503, what="draining")
        with pytest.raises(ShuffledError) as refused:
            await late.open_writer("s-app", 0, 2, 3, 2)
        assert refused.value.code.name == "SHUTTING_DOWN" and refused.value.retryable

        await w.write(1, payload(2, 1, 50 * KiB))
        assert await w.commit() == [100 * KiB, 50 * KiB]
        while (chunk := await reader.next_chunk()) is not None:
            got += chunk.data
        await reader.aclose()
        assert bytes(got) == payload(1, 0, sizes[0]) + payload(1, 1, sizes[1])
        assert await asyncio.to_thread(d.proc.wait, 30) == 0
        log = "".join(d.log)
        assert " msg=drained " in log and "msg=stopped exit_code=0" in log
    finally:
        d.stop()


@within(120)
async def test_drain_timeout_bounds_the_shutdown_and_a_second_signal_ends_it() -> None:
    """A push that never commits holds the drain only until the drain timeout (then exit 0);
    with a long timeout, a second signal stops the daemon at once (exit 1)."""

    async def stuck_push(d: DaemonProcess) -> AsyncClient:
        c = await AsyncClient.connect(d.addr)
        w = await c.open_writer("t-app", 0, 0, 1, 1)
        await w.write(0, payload(1, 0, 3 * SEGMENT))
        await wait_until(c.stats, lambda s: s["streams"]["pushing"] == 1, what="push open")
        return c

    async def draining(d: DaemonProcess) -> None:
        await wait_until(lambda: asyncio.to_thread(http_get, d.http, "/readyz"), lambda r: r[0] == 503, what="drain")

    short = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "16M", ["--drain-timeout", "1"])
    long = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "16M", ["--drain-timeout", "600"])
    try:
        c1, c2 = await stuck_push(short), await stuck_push(long)
        short.proc.send_signal(signal.SIGTERM)
        long.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(draining(long), 30)
        long.proc.send_signal(signal.SIGINT)  # Ctrl-C counts the same as SIGTERM
        assert await asyncio.to_thread(short.proc.wait, 30) == 0
        assert await asyncio.to_thread(long.proc.wait, 30) == 1
        assert "drain timed out" in "".join(short.log)
        assert "stopping now" in "".join(long.log)
        with pytest.raises(ShuttingDown):  # told before the daemon closed the connection: retry elsewhere
            await asyncio.wait_for(c1.stats(), 10)
        await c1.close()
        await c2.close()
    finally:
        short.stop()
        long.stop()


@within(60)
async def test_json_logs_have_one_line_per_connection_event_and_none_per_buffer() -> None:
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "16M", ["--log-format", "json"])

    try:
        c = await AsyncClient.connect(d.addr)
        await push(c, "j-app", 0, 1, [200 * SEGMENT])  # 200 buffers
        await c.close()
        await wait_until(
            lambda: asyncio.sleep(0, list(d.log)),
            lambda lines: any('"connection closed"' in line for line in lines),
            what="close logged",
        )
    finally:
        d.stop()
    events = [json.loads(line) for line in d.log]
    assert {"ts", "level", "logger", "msg"} <= set(events[0])
    opened = [e for e in events if e["msg"] == "connection open"]
    closed = [e for e in events if e["msg"] == "connection closed"]
    assert len(opened) == 1 and opened[0]["role"] == "client" and opened[0]["peer"].startswith("127.0.0.1:")
    assert len(closed) == 1 and closed[0]["reason"] == "closed by peer"
    assert len(events) < 12, events  # ready, open, close, stopping, drained, stopped: nothing per buffer


def test_metrics_endpoint_port_taken_or_turned_off() -> None:
    """A taken metrics port stops the start with a message naming it; -1 runs without the endpoint."""
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "shuffled", "serve", "--port", "0", "--pool-size", "4M"]
        result = subprocess.run([*cmd, "--metrics-port", str(port)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"metrics endpoint 127.0.0.1:{port}" in result.stderr
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "4M", ["--metrics-port", "-1"])
    try:
        assert d.http == "-"  # the ready line says there is no endpoint
    finally:
        d.stop()


def test_the_metrics_endpoint_binds_without_a_name_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's HTTPServer looks its bound address up (`socket.getfqdn`): where the resolver is out of reach, as
    in a container without DNS, that held the daemon's start for 10 s while its listeners already accepted
    connections. The endpoint binds without any lookup."""
    import socket

    from shuffled.ops.http import OpsServer

    def lookup(name: str = "") -> str:
        raise AssertionError(f"a name lookup of {name!r}")

    monkeypatch.setattr(socket, "getfqdn", lookup)
    ops = OpsServer(cast(Any, None), "0.0.0.0", 0, 1.0)  # binding needs no daemon
    try:
        assert ops.address.startswith("0.0.0.0:")
    finally:
        ops.stop()


#: the admin `stats` answer's names and nesting as clients, the JVM and `shuffled stats` read them
#: (taken from the dict `Daemon.stats()` built before it returned a `DaemonStats`): a change here is a wire change
_ROLES = {"client": "int", "peer": "int"}
WIRE_STATS = {
    "node": "str",
    "start_time": "int",
    "draining": "bool",
    "ready": "bool",
    "pool": dict.fromkeys(
        ("segment_size", "total", "free", "used", "reserve", "local_pools", "waiting", "floating", "reading"), "int"
    ),
    "store": dict.fromkeys(
        (
            "applications",
            "shuffles",
            "stored_segments",
            "stored_bytes",
            "memory_bytes",
            "attempts",
            "pieces",
            "open_map_outputs",
            "commits",
            "committed_bytes",
            "aborts",
            "replica_attempts",
            "replica_bytes",
            "under_replicated",
        ),
        "int",
    ),
    "disk": dict.fromkeys(
        "spills spilled_bytes loads loaded_bytes used_bytes reclaimed_bytes files syncs fsyncs sync_failures "
        "unsynced_bytes".split(),
        "int",
    ),
    "connections": {"clients": "int", "peers": "int", "opened": _ROLES},
    "streams": dict.fromkeys(("served", "pushing", "remote_channels", "inflight_buffers", "backlog_buffers"), "int"),
    "traffic": {
        **dict.fromkeys(
            (
                "pushed_bytes",
                "pushed_buffers",
                "placed_buffers",
                "served_local_bytes",
                "served_local_buffers",
                "read_placed_buffers",
                "relayed_bytes",
                "relayed_buffers",
            ),
            "int",
        ),
        "sent_bytes": _ROLES,
        "received_bytes": _ROLES,
        "paused_us": _ROLES,
        "zero_credit_us": _ROLES,
    },
    "credit": dict.fromkeys(
        (
            "push_granted",
            "push_outstanding",
            "push_slots",
            "push_floor_segments",
            "push_floor_limit",
            "push_extra_segments",
            "push_extra_limit",
            "read_granted",
            "read_outstanding",
            "push_wait_us",
        ),
        "int",
    ),
    "errors": {"PARTITION_NOT_FOUND": "int"},
    "filesystem": {"capacity_bytes": "int", "free_bytes": "int"},
    "replication": dict.fromkeys(
        ("forwarded_buffers", "forwarded_bytes", "degraded", "failed", "held_back", "peers"), "int"
    ),
    "drain": {
        "state": "str",
        **dict.fromkeys(("to_copy", "copied", "copied_bytes", "failed", "short"), "int"),
        "timed_out": "bool",
    },
    "failover": {"tries": {}, "recovered": "int", "exhausted": "int", "resumed_reads": "int"},
    "object_store": {
        **dict.fromkeys(("url", "state", "reason"), "str"),
        "requests": {},
        "errors": {},
        **dict.fromkeys(("bytes_up", "bytes_down", "parts", "objects_held", "bytes_held"), "int"),
    },
    "tier": dict.fromkeys(
        (
            "spilled_objects",
            "spilled_bytes",
            "moved_objects",
            "moved_bytes",
            "durable_objects",
            "durable_bytes",
            "durable_attempts",
            "pending_attempts",
            "pending_bytes",
            "write_errors",
            "adopted_attempts",
            "adoptions",
            "deleted_objects",
            "kept_objects",
            "swept_objects",
            "swept_released",
            "swept_expired",
            "swept_probes",
            "sweeps",
            "sweep_kept_objects",
            "leases_written",
        ),
        "int",
    ),
    "heal": dict.fromkeys(("rounds", "missing", "copied", "copied_bytes", "failed", "last_heal_us"), "int"),
}


def _shape(value: Any, leaf: Any = lambda v: type(v).__name__) -> Any:
    """Keys in order, leaves by type name (or as they are, for `WIRE_STATS`)."""
    if isinstance(value, dict):
        return [(key, _shape(v, leaf)) for key, v in value.items()]
    return leaf(value)


@within(120)
@pytest.mark.parametrize("memory_only", [False, True])
async def test_admin_stats_wire_form_is_unchanged_and_the_snapshot_is_typed(memory_only: bool, tmp_path: Any) -> None:
    """`Daemon.stats()` is a typed snapshot read by attribute; its wire form keeps the admin answer's
    keys, order and nesting (`filesystem` is `{}` without a data dir, the disk's error count stays local)."""
    config = DaemonConfig(port=0, metrics_port=-1, pool_size=4 << 20, data_dir="none" if memory_only else str(tmp_path))
    daemon = Daemon(config)
    await daemon.start()
    try:
        c = await AsyncClient.connect(daemon.node)
        with pytest.raises(PartitionNotFound):
            async with c.read("w-app", 1, 0, 1, {"": [99]}) as missing:
                await missing.read_all()
        wire = await c.stats()
        snapshot = daemon.stats()
        await c.close()
        expected = {**WIRE_STATS, "filesystem": {}} if memory_only else WIRE_STATS
        assert _shape(wire) == _shape(snapshot.to_wire()) == _shape(expected, str)
        assert snapshot.connections.clients == 1 and snapshot.errors == {"PARTITION_NOT_FOUND": 1}
        assert snapshot.pool.used + snapshot.pool.free == snapshot.pool.total == wire["pool"]["total"]
        assert (snapshot.filesystem is None) == memory_only
        assert wire["store"] == dataclasses.asdict(daemon.storage.stats()[0])
    finally:
        await daemon.stop()


@within(60)
async def test_admin_pool_answers_what_stats_says_of_the_pool_and_peers(tmp_path: Any) -> None:
    """`pool` (what a writer weighs before it compresses) agrees with `stats`, before and after a push, and says
    whether there is an object store: the cheap answer must not drift from the full one."""
    config = DaemonConfig(port=0, metrics_port=-1, pool_size=4 << 20, data_dir=str(tmp_path))
    daemon = Daemon(config)
    await daemon.start()
    try:
        c = await AsyncClient.connect(daemon.node)
        seen = []
        for step in range(2):
            if step:
                await push(c, "pool-app", 1, 0, [256 * KiB, 256 * KiB])
            pool, stats = await c.pool(), await c.stats()
            assert pool == {
                "used": stats["pool"]["used"],
                "total": stats["pool"]["total"],
                "peers": stats["replication"]["peers"],
                "object_store": False,
            }
            seen.append(pool["used"])
        await c.close()
        assert seen[1] >= seen[0] + (512 * KiB) // config.segment_size
    finally:
        await daemon.stop()


def test_error_events_name_their_module_and_keep_the_traceback() -> None:
    """Modules log to `getLogger(__name__)`; an error is an event with fields and the traceback as `exc`."""
    import logging

    from shuffled.logs import KeyValueFormatter, event
    from shuffled.server.storage import spill

    lines: list[str] = []
    handler = logging.Handler()
    handler.setFormatter(KeyValueFormatter())
    handler.emit = lambda record: lines.append(handler.format(record))  # type: ignore[method-assign]
    spill.log.addHandler(handler)
    try:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            event(spill.log, "spilling failed", logging.ERROR, exc_info=True, app="x y")
    finally:
        spill.log.removeHandler(handler)
    [line] = lines
    assert ' level=error logger=shuffled.server.storage.spill msg="spilling failed" app="x y" exc=' in line
    assert "RuntimeError: boom" in line and "\n" not in line
