"""What a daemon holds: application → shuffle → map outputs and reduce partitions.

Pushed buffers stay with their map output until commit; commit appends them to the
shuffle's reduce partitions in one step (the event loop is single-threaded, so a
reader sees all of an attempt or none of it). A reduce partition is one list of
chunks fed by every local map task, each chunk tagged with its map attempt, so a
reader gets one sequential stream per host and the daemon can filter attempts.

Memory lives in pool segments: each stored chunk holds one reference on its
buffer; readers take their own reference per queued chunk, so dropping a shuffle
while it is being read frees its memory once the last reader let go.
Spill (the durability issue) slots in behind `Subpartition`: chunks may then
refer to file ranges instead of buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ..buffers import Buffer
from ..net.streams import Chunk
from ..protocol.errors import InvalidRequest, MapOutputStateError, PartitionNotFound

MAX_PARTITIONS = 1 << 24


class MapState(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(slots=True, eq=False)
class MapOutput:
    shuffle: ShuffleData
    map_index: int
    attempt: int
    pending: list[Chunk] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    state: MapState = MapState.OPEN


@dataclass(slots=True)
class Subpartition:
    """One reduce partition on this host (Flink's ResultSubpartition, blocking)."""

    chunks: list[Chunk] = field(default_factory=list)
    bytes: int = 0


@dataclass(slots=True, eq=False)
class ShuffleData:
    """One Spark shuffle on this host (Flink's ResultPartition)."""

    app: str
    shuffle: int
    partitions: int
    subpartitions: dict[int, Subpartition] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)  # attempt -> map index
    open: dict[int, MapOutput] = field(default_factory=dict)  # attempt -> map output
    segments: int = 0
    bytes: int = 0


class Store:
    def __init__(self) -> None:
        self.apps: dict[str, dict[int, ShuffleData]] = {}
        self.commits = 0
        self.aborts = 0

    # -- push side

    def open_map_output(self, app: str, shuffle: int, map_index: int, attempt: int, partitions: int) -> MapOutput:
        if not app:
            raise InvalidRequest("application id must not be empty")
        if not 0 < partitions <= MAX_PARTITIONS:
            raise InvalidRequest(f"partition count {partitions} outside 1..{MAX_PARTITIONS}")
        if shuffle < 0 or map_index < 0 or attempt < 0:
            raise InvalidRequest("shuffle id, map index and attempt id must be >= 0")
        shuffles = self.apps.setdefault(app, {})
        data = shuffles.get(shuffle)
        if data is None:
            data = shuffles[shuffle] = ShuffleData(app, shuffle, partitions)
        elif data.partitions != partitions:
            raise InvalidRequest(f"shuffle {app}/{shuffle} has {data.partitions} partitions, writer says {partitions}")
        if attempt in data.committed or attempt in data.open:
            raise MapOutputStateError(f"map attempt {attempt} of {app}/{shuffle} is already open or committed")
        out = MapOutput(data, map_index, attempt, lengths=[0] * partitions)
        data.open[attempt] = out
        return out

    def add(self, out: MapOutput, partition: int, buffer: Buffer) -> None:
        """Take ownership of a pushed buffer (its one reference moves to the store)."""
        if out.state is not MapState.OPEN:
            buffer.release()
            raise MapOutputStateError(f"push to a map output that is {out.state.value}")
        if not 0 <= partition < out.shuffle.partitions:
            buffer.release()
            raise InvalidRequest(f"partition {partition} outside 0..{out.shuffle.partitions - 1}")
        out.pending.append(Chunk(buffer, partition, out.attempt))
        out.lengths[partition] += buffer.length
        out.shuffle.segments += 1

    def commit(self, out: MapOutput) -> list[int]:
        if out.state is not MapState.OPEN:
            raise MapOutputStateError(f"commit of a map output that is {out.state.value}")
        data = out.shuffle
        out.state = MapState.COMMITTED
        del data.open[out.attempt]
        data.committed[out.attempt] = out.map_index
        for chunk in out.pending:
            sub = data.subpartitions.get(chunk.partition)
            if sub is None:
                sub = data.subpartitions[chunk.partition] = Subpartition()
            sub.chunks.append(chunk)
            sub.bytes += chunk.buffer.length
            data.bytes += chunk.buffer.length
        out.pending = []
        self.commits += 1
        return out.lengths

    def abort(self, out: MapOutput) -> None:
        if out.state is not MapState.OPEN:
            return
        out.state = MapState.ABORTED
        data = out.shuffle
        data.open.pop(out.attempt, None)
        for chunk in out.pending:
            chunk.buffer.release()
        data.segments -= len(out.pending)
        out.pending = []
        self.aborts += 1

    # -- read side

    def snapshot(self, app: str, shuffle: int, start: int, end: int, attempts: list[int]) -> list[Chunk]:
        """Chunks of partitions [start, end) from exactly these committed attempts, each retained once."""
        data = self.apps.get(app, {}).get(shuffle)
        if data is None:
            if not attempts:
                return []
            raise PartitionNotFound(f"shuffle {app}/{shuffle} is not held by this daemon")
        if not 0 <= start <= end <= data.partitions:
            raise InvalidRequest(f"partition range [{start}, {end}) outside 0..{data.partitions}")
        missing = [a for a in attempts if a not in data.committed]
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
            raise PartitionNotFound(f"map attempts not committed here for {app}/{shuffle}: {shown}")
        wanted = set(attempts)
        out: list[Chunk] = []
        for p in range(start, end):
            sub = data.subpartitions.get(p)
            if sub is None:
                continue
            for chunk in sub.chunks:
                if chunk.attempt in wanted:
                    chunk.buffer.retain()
                    out.append(chunk)
        return out

    # -- cleanup

    def _free(self, data: ShuffleData) -> int:
        freed = data.segments
        for out in list(data.open.values()):
            self.abort(out)
        for sub in data.subpartitions.values():
            for chunk in sub.chunks:
                chunk.buffer.release()
        data.subpartitions.clear()
        data.committed.clear()
        data.segments = 0
        return freed

    def unregister_shuffle(self, app: str, shuffle: int) -> int:
        """Drop a shuffle; returns the segments it held (freed now or when readers let go)."""
        shuffles = self.apps.get(app)
        if not shuffles or shuffle not in shuffles:
            return 0
        freed = self._free(shuffles.pop(shuffle))
        if not shuffles:
            del self.apps[app]
        return freed

    def remove_application(self, app: str) -> int:
        shuffles = self.apps.pop(app, {})
        return sum(self._free(d) for d in shuffles.values())

    def stats(self) -> dict[str, int]:
        shuffles = [d for s in self.apps.values() for d in s.values()]
        return {
            "applications": len(self.apps),
            "shuffles": len(shuffles),
            "stored_segments": sum(d.segments for d in shuffles),
            "stored_bytes": sum(d.bytes for d in shuffles),
            "open_map_outputs": sum(len(d.open) for d in shuffles),
            "commits": self.commits,
            "aborts": self.aborts,
        }
