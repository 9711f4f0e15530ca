"""The one door into what the daemon holds (Celeborn's StorageManager, Flink's ResultPartitionManager): memory, the data
dir and the object store, the journals, spills, moves and durable uploads, behind one API.

Serving, the cluster, housekeeping and the admin operations call this and nothing else of storage/: a push opens a map
output here and writes through the `MapOutputWriter` it gets (writer.py); a read, or a copy of an attempt for another
daemon, gets a `ReadView` of what it may take (view.py, the one place that says how stored data is read); the cluster
asks which attempts are held and for whom (`held`, holdings.py); the admin and housekeeping drop, flush and persist.
What those steps do to the data (which tiers they touch, in which order, which deletions are an owner's act) is written
once, in lifecycle.py; where pieces are and how they move is the parts' (store.py, placement.py, spill.py, tier.py).
Whose data a request may touch is `is_owner`'s answer (access.py) on every path.

The handles it gives out are to be passed back or used through their methods, never looked into: `ShuffleData`'s and
`MapOutput`'s fields are storage's own (tests/unit/test_architecture.py checks that no module outside storage/ imports
the store or the shuffles: only this door, its handles and plain helpers).
"""

from __future__ import annotations

from collections.abc import Callable

from ...buffers import GlobalPool
from ...config import DaemonConfig
from ...ops.stats import DiskStats, FilesystemStats, ObjectStoreStats, StoreStats, TierStats
from ...protocol.errors import InvalidRequest, PartitionNotFound
from ...protocol.resume import Resume
from .at_rest import AtRestKeys
from .disk import Disk
from .holdings import Holdings
from .journal import Journals
from .lifecycle import Lifecycle
from .object_config import ObjectStoreConfig
from .objects import ObjectInfo, ObjectStore
from .probe import ObjectStoreProbe
from .restore import restore
from .spill import Spiller, memory_held
from .spill_writes import SpillWrites
from .store import Store
from .tier import ObjectTier
from .view import ReadView, copy_view, read_view
from .writer import MapOutputWriter


def open_storage(
    config: DaemonConfig,
    pool: GlobalPool,
    disk: Disk | None,
    object_stats: ObjectStoreStats | None = None,
    observe: Callable[[str, float], None] | None = None,
    at_rest: AtRestKeys | None = None,
) -> StorageManager:
    """Storage as the settings make it: the store, the object store and its tier (`object-store`), the
    spiller writing to the data dir (`disk`, None: no data dir) or else to objects. `observe` times the
    object store's requests (the metrics)."""
    objects = (
        ObjectStore(ObjectStoreConfig.of(config), object_stats, observe) if config.object_store is not None else None
    )
    store = Store(
        config.segment_size,
        config.app_memory_quota,
        config.app_disk_quota,
        max_partitions=config.max_partitions,
        can_spill=disk is not None or objects is not None,
        moves_disk=disk is not None and objects is not None,
    )
    store.at_rest = at_rest
    journals, writes = Journals(store, disk), SpillWrites(store)
    tier = (
        ObjectTier(store, objects, disk, config, journal=journals.append, busy=writes.by_attempt)
        if objects is not None
        else None
    )
    target = tier.spill_target(pool) if tier is not None else None
    spiller = Spiller(
        store, pool, disk, config.spill_high, config.spill_low, journals=journals, writes=writes, objects=target
    )
    if spiller.target is not None:
        # Stored data normally sits between the spill watermarks; floating buffers may fill the pool up to
        # where background spilling starts (buffers/pool.py says why that is safe).
        pool.set_floating_budget(spiller.start - 1)
    probe = ObjectStoreProbe(objects, objects.stats if objects is not None else object_stats or ObjectStoreStats())
    return StorageManager(pool, disk, store, spiller, tier, probe, Lifecycle(config, store, spiller, tier, disk))


def _refuse_asks(no_object_store: bool, no_data_dir: bool) -> None:
    """INVALID_REQUEST for a map output asking for what this daemon has no place for."""
    if no_object_store:
        raise InvalidRequest("this map output asks to be durable in an object store, and this daemon has none")
    if no_data_dir:
        raise InvalidRequest("this map output asks for fsync at commit, and this daemon has no data dir")


class StorageManager:
    """Everything stored, and the one API to it (see the module): `restore` it before the daemon listens,
    `start` it once it does (its name is known), `persist` and `close` it at stop."""

    def __init__(
        self,
        pool: GlobalPool,
        disk: Disk | None,
        store: Store,
        spiller: Spiller,
        tier: ObjectTier | None,
        probe: ObjectStoreProbe,
        lifecycle: Lifecycle,
    ) -> None:
        self.pool = pool
        self.disk = disk
        self.store = store
        self.spiller = spiller
        #: the object-store tier: spills without a data dir, moves over the disk quota, durable uploads, adoption
        self.tier = tier
        self.objects = tier.objects if tier is not None else None
        #: whether the object store works (readiness)
        self.probe = probe
        #: what commit, drop, flush, persist and expiry do to the data
        self.lifecycle = lifecycle
        #: which committed attempts are held here (what the cluster asks)
        self.held = Holdings(store)

    def restore(self) -> int:
        """Serve again what the data dir's journals prove; the shuffles restored."""
        return restore(self.store, self.disk) if self.disk is not None else 0

    def start(self, node: str) -> None:
        """The daemon listens as `node`: probe the object store, start the tier (its lease, durable uploads,
        taking back what this node's objects prove)."""
        self.probe.start()
        if self.tier is not None:
            self.tier.start(node)

    async def close(self) -> None:
        if self.tier is not None:
            await self.tier.close()
        await self.probe.close()

    def release(self) -> None:
        """Let go of the data dir (its lock) without persisting anything: a daemon that never ran."""
        if self.disk is not None:
            self.disk.close()

    # -- pushes

    def authorize(self, app: str, digest: bytes) -> None:
        """AUTH_FAILED unless a request with this token digest speaks for `app`'s data here (access.py)."""
        self.store.app_keys.authorize(app, digest)

    def owner(self, app: str) -> bytes | None:
        """The token digest `app`'s data here is bound to; None when nobody knows whose it is."""
        return self.store.app_keys.get(app)

    def open(
        self,
        app: str,
        shuffle: int,
        map_index: int,
        attempt: int,
        partitions: int,
        *,
        digest: bytes,
        replica_of: str | None = None,
        replicas: int = 1,
        durable: bool = False,
        synced: bool = False,
    ) -> MapOutputWriter:
        """Open a map output for a writer whose token has `digest` (`authorize`d by the caller), which binds an
        application new here to it; `durable`: upload it to the object store once committed; `synced`: its
        CommitAck follows an fsync of it (lifecycle.py)."""
        _refuse_asks(durable and self.tier is None, synced and self.disk is None)
        out = self.store.open_map_output(app, shuffle, map_index, attempt, partitions, replica_of, replicas)
        self.lifecycle.departures.returned(app, shuffle)
        out.wants_durable, out.wants_sync = durable, synced
        self.store.app_keys.bind(app, digest)
        return MapOutputWriter(out, self.spiller, self.lifecycle)

    def memory_held(self) -> str:
        """Who holds the pool's memory, for an error that says why a push got none."""
        return memory_held(self.pool, self.store)

    # -- reads

    def read(
        self, app: str, shuffle: int, start: int, end: int, attempts: list[int], resume: Resume | None, digest: bytes
    ) -> ReadView:
        """A view of partitions [start, end) of these committed attempts for the holder of a token with
        `digest` (plan.py's `lookup` checks it); raises what the read fails with."""
        self._refuse_gone(app, shuffle, digest)
        return read_view(
            self.store, self.pool, self.disk, self.objects, app, shuffle, start, end, attempts, resume, digest
        )

    def pieces(self, app: str, shuffle: int, attempt: int, digest: bytes) -> ReadView:
        """A view of one committed attempt's pieces whole, in push order (a copy for another daemon)."""
        self._refuse_gone(app, shuffle, digest)
        return copy_view(self.store, self.pool, self.disk, self.objects, app, shuffle, attempt, digest)

    @property
    def has_object_store(self) -> bool:
        return self.tier is not None

    async def adopt(self, app: str, shuffle: int, node: str, attempts: list[int]) -> None:
        """Serve what `node`'s objects of the shuffle prove from here (adopt.py), unless these attempts are held
        here already. Raises StorageError when the store cannot be read."""
        data = self.held.shuffle(app, shuffle)
        if data is not None and all(a in data.committed for a in attempts):
            return
        assert self.tier is not None
        await self.tier.adopt(app, shuffle, node)

    @property
    def restoring(self) -> bool:
        """Until it holds what its own objects prove, this daemon cannot say what it does not hold."""
        return self.tier is not None and not self.tier.restored

    def _refuse_gone(self, app: str, shuffle: int, digest: bytes) -> None:
        """A read of a shuffle dropped here fails with why, never reads as empty (departures.py)."""
        if self.held.shuffle(app, shuffle) is None:
            self.store.app_keys.authorize(app, digest)
            why = self.lifecycle.departures.why(app, shuffle, digest)
            if why is not None:
                raise PartitionNotFound(f"shuffle {app}/{shuffle} was {why} on this daemon")

    # -- the rest of the data's life (lifecycle.py)

    async def drop(self, app: str, shuffle: int | None = None) -> int:
        """Drop an application's data, or one shuffle of it, on its owner's request; the segments freed."""
        reason = "removed with its application" if shuffle is None else "unregistered"
        return await self.lifecycle.drop(app, shuffle, reason)

    async def delete_owned(self, app: str, shuffle: int | None, digest: bytes) -> None:
        """After a drop went round the daemons: every node's objects of it that the owner's token speaks for."""
        await self.lifecycle.delete_owned(app, shuffle, digest)

    async def flush(self, app: str, shuffle: int | None = None) -> dict[str, int]:
        """Write a finished stage's data below memory: the admin `flush`'s answer."""
        return await self.lifecycle.flush(app, shuffle)

    async def persist(self) -> None:
        """At stop: keep what a restart can serve again."""
        await self.lifecycle.persist()

    async def housekeeping(self, now: float) -> None:
        await self.lifecycle.housekeeping(now)
        self.probe.check(now)

    # -- the object store's sweep (cluster/sweep.py decides what is dead)

    async def listing(self) -> list[ObjectInfo]:
        """Every object in the store, for a sweep (counted as one)."""
        assert self.tier is not None
        self.tier.stats.sweeps += 1
        return await self.tier.objects.list_objects()

    async def swept(self, kind: str, keys: list[str]) -> None:
        """Delete objects a sweep found dead, counted by why (`released`, `expired`, `probe`; `lease`: leases of
        daemons gone with nothing of theirs left, not counted)."""
        assert self.tier is not None
        await self.tier.objects.delete(keys)
        self.tier.stats.swept(kind, len(keys))

    def sweep_kept(self, objects: int) -> None:
        assert self.tier is not None
        self.tier.stats.sweep_kept_objects += objects

    # -- what it says about itself

    def stats(self) -> tuple[StoreStats, DiskStats, FilesystemStats | None, TierStats]:
        space = self.disk.space() if self.disk is not None else None
        return (
            self.store.stats(),
            self.disk.syncs.snapshot() if self.disk is not None else DiskStats(),
            FilesystemStats(capacity_bytes=space[0], free_bytes=space[1]) if space else None,
            self.tier.stats.copy() if self.tier is not None else TierStats(),
        )

    def readiness(self, disk_free: float) -> list[str]:
        """Why storage should not take new pushes (empty: it may): a nearly full disk, an object store failing."""
        space = self.disk.space() if self.disk is not None else None
        reasons = []
        if self.disk is not None and space is not None and space[1] < disk_free * space[0]:
            reasons.append(f"disk nearly full: {space[1]} of {space[0]} bytes free in {self.disk.root}")
        return reasons + self.probe.reasons()

    def describe(self) -> dict[str, str | None]:
        """Where data goes, for the daemon's ready line."""
        if self.disk is not None:
            data_dir = self.disk.root
        elif self.spiller.target is not None:
            data_dir = "none (spills go to the object store)"
        else:
            data_dir = "none (memory only: a full pool fails pushes)"
        return {"data_dir": data_dir, "object_store": repr(self.objects) if self.objects is not None else None}
