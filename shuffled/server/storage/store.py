"""The daemon's store: the applications it holds data for, their shuffles and map outputs (shuffles.py
is what they are), from the first push to their removal.

It opens map outputs and takes their pushed pieces within the applications' quotas (quotas.py), commits
and aborts them, counts the pool memory their pieces hold (what spilling can free), and drops shuffles and
applications. Where pieces are, and moving them, is `Placement`'s; whose credentials an application's data
belongs to, `AppKeys`'; data found at a restart or in another node's objects is served again by
restore.py. This module does no I/O.
"""

from __future__ import annotations

import itertools
import time
from array import array

from ...buffers import Buffer
from ...ops.stats import StoreStats
from ...protocol.errors import (
    InvalidRequest,
    LimitExceeded,
    MapOutputStateError,
    ShuffledError,
)
from ...protocol.frames import check_app_id
from ...protocol.packed import PushedGroup
from .access import AppKeys
from .at_rest import AtRestKeys
from .placement import Placement
from .quotas import Quotas
from .shuffles import FILE, MAX_PARTITIONS, AppUsage, MapOutput, MapState, ShuffleData, touch


class Store:
    """What the daemon holds (see the module)."""

    def __init__(
        self,
        segment_size: int = 32 << 10,
        memory_quota: int = 0,
        disk_quota: int = 0,
        *,
        max_partitions: int = MAX_PARTITIONS,
        can_spill: bool = False,
        moves_disk: bool = False,
    ) -> None:
        self.apps: dict[str, dict[int, ShuffleData]] = {}
        self.usage: dict[str, AppUsage] = {}
        self.segment_size = segment_size
        self.quotas = Quotas(segment_size, memory_quota, disk_quota, can_spill=can_spill, moves_disk=moves_disk)
        #: most reduce partitions a shuffle may declare here (a daemon setting, at most MAX_PARTITIONS)
        self.max_partitions = max_partitions
        #: pool segments all stored pieces hold (what spilling can free), and their bytes
        self.memory_segments = 0
        self.memory_bytes = 0
        self.commits = 0
        #: bytes of every attempt ever committed here (a counter: what Spark's map tasks wrote)
        self.committed_bytes = 0
        self.aborts = 0
        #: where the pieces are (memory, the data file, objects), and the data file's garbage
        self.placement = Placement(self.apps, self._hold)
        self.app_keys = AppKeys()
        #: the keys its pieces are sealed with where they are written (at_rest.py; None: not sealed)
        self.at_rest: AtRestKeys | None = None
        #: attempts' serials: from the clock, so a later life of the daemon never repeats an earlier one's
        self._serials = itertools.count(time.time_ns())

    # -- push side

    def open_map_output(
        self,
        app: str,
        shuffle: int,
        map_index: int,
        attempt: int,
        partitions: int,
        replica_of: str | None = None,
        replicas: int = 1,
    ) -> MapOutput:
        check_app_id(app)
        if not 0 < partitions <= MAX_PARTITIONS:
            raise InvalidRequest(f"partition count {partitions} outside 1..{MAX_PARTITIONS}")
        if partitions > self.max_partitions:
            raise LimitExceeded(f"partition count {partitions} above max-partitions ({self.max_partitions})")
        if shuffle < 0 or map_index < 0 or attempt < 0:
            raise InvalidRequest("shuffle id, map index and attempt id must be >= 0")
        usage = self.usage.get(app)
        if usage is not None:
            self.quotas.check_disk(app, usage)
        data = self.shuffle_data(app, shuffle, partitions)
        if data.partitions != partitions:
            raise InvalidRequest(f"shuffle {app}/{shuffle} has {data.partitions} partitions, writer says {partitions}")
        if attempt in data.committed or attempt in data.open:
            raise MapOutputStateError(f"map attempt {attempt} of {app}/{shuffle} is already open or committed")
        out = MapOutput(data, map_index, attempt, next(self._serials), replica_of, replicas)
        data.open[attempt] = out
        data.usage.last_active = time.monotonic()
        touch(data)
        return out

    def shuffle_data(self, app: str, shuffle: int, partitions: int) -> ShuffleData:
        shuffles = self.apps.setdefault(app, {})
        data = shuffles.get(shuffle)
        if data is None:
            usage = self.usage.setdefault(app, AppUsage())
            data = shuffles[shuffle] = ShuffleData(app, shuffle, partitions, usage)
        return data

    def add(self, out: MapOutput, buffer: Buffer, crc: int, group: PushedGroup) -> None:
        """Take ownership of a pushed packed group (its one reference moves to the store), its checked CRC32C
        and its checked directory (`packed.check_push`); a refused one is released."""
        try:
            if out.state is not MapState.OPEN:
                raise MapOutputStateError(f"push to a map output that is {out.state.value}")
            data = out.shuffle
            self.quotas.check_disk(data.app, data.usage)
            self.quotas.check_memory(data.app, data.usage)
        except ShuffledError:
            buffer.release()
            raise
        out.append(buffer, crc, group)
        self._hold(out, 1, buffer.length)

    def _hold(self, out: MapOutput, segments: int, length: int) -> None:
        """Count (or, negative, uncount) in-memory pieces everywhere memory is counted."""
        out.memory_bytes += length
        data = out.shuffle
        data.segments += segments
        data.memory_bytes += length
        data.usage.segments += segments
        self.memory_segments += segments
        self.memory_bytes += length

    def commit(self, out: MapOutput, copies: tuple[str, ...] = ()) -> array[int]:
        """Make the attempt readable; `copies` are the daemons that committed its replicas first. Returns
        its bytes per partition (the CommitAck's u64 array), which are not kept."""
        if out.state is not MapState.OPEN:
            raise MapOutputStateError(f"commit of a map output that is {out.state.value}")
        data = out.shuffle
        runs, out.runs = out.runs, None
        assert runs is not None
        out.state = MapState.COMMITTED
        del data.open[out.attempt]
        data.committed[out.attempt] = out
        data.bytes += out.bytes
        self.commits += 1
        self.committed_bytes += out.bytes
        data.mark(out, copies)
        data.last_commit = data.usage.last_active = time.monotonic()
        touch(data)
        return runs.lengths(data.partitions)

    def abort(self, out: MapOutput) -> None:
        if out.state is not MapState.OPEN:
            return
        out.state = MapState.ABORTED
        out.runs = None
        data = out.shuffle
        data.open.pop(out.attempt, None)
        self._drop(out)
        self.aborts += 1

    def _drop(self, out: MapOutput) -> None:
        """The attempt is gone for good: give back its memory now; its pieces in the data file become garbage
        (they stay until the file goes when the whole shuffle is being dropped; pieces in objects go with
        their objects)."""
        data = out.shuffle
        if data.file is not None and not data.removed:
            stored = [(out.offsets[i], out.sizes[i]) for i in range(out.placed) if out.places[i] == FILE]
            self.placement.discard(data, stored)
        memory, out.memory = out.memory, []
        for buf in memory:
            buf.release()
        self._hold(out, -len(memory), -out.memory_bytes)

    # -- cleanup

    def _free(self, data: ShuffleData) -> int:
        freed = data.segments
        for out in list(data.open.values()):
            self.abort(out)
        data.removed = True
        for out in data.committed.values():
            out.state = MapState.REMOVED
            self._drop(out)
        data.committed.clear()
        data.usage.disk_bytes -= data.disk_bytes
        return freed

    def unregister_shuffle(self, app: str, shuffle: int) -> tuple[int, list[ShuffleData]]:
        """Drop a shuffle; returns the segments it held (freed now or when readers let go) and what was dropped."""
        shuffles = self.apps.get(app)
        if not shuffles or shuffle not in shuffles:
            return 0, []
        data = shuffles.pop(shuffle)
        freed = self._free(data)
        if not shuffles:
            del self.apps[app]
            self.usage.pop(app, None)
        return freed, [data]

    def empty_applications(self) -> list[str]:
        """Applications holding nothing: every map output opened for them was aborted (their client gone, say).
        Kept, each would cost its id and usage until `app-ttl`, and one tenant could leave any number."""
        return [app for app, shuffles in self.apps.items() if not any(d.open or d.committed for d in shuffles.values())]

    def remove_application(self, app: str) -> tuple[int, list[ShuffleData]]:
        shuffles = self.apps.pop(app, {})
        self.usage.pop(app, None)
        self.app_keys.forget(app)
        return sum(self._free(d) for d in shuffles.values()), list(shuffles.values())

    def stats(self) -> StoreStats:
        shuffles = [d for s in self.apps.values() for d in s.values()]
        outs = [o for d in shuffles for o in (*d.committed.values(), *d.open.values())]
        return StoreStats(
            applications=len(self.apps),
            shuffles=len(shuffles),
            stored_segments=self.memory_segments,
            stored_bytes=sum(d.bytes for d in shuffles),
            memory_bytes=self.memory_bytes,
            attempts=len(outs),
            pieces=sum(o.pieces for o in outs),
            open_map_outputs=sum(len(d.open) for d in shuffles),
            commits=self.commits,
            committed_bytes=self.committed_bytes,
            aborts=self.aborts,
            replica_attempts=sum(len(d.replica_of) for d in shuffles),
            replica_bytes=sum(d.replica_bytes for d in shuffles),
            under_replicated=sum(d.under_replicated for d in shuffles),
        )
