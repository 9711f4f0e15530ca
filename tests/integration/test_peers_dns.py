"""`peers-dns` with real daemons: a daemon that knows its peer only through a DNS name replicates to it and
tells it when a shuffle goes.

A name that resolves to two loopback addresses needs /etc/hosts, which tests do not edit; `localhost`
resolves to 127.0.0.1 only. So B listens on 127.0.0.1 and resolves `localhost` to itself (its list must
not count it), and A, on 127.0.0.2 with the same port and no `peers`, finds B through `localhost` alone.
"""

from __future__ import annotations

from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import free_port, http_get, metric_samples, payload, pool_settled, start_daemon
from tests.units import MiB

APP = "app-dns"


@within(60)
async def test_a_daemon_found_only_through_dns_gets_the_replicas_and_the_unregister() -> None:
    port = free_port(["127.0.0.1", "127.0.0.2"])
    dns = ["--peers-dns", f"localhost:{port}", "--replicas", "2"]
    b = start_daemon("127.0.0.1", port, "32M", dns)
    try:
        a = start_daemon("127.0.0.2", port, "32M", dns)
    except BaseException:
        b.stop()
        raise

    try:
        ca, cb = await AsyncClient.connect(a.addr), await AsyncClient.connect(b.addr)
        sa, sb = await ca.stats(), await cb.stats()
        assert sa["replication"]["peers"] == 1 and sb["replication"]["peers"] == 0  # B is not its own peer
        sizes = [2 * MiB, 300_000]
        w = await ca.open_writer(APP, 1, 0, 5, len(sizes))
        for p, size in enumerate(sizes):
            await w.write(p, payload(5, p, size))
        assert await w.commit() == sizes
        sa, sb = await ca.stats(), await cb.stats()
        assert sa["replication"]["degraded"] == 0 and sa["store"]["under_replicated"] == 0, sa
        assert sb["store"]["replica_attempts"] == 1 and sb["store"]["replica_bytes"] == sum(sizes), sb["store"]
        await ca.unregister_shuffle(APP, 1)  # propagated to the peers DNS named
        settled = await pool_settled(cb)
        assert settled["store"]["replica_attempts"] == 0 and settled["store"]["stored_segments"] == 0
        for c in (ca, cb):
            await c.close()
        status, text = http_get(a.http, "/metrics")
        assert status == 200 and metric_samples(text)["shuffled_placement_peers"] == 1
        # A advertises 127.0.0.2, which `localhost` does not give: it says so (once); B is listed and does not
        warning = "peers-dns does not list this daemon"
        assert sum(warning in line for line in a.log) == 1 and not any(warning in line for line in b.log)
    finally:
        a.stop()
        b.stop()
