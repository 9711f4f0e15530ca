"""Prometheus metrics: the only module that imports prometheus_client.

The daemon counts with plain ints on its own objects (see server/accounting/counters.py) and
`Daemon.stats()` gathers them into one typed snapshot (`DaemonStats`, ops/stats.py).
A custom collector turns that snapshot into metric families when Prometheus
scrapes, so the data path never calls into this library. Only per-request
latencies are observed as they happen, into histograms (once per push, read or
admin call, never per buffer).

Labels are bounded: role (client, peer), source (local, relayed), kind (push,
read), error code names, admin operations. Nothing is labelled per application
or shuffle.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from .. import __version__
from ..protocol.errors import ErrorCode
from .stats import DaemonStats

#: latency buckets from 1 ms to 5 min: pushes and reads of a map output or partition
_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: admin operations whose latency series exist from the start (others appear when first answered)
ADMIN_OPS = ("stats", "pool", "unregister_shuffle", "remove_application")
#: the object-store layer's operations (server/storage/objects.py OPERATIONS; this module stays below it)
OBJECT_STORE_OPS = ("put", "get", "delete", "list")
#: object-store states, one series each (1 for the current one)
OBJECT_STORE_STATES = ("off", "probing", "ready", "failed")


class DaemonMetrics:
    """One registry per daemon (several daemons may share a process in tests and benchmarks)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._collector = _SnapshotCollector()
        self.registry.register(self._collector)
        ProcessCollector(registry=self.registry)
        self._push = Histogram(
            "shuffled_push_duration_seconds",
            "Time from opening a map output to its commit",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        read = Histogram(
            "shuffled_read_duration_seconds",
            "Time from a read request to the end of its stream; source=relayed when other daemons' data is in it",
            ["source"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._read = {False: read.labels("local"), True: read.labels("relayed")}
        self._admin = Histogram(
            "shuffled_admin_duration_seconds",
            "Time to answer an admin call, including telling peer daemons",
            ["op"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        for op in ADMIN_OPS:
            self._admin.labels(op)
        objects = Histogram(
            "shuffled_object_store_request_duration_seconds",
            "Time one object-store operation took, retries included (a put is a whole object, all its parts)",
            ["op"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._objects = {op: objects.labels(op) for op in OBJECT_STORE_OPS}
        self._lock = threading.Lock()

    def observe_push(self, seconds: float) -> None:
        self._push.observe(seconds)

    def observe_read(self, seconds: float, relayed: bool) -> None:
        self._read[relayed].observe(seconds)

    def observe_admin(self, op: str, seconds: float) -> None:
        """Only answered calls are observed, so `op` is one the daemon knows: the label stays bounded."""
        self._admin.labels(op).observe(seconds)

    def observe_object_store(self, op: str, seconds: float) -> None:
        self._objects[op].observe(seconds)

    def render(self, snapshot: DaemonStats) -> tuple[bytes, str]:
        """The text exposition of this snapshot (from any thread) and its content type."""
        with self._lock:
            self._collector.snapshot = snapshot
            try:
                return generate_latest(self.registry), CONTENT_TYPE_LATEST
            finally:
                self._collector.snapshot = None


class _SnapshotCollector(Collector):
    def __init__(self) -> None:
        self.snapshot: DaemonStats | None = None

    def describe(self) -> list[Metric]:
        return []  # families depend on the snapshot; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        if self.snapshot is not None:
            yield from families(self.snapshot)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _labelled(family: GaugeMetricFamily | CounterMetricFamily, label_values: Mapping[str, float]) -> Metric:
    for label, value in label_values.items():
        family.add_metric([label], value)
    return family


def families(s: DaemonStats) -> Iterator[Metric]:
    """Metric families for one `Daemon.stats()` snapshot."""
    info = GaugeMetricFamily("shuffled_info", "Daemon version and node name", labels=["version", "node"])
    info.add_metric([__version__, s.node], 1)
    yield info
    yield _gauge("shuffled_start_time_seconds", "Start time of the daemon since the Unix epoch", s.start_time)
    yield _gauge("shuffled_ready", "1 when the daemon accepts pushes (what /readyz says)", int(s.ready))
    yield _gauge("shuffled_draining", "1 while the daemon shuts down", int(s.draining))
    drain = s.drain
    yield _gauge(
        "shuffled_drain_pending_copies",
        "Copies a draining daemon's hand-over still has to make",
        drain.to_copy - drain.copied - drain.failed - drain.short,
    )
    yield _labelled(
        CounterMetricFamily(
            "shuffled_drain_copies",
            "Hand-over copies of a drain, by outcome: copied; failed (of attempts no other daemon holds: they "
            "stay on this one only); short (not made, but another daemon holds the attempt)",
            labels=["outcome"],
        ),
        {"copied": drain.copied, "failed": drain.failed, "short": drain.short},
    )
    yield _counter(
        "shuffled_drain_copied_bytes",
        "Data bytes the drain's hand-over copied to other daemons",
        drain.copied_bytes,
    )

    pool = s.pool
    yield _gauge("shuffled_pool_segment_size_bytes", "Size of one pool segment (one buffer)", pool.segment_size)
    yield _gauge("shuffled_pool_segments", "Segments in the buffer pool (fixed at start)", pool.total)
    yield _gauge("shuffled_pool_used_segments", "Pool segments in use", pool.used)
    yield _gauge("shuffled_pool_free_segments", "Pool segments free", pool.free)
    yield _gauge("shuffled_pool_reserved_segments", "Segments kept for reads: pushes never take them", pool.reserve)
    yield _gauge("shuffled_pool_reading_segments", "Segments of the read reserve reads hold", pool.reading)
    yield _gauge(
        "shuffled_pool_local_pools", "Local pools (one per push stream and per relayed read)", pool.local_pools
    )
    yield _gauge("shuffled_pool_waiting_requests", "Requests waiting for pool memory (back-pressure)", pool.waiting)
    yield _gauge(
        "shuffled_pool_floating_segments", "Floating buffers reads hold beyond their exclusive ones", pool.floating
    )

    store = s.store
    yield _gauge("shuffled_store_applications", "Applications with data on this daemon", store.applications)
    yield _gauge("shuffled_store_shuffles", "Shuffles with data on this daemon", store.shuffles)
    yield _gauge("shuffled_store_segments", "Pool segments holding pushed data", store.stored_segments)
    yield _gauge("shuffled_store_bytes", "Committed bytes held", store.stored_bytes)
    yield _gauge(
        "shuffled_store_memory_bytes",
        "Bytes of the pieces held in pool segments (over the segments' size: memory efficiency)",
        store.memory_bytes,
    )
    yield _gauge("shuffled_store_attempts", "Map attempts held (open and committed)", store.attempts)
    yield _gauge("shuffled_store_pieces", "Pushed packed groups held (memory and disk)", store.pieces)
    yield _gauge("shuffled_open_map_outputs", "Map outputs being pushed", store.open_map_outputs)
    yield _counter("shuffled_map_outputs_committed", "Map outputs committed", store.commits)
    yield _counter("shuffled_committed_bytes", "Bytes of committed map outputs", store.committed_bytes)
    yield _counter("shuffled_map_outputs_aborted", "Map outputs aborted or lost with their client", store.aborts)

    yield _gauge(
        "shuffled_replica_attempts", "Committed map outputs held as replicas of other daemons'", store.replica_attempts
    )
    yield _gauge(
        "shuffled_replica_stored_bytes", "Committed bytes held as replicas (memory and disk)", store.replica_bytes
    )
    yield _gauge(
        "shuffled_under_replicated_attempts",
        "Map outputs pushed here that were committed with fewer replicas than wanted",
        store.under_replicated,
    )
    rep = s.replication
    yield _counter(
        "shuffled_replicated_bytes", "Pushed data bytes forwarded to replicas (once per replica)", rep.forwarded_bytes
    )
    yield _counter(
        "shuffled_replicated_buffers", "Pushed buffers forwarded to replicas (once per replica)", rep.forwarded_buffers
    )
    yield _counter(
        "shuffled_replication_degraded",
        "Pushes that opened fewer replicas than wanted and went on (replica-shortfall = degrade)",
        rep.degraded,
    )
    yield _counter(
        "shuffled_replication_failed",
        "Pushes failed with PEER_UNAVAILABLE for want of a replica, at open or lost on the way",
        rep.failed,
    )
    yield _gauge(
        "shuffled_replication_held_back_pushes",
        "Open pushes whose client gets no new credit now because a replica lags (replica-lag)",
        rep.held_back,
    )
    yield _gauge(
        "shuffled_placement_peers",
        "Other daemons on the placement ring (peers and what peers-dns resolves to); replicas go to them",
        rep.peers,
    )

    conns = s.connections
    yield _labelled(
        GaugeMetricFamily("shuffled_connections", "Open connections by role", labels=["role"]),
        {"client": conns.clients, "peer": conns.peers},
    )
    yield _labelled(
        CounterMetricFamily("shuffled_connections_opened", "Connections accepted or dialled", labels=["role"]),
        conns.opened,
    )
    streams = s.streams
    yield _labelled(
        GaugeMetricFamily("shuffled_streams", "Open streams by kind", labels=["kind"]),
        {"served": streams.served, "push": streams.pushing, "remote_channel": streams.remote_channels},
    )
    yield _gauge(
        "shuffled_inflight_buffers", "Buffers written to sockets and not yet flushed", streams.inflight_buffers
    )
    yield _gauge(
        "shuffled_backlog_buffers", "Buffers queued on served streams (their backlog)", streams.backlog_buffers
    )

    t = s.traffic
    yield _counter(
        "shuffled_pushed_bytes",
        "Data bytes pushed into this daemon by clients (the runs' bytes, without the packed groups' directories)",
        t.pushed_bytes,
    )
    yield _counter("shuffled_pushed_buffers", "Buffers pushed into this daemon by clients", t.pushed_buffers)
    yield _counter(
        "shuffled_placed_buffers",
        "Of the buffers pushed, those local clients placed in shared memory instead of sending them",
        t.placed_buffers,
    )
    yield _labelled(
        CounterMetricFamily(
            "shuffled_served_bytes",
            "Data bytes queued to readers: source=local from this daemon's store, relayed from other daemons",
            labels=["source"],
        ),
        {"local": t.served_local_bytes, "relayed": t.relayed_bytes},
    )
    yield _labelled(
        CounterMetricFamily("shuffled_served_buffers", "Data buffers queued to readers", labels=["source"]),
        {"local": t.served_local_buffers, "relayed": t.relayed_buffers},
    )
    yield _counter(
        "shuffled_read_placed_buffers",
        "Of the buffers served, those local clients read in place in shared memory instead of through the socket",
        t.read_placed_buffers,
    )
    yield _labelled(
        CounterMetricFamily("shuffled_transport_sent_bytes", "Bytes written to connections", labels=["role"]),
        t.sent_bytes,
    )
    yield _labelled(
        CounterMetricFamily("shuffled_transport_received_bytes", "Bytes read from connections", labels=["role"]),
        t.received_bytes,
    )
    yield _labelled(
        CounterMetricFamily(
            "shuffled_write_paused_seconds",
            "Time connections spent paused above the high write watermark",
            labels=["role"],
        ),
        {role: us / 1e6 for role, us in t.paused_us.items()},
    )

    credit = s.credit
    yield _labelled(
        CounterMetricFamily("shuffled_credit_granted", "Credit (buffers) this daemon granted", labels=["kind"]),
        {"push": credit.push_granted, "read": credit.read_granted},
    )
    yield _labelled(
        GaugeMetricFamily(
            "shuffled_credit_outstanding", "Credit granted by this daemon and not yet used", labels=["kind"]
        ),
        {"push": credit.push_outstanding, "read": credit.read_outstanding},
    )
    yield _labelled(
        GaugeMetricFamily(
            "shuffled_push_window_segments",
            "Pool segments push windows hold: kind=floor their guaranteed part (at most half of push memory), "
            "kind=extra beyond it",
            labels=["kind"],
        ),
        {"floor": credit.push_floor_segments, "extra": credit.push_extra_segments},
    )
    yield _labelled(
        CounterMetricFamily(
            "shuffled_zero_credit_seconds",
            "Back-pressure: time pushes waited for memory (kind=push) and served streams waited for "
            "their reader's credit with data queued (kind=read)",
            labels=["kind"],
        ),
        {"push": credit.push_wait_us / 1e6, "read": sum(t.zero_credit_us.values()) / 1e6},
    )

    errors = s.errors
    yield _labelled(
        CounterMetricFamily("shuffled_errors", "Errors reported to clients and peers by wire code", labels=["code"]),
        {code.name: errors.get(code.name, 0) for code in ErrorCode},
    )

    failover = s.failover
    yield _labelled(
        CounterMetricFamily(
            "shuffled_read_failover_tries",
            "Times a relayed read looked for the next copy of a location's data after the daemon serving it "
            "failed, by the wire code it failed with (tries, not successes: see recovered and exhausted)",
            labels=["code"],
        ),
        # every code from zero, as for shuffled_errors: a rate then sees a location's first failover
        {code.name: failover.tries.get(code.name, 0) for code in ErrorCode},
    )
    yield _counter(
        "shuffled_read_failover_recovered",
        "Locations of relayed reads that failed and were served to their end by another copy",
        failover.recovered,
    )
    yield _counter(
        "shuffled_read_failover_exhausted",
        "Relayed reads that failed because no copy of their data was left",
        failover.exhausted,
    )
    yield _counter(
        "shuffled_resumed_reads", "Reads served from where a failed copy's read stopped", failover.resumed_reads
    )

    disk = s.disk
    yield _counter("shuffled_spills", "Spills of pool data to disk", disk.spills)
    yield _counter("shuffled_spilled_bytes", "Bytes spilled to disk", disk.spilled_bytes)
    yield _counter("shuffled_disk_loads", "Reads of spilled pieces back into the pool for readers", disk.loads)
    yield _counter(
        "shuffled_disk_loaded_bytes",
        "Bytes of spilled pieces read back for readers: against shuffled_served_bytes_total, the share of what "
        "readers got that the pool was too small to keep",
        disk.loaded_bytes,
    )
    yield _gauge("shuffled_disk_used_bytes", "Bytes in spill files", disk.used_bytes)
    yield _counter(
        "shuffled_disk_reclaimed_bytes",
        "Spilled bytes of aborted map outputs given back to the file system",
        disk.reclaimed_bytes,
    )
    yield _gauge("shuffled_disk_files", "Spill files", disk.files)
    yield _counter("shuffled_disk_syncs", "Syncs of the data dir's writes (--fsync; each covers many)", disk.syncs)
    yield _counter("shuffled_disk_fsyncs", "fsync calls the syncs made (files and directories)", disk.fsyncs)
    yield _counter("shuffled_disk_sync_failures", "Syncs that failed", disk.sync_failures)
    yield _counter(
        "shuffled_disk_sync_seconds", "Time syncs took, queueing on the writer thread included", disk.sync_seconds
    )
    yield _gauge(
        "shuffled_disk_unsynced_bytes", "Bytes written to the data dir and not yet synced", disk.unsynced_bytes
    )
    yield _gauge(
        "shuffled_disk_unsynced_seconds",
        "Age of the oldest write to the data dir not yet synced (with --fsync background: at most fsync-interval, "
        "plus the sync's own time)",
        disk.unsynced_seconds,
    )
    yield from _object_store(s)
    fs = s.filesystem
    if fs is not None:
        yield _gauge(
            "shuffled_filesystem_capacity_bytes", "Size of the data directory's file system", fs.capacity_bytes
        )
        yield _gauge("shuffled_filesystem_free_bytes", "Free bytes on the data directory's file system", fs.free_bytes)


def _object_store(s: DaemonStats) -> Iterator[Metric]:
    objects = s.object_store
    yield _labelled(
        GaugeMetricFamily(
            "shuffled_object_store_state",
            "1 for the object store's state: off (none configured), probing, ready (the start-up probe wrote, read "
            "back and deleted an object) or failed (/readyz says why)",
            labels=["state"],
        ),
        {state: int(objects.state == state) for state in OBJECT_STORE_STATES},
    )
    yield _labelled(
        CounterMetricFamily(
            "shuffled_object_store_requests",
            "Object-store operations by op (put: one object, all its parts; get: one ranged read; delete: one "
            "batch; list: one listing), failed ones included",
            labels=["op"],
        ),
        {op: objects.requests.get(op, 0) for op in OBJECT_STORE_OPS},
    )
    yield _labelled(
        CounterMetricFamily(
            "shuffled_object_store_errors", "Object-store operations that failed, by op", labels=["op"]
        ),
        {op: objects.errors.get(op, 0) for op in OBJECT_STORE_OPS},
    )
    yield _labelled(
        CounterMetricFamily(
            "shuffled_object_store_bytes",
            "Bytes moved to the object store in completed objects (direction=up) and read from it (down)",
            labels=["direction"],
        ),
        {"up": objects.bytes_up, "down": objects.bytes_down},
    )
    yield _counter(
        "shuffled_object_store_parts",
        "Parts of multipart uploads sent (one PUT request each, the client's retries aside)",
        objects.parts,
    )
    yield _gauge(
        "shuffled_object_store_objects",
        "Objects this daemon wrote to the object store and has not deleted",
        objects.objects_held,
    )
    yield _gauge(
        "shuffled_object_store_held_bytes",
        "Bytes of the objects this daemon holds in the object store",
        objects.bytes_held,
    )
    tier = s.tier
    why = ("spilled", "moved", "durable")
    yield _labelled(
        CounterMetricFamily(
            "shuffled_tier_objects",
            "Objects the tier wrote, by why: spilled (no data dir), moved (spill files over the disk quota), "
            "durable (committed map outputs uploaded)",
            labels=["why"],
        ),
        {w: getattr(tier, f"{w}_objects") for w in why},
    )
    yield _labelled(
        CounterMetricFamily(
            "shuffled_tier_bytes", "Bytes of pieces the tier wrote into objects, by why", labels=["why"]
        ),
        {w: getattr(tier, f"{w}_bytes") for w in why},
    )
    yield _counter(
        "shuffled_tier_write_errors",
        "Tier writes that failed (the pieces stay where they were; durable uploads are retried)",
        tier.write_errors,
    )
    yield _gauge(
        "shuffled_durable_attempts",
        "Map outputs held here whose commit is in a complete object (any daemon can serve them)",
        tier.durable_attempts,
    )
    yield _gauge(
        "shuffled_durable_pending_attempts",
        "Committed map outputs waiting for their durable upload",
        tier.pending_attempts,
    )
    yield _gauge(
        "shuffled_durable_pending_bytes",
        "Bytes of the map outputs waiting for their durable upload not yet in an object",
        tier.pending_bytes,
    )
    yield _counter(
        "shuffled_adopted_attempts",
        "Map outputs of other daemons (or of this one's earlier life) served here from their objects",
        tier.adopted_attempts,
    )
    yield _labelled(
        CounterMetricFamily(
            "shuffled_tier_deleted_objects",
            "Objects deleted, by how: with their shuffle or application (dropped); by the sweep, as held by no "
            "daemon that answered, its writer among them (released), as written by a daemon whose lease expired "
            "(expired), or as a probe cut short (probe)",
            labels=["how"],
        ),
        {
            "dropped": tier.deleted_objects,
            "released": tier.swept_released,
            "expired": tier.swept_expired,
            "probe": tier.swept_probes,
        },
    )
    yield _labelled(
        CounterMetricFamily(
            "shuffled_tier_kept_objects",
            "Objects a deletion left, by why: a drop on request found them written for other credentials "
            "(owner), or the sweep found their application may be held by a daemon that did not answer (unknown)",
            labels=["why"],
        ),
        {"owner": tier.kept_objects, "unknown": tier.sweep_kept_objects},
    )
    yield _counter("shuffled_tier_sweeps", "Rounds of the object store sweep", tier.sweeps)
    heal = s.heal
    yield _counter(
        "shuffled_heal_rounds", "Rounds of checking that replicated map outputs have their copies", heal.rounds
    )
    yield _gauge(
        "shuffled_heal_missing_copies",
        "Copies the last healing round found missing among the map outputs this daemon is first to hold",
        heal.missing,
    )
    yield _counter("shuffled_heal_copies", "Copies healing made of map outputs that had lost one", heal.copied)
    yield _counter("shuffled_heal_copied_bytes", "Bytes of the copies healing made", heal.copied_bytes)
    yield _counter("shuffled_heal_copy_failures", "Copies healing tried and could not make", heal.failed)
    yield _gauge(
        "shuffled_heal_last_seconds",
        "How long the last loss took to heal: from the first round that found a copy missing to the round that "
        "found none",
        heal.last_heal_us / 1e6,
    )


def render_markdown(snapshot: DaemonStats) -> str:
    """The metrics table of docs/operations.md (a test checks that it holds exactly this).

    Every family `/metrics` serves for this snapshot, in the order it serves them, except
    the process collector's `process_*` (the client library's, documented there in prose).
    Names are as exposed (counters with `_total`; histograms also have `_bucket`, `_sum`, `_count`).
    """
    metrics = DaemonMetrics()
    rows = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    with metrics._lock:
        metrics._collector.snapshot = snapshot
        try:
            collected = list(metrics.registry.collect())
        finally:
            metrics._collector.snapshot = None
    for family in collected:
        if family.name.startswith("process_"):
            continue
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels: list[str] = list(getattr(family, "_labelnames", ()))
        for sample in family.samples:
            labels += [label for label in sample.labels if label != "le" and label not in labels]
        shown = ", ".join(f"`{label}`" for label in labels) or "-"
        doc = family.documentation.replace("|", "\\|")
        rows.append(f"| `{name}` | {family.type} | {shown} | {doc} |")
    return "\n".join(rows) + "\n"
