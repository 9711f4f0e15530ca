"""What a daemon holds: application → shuffle → map attempts → pieces.

A *piece* is one pushed packed group (PROTOCOL.md §3.3: many partitions' runs of one map
attempt, with a small directory) as stored: its bytes in one pool segment or, once
spilled, at an offset of the shuffle's one data file. The directory inside the piece is
the index of its runs, so the store keeps nothing per (partition, attempt) block: an
attempt is one `MapOutput` holding its pieces in push order as rows of compact arrays
(first and last partition, length, CRC32C; a place and an offset there once stored below
memory) plus the list of the segments of those still in memory. A piece in memory costs
one list entry and four array cells, a stored one six cells.

Within an attempt the pieces with a place are a prefix (`placed`) of what was pushed:
the data file (place 0) or one of the shuffle's objects (place k, `ShuffleData.objects`);
a spill writes the oldest in-memory pieces, and a move to the object store changes a
piece's place, never its position. The pieces from `spilled` on are in memory;
`spilled <= placed`, and pieces in `[spilled, placed)` are both (uploaded to an object
for durability and kept as a cache): freeing their memory needs no write.
An attempt's pieces form one ascending *sequence* when each starts at or after the
partition the previous one ended with (a writer that sorted its output by partition);
otherwise `starts` lists where each new sequence begins, and reads merge them by
partition (plan.py).

Commit makes an attempt readable in one step (the event loop is single-threaded, so
a reader sees all of it or none). Memory lives in pool segments: each in-memory piece
holds one reference on its buffer, dropped exactly once (spilled, aborted or removed);
spill writes and served frames take their own references. This module does no I/O.
"""

from __future__ import annotations

import hmac
import itertools
import time
from array import array
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from enum import Enum

from ...buffers import Buffer
from ...ops.stats import StoreStats
from ...protocol.errors import (
    AuthFailed,
    InvalidRequest,
    LimitExceeded,
    MapOutputStateError,
    PartitionNotFound,
    QuotaExceeded,
    ShuffledError,
)
from ...protocol.packed import LengthTally, PushedGroup
from .disk import LoadedShuffle, SpillFile, StoredObject

#: a piece's place: the shuffle's data file (others are 1 + an index into `ShuffleData.objects`)
FILE = 0

MAX_PARTITIONS = 1 << 24


class MapState(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"
    #: its shuffle was unregistered or its application removed
    REMOVED = "removed"


class MapOutput:
    """One map attempt's data on this host: its pieces in push order (see the module)."""

    __slots__ = (
        "attempt",
        "bytes",
        "crcs",
        "durable",
        "firsts",
        "lasts",
        "map_index",
        "memory",
        "memory_bytes",
        "offsets",
        "on_failure",
        "placed",
        "places",
        "replica_of",
        "replicas",
        "runs",
        "serial",
        "shuffle",
        "size",
        "sizes",
        "spilled",
        "starts",
        "state",
        "taken",
        "wants_durable",
    )

    def __init__(
        self,
        shuffle: ShuffleData,
        map_index: int,
        attempt: int,
        serial: int,
        replica_of: str | None = None,
        replicas: int = 1,
    ) -> None:
        self.shuffle = shuffle
        self.map_index = map_index
        self.attempt = attempt
        #: tells this attempt's records in the journal from those of an aborted one with the same id
        self.serial = serial
        self.state = MapState.OPEN
        #: fails the push session (e.g. when spilling its data hit a full disk)
        self.on_failure: Callable[[ShuffledError], None] | None = None
        #: a replica push (§12.4): the node of the primary it copies; None for data a client pushed here
        self.replica_of = replica_of
        #: copies of this map output wanted, this one included
        self.replicas = replicas
        #: per piece, in push order: first and last partition, length, CRC32C as the writer sent it
        self.firsts = array("I")
        self.lasts = array("I")
        self.sizes = array("I")
        self.crcs = array("I")
        #: where the first `placed` pieces are: their place (FILE, or 1 + an object's index) and offset there
        self.places = array("I")
        self.offsets = array("Q")
        self.placed = 0
        #: pieces [0, spilled) are no longer in memory (spilled <= placed)
        self.spilled = 0
        #: pieces [placed, taken) are being written by a spill; an upload takes them all
        self.taken = 0
        #: its commit is to be made durable in the object store, and has been (an object holds its commit)
        self.wants_durable = False
        self.durable = False
        #: segments of pieces [spilled, len(sizes)), in order
        self.memory: list[Buffer] = []
        #: piece indices where an ascending sequence starts (see the module)
        self.starts = array("I")
        #: bytes of runs (what the CommitAck sums to), of pieces, of pieces in memory
        self.bytes = 0
        self.size = 0
        self.memory_bytes = 0
        #: bytes per partition while the push is open (for its CommitAck); None once committed
        self.runs: LengthTally | None = LengthTally()

    @property
    def pieces(self) -> int:
        return len(self.sizes)

    @property
    def dead(self) -> bool:
        return self.state is MapState.ABORTED or self.state is MapState.REMOVED

    def sequences(self) -> list[tuple[int, int]]:
        """The piece index ranges of its ascending sequences."""
        ends = [*self.starts[1:], len(self.sizes)] if self.starts else []
        return list(zip(self.starts, ends, strict=True))

    def buffer(self, index: int) -> Buffer | None:
        """The segment holding piece `index`, None if it is only on disk or in an object."""
        return self.memory[index - self.spilled] if index >= self.spilled else None

    @property
    def movable(self) -> int:
        """Pieces in memory a spill may free: those not being written, and those an object holds already."""
        return max(0, self.pieces - max(self.taken, self.placed)) + (self.placed - self.spilled)

    def unplaced_bytes(self) -> int:
        """Bytes of its pieces not yet in an object (in memory or the data file): what an upload takes."""
        places, sizes = self.places, self.sizes
        return sum(sizes[i] for i in range(self.placed) if places[i] == FILE) + sum(sizes[self.placed :])


@dataclass(slots=True, frozen=True)
class Garbage:
    """Bytes in a spill file that no read will ever want: an aborted attempt's pieces."""

    shuffle: ShuffleData
    path: str
    offset: int
    length: int


@dataclass(slots=True)
class AppUsage:
    segments: int = 0
    disk_bytes: int = 0
    last_active: float = field(default_factory=time.monotonic)


@dataclass(slots=True, eq=False)
class ShuffleData:
    """One Spark shuffle on this host (Flink's ResultPartition)."""

    app: str
    shuffle: int
    partitions: int
    usage: AppUsage
    committed: dict[int, MapOutput] = field(default_factory=dict)
    open: dict[int, MapOutput] = field(default_factory=dict)
    #: pool segments its pieces hold (open and committed) and their bytes
    segments: int = 0
    memory_bytes: int = 0
    #: bytes of runs of committed attempts (memory and disk)
    bytes: int = 0
    disk_bytes: int = 0
    #: its one data file, once something was spilled
    file: SpillFile | None = None
    #: replica attempt -> the primary's node (§12.4); these count everywhere like any other attempt
    replica_of: dict[int, str] = field(default_factory=dict)
    #: committed attempt -> copies its pusher wanted, this one included
    replicas: dict[int, int] = field(default_factory=dict)
    #: attempt pushed here by a client -> the daemons holding its replicas (those that acked the commit)
    copies: dict[int, tuple[str, ...]] = field(default_factory=dict)
    #: committed bytes of replica attempts, and attempts pushed here with fewer copies than wanted
    replica_bytes: int = 0
    under_replicated: int = 0
    #: the objects holding its pieces: place k is objects[k - 1]
    objects: list[StoredObject] = field(default_factory=list)
    #: loads of its pieces under way: blocks of its file are punched only while none is (a load that found
    #: a piece in the file reads it there even if the piece moved to an object meanwhile)
    loading: int = 0
    #: the shuffle's directory once it has a journal on disk
    directory: str | None = None
    removed: bool = False
    last_commit: float = field(default_factory=time.monotonic)


def commit_fields(data: ShuffleData, attempt: int) -> dict[str, object]:
    """A committed attempt's commit as a journal record and an object footer keep it: what its pieces must add
    up to (`pieces`, `size`), its bytes and map index, and its replica marking (§12.4), so a restart or
    another daemon knows what it holds for whom: `of` the primary of a replica, `copies` where a pushed
    attempt's replicas are, `r` copies wanted."""
    out = data.committed[attempt]
    record: dict[str, object] = {
        "attempt": attempt,
        "serial": out.serial,
        "map": out.map_index,
        "bytes": out.bytes,
        "pieces": out.pieces,
        "size": out.size,
        "r": data.replicas.get(attempt, 1),
    }
    if attempt in data.replica_of:
        record["of"] = data.replica_of[attempt]
    if attempt in data.copies:
        record["copies"] = list(data.copies[attempt])
    return record


class Store:
    def __init__(self, segment_size: int = 32 << 10, memory_quota: int = 0, disk_quota: int = 0) -> None:
        self.apps: dict[str, dict[int, ShuffleData]] = {}
        self.usage: dict[str, AppUsage] = {}
        self.segment_size = segment_size
        #: per application, in segments and bytes; 0 = no cap
        self.memory_quota = memory_quota // segment_size
        self.disk_quota = disk_quota
        #: spill is possible (a data dir or an object store is set): the memory quota spills instead of refusing
        self.can_spill = False
        #: spill files can move to the object store: the disk quota moves them instead of refusing pushes
        self.moves_disk = False
        #: most reduce partitions a shuffle may declare here (a daemon setting, at most MAX_PARTITIONS)
        self.max_partitions = MAX_PARTITIONS
        #: pool segments all stored pieces hold (what spilling can free), and their bytes
        self.memory_segments = 0
        self.memory_bytes = 0
        self.commits = 0
        #: bytes of every attempt ever committed here (a counter: what Spark's map tasks wrote)
        self.committed_bytes = 0
        self.aborts = 0
        #: spilled bytes of aborted attempts, for the spiller to give back to the file system
        self.garbage: list[Garbage] = []
        #: application -> digest of the token it is bound to (b"": bound to requests without one)
        self.app_keys: dict[str, bytes] = {}
        #: attempts' serials: from the clock, so a later life of the daemon never repeats an earlier one's
        self._serials = itertools.count(time.time_ns())

    # -- isolation

    def authorize(self, app: str, digest: bytes) -> None:
        """Refuse a request about `app` whose token digest (`token_digest`) is not the one the application
        is bound to.

        Whoever asks, a client or a peer daemon: peers forward the client's token with every relayed
        read and propagated removal, and its digest with every replica push, so the daemon that holds
        the data checks it. Trusting a peer instead would let anyone who knows the cluster secret reach
        another application's data through a daemon that relays for it, or by claiming to be a daemon
        itself. A digest is what a replica push can carry: the store keeps no token.
        """
        bound = self.app_keys.get(app)
        if bound is None:
            return
        if not hmac.compare_digest(bound, digest):
            why = "carries no token" if not digest else "carries a different token"
            raise AuthFailed(
                f"application {app} belongs to other credentials: this request {why} (a different app secret?)"
            )

    def bind(self, app: str, digest: bytes) -> None:
        """The first map output of an application binds it to its writer's token digest."""
        self.app_keys.setdefault(app, digest)

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
        if not app:
            raise InvalidRequest("application id must not be empty")
        if not 0 < partitions <= MAX_PARTITIONS:
            raise InvalidRequest(f"partition count {partitions} outside 1..{MAX_PARTITIONS}")
        if partitions > self.max_partitions:
            raise LimitExceeded(f"partition count {partitions} above max-partitions ({self.max_partitions})")
        if shuffle < 0 or map_index < 0 or attempt < 0:
            raise InvalidRequest("shuffle id, map index and attempt id must be >= 0")
        usage = self.usage.get(app)
        if usage is not None:
            self._check_disk_quota(app, usage)
        data = self._shuffle(app, shuffle, partitions)
        if data.partitions != partitions:
            raise InvalidRequest(f"shuffle {app}/{shuffle} has {data.partitions} partitions, writer says {partitions}")
        if attempt in data.committed or attempt in data.open:
            raise MapOutputStateError(f"map attempt {attempt} of {app}/{shuffle} is already open or committed")
        out = MapOutput(data, map_index, attempt, next(self._serials), replica_of, replicas)
        data.open[attempt] = out
        data.usage.last_active = time.monotonic()
        return out

    def _shuffle(self, app: str, shuffle: int, partitions: int) -> ShuffleData:
        shuffles = self.apps.setdefault(app, {})
        data = shuffles.get(shuffle)
        if data is None:
            usage = self.usage.setdefault(app, AppUsage())
            data = shuffles[shuffle] = ShuffleData(app, shuffle, partitions, usage)
        return data

    def _check_disk_quota(self, app: str, usage: AppUsage) -> None:
        if self.disk_quota and not self.moves_disk and usage.disk_bytes >= self.disk_quota:
            raise QuotaExceeded(
                f"application {app} holds {usage.disk_bytes} bytes on this daemon's disk, "
                f"its quota is {self.disk_quota} (--app-disk-quota)"
            )

    def add(self, out: MapOutput, buffer: Buffer, crc: int, group: PushedGroup) -> None:
        """Take ownership of a pushed packed group (its one reference moves to the store), its checked CRC32C
        and its checked directory (`packed.check_push`); a refused one is released."""
        try:
            if out.state is not MapState.OPEN:
                raise MapOutputStateError(f"push to a map output that is {out.state.value}")
            data = out.shuffle
            usage = data.usage
            self._check_disk_quota(data.app, usage)
            if self.memory_quota and not self.can_spill and usage.segments >= self.memory_quota:
                raise QuotaExceeded(
                    f"application {data.app} holds {usage.segments} segments of this daemon's memory, its quota "
                    f"is {self.memory_quota} (--app-memory-quota; without --data-dir nothing can be spilled)"
                )
        except ShuffledError:
            buffer.release()
            raise
        assert out.runs is not None
        out.runs.add(group.entries)
        first, length = group.first, buffer.length
        if not out.sizes or first < out.lasts[-1]:
            out.starts.append(len(out.sizes))
        out.firsts.append(first)
        out.lasts.append(group.last)
        out.sizes.append(length)
        out.crcs.append(crc)
        out.memory.append(buffer)
        out.bytes += group.data_bytes
        out.size += length
        self._hold(out, 1, length)

    def _hold(self, out: MapOutput, segments: int, length: int) -> None:
        """Count (or, negative, uncount) in-memory pieces everywhere memory is counted."""
        out.memory_bytes += length
        data = out.shuffle
        data.segments += segments
        data.memory_bytes += length
        data.usage.segments += segments
        self.memory_segments += segments
        self.memory_bytes += length

    def over_memory_quota(self, app: str) -> bool:
        usage = self.usage.get(app)
        return bool(self.memory_quota) and usage is not None and usage.segments > self.memory_quota

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
        self._mark(data, out, copies)
        data.last_commit = data.usage.last_active = time.monotonic()
        return runs.lengths(data.partitions)

    @staticmethod
    def _mark(data: ShuffleData, out: MapOutput, copies: tuple[str, ...]) -> None:
        """Record what a committed attempt is a copy of, or where its copies are (commit and restart)."""
        data.replicas[out.attempt] = out.replicas
        if out.replica_of is not None:
            data.replica_of[out.attempt] = out.replica_of
            data.replica_bytes += out.bytes
            return
        if copies:
            data.copies[out.attempt] = copies
        if len(copies) < out.replicas - 1:
            data.under_replicated += 1

    def holds(self, app: str, shuffle: int, attempts: list[int]) -> tuple[list[int], list[int]]:
        """Which of these attempts are committed here, and the bytes each holds (for a drain deciding what
        still needs a copy elsewhere)."""
        data = self.apps.get(app, {}).get(shuffle)
        if data is None:
            return [], []
        held = [a for a in attempts if a in data.committed]
        return held, [data.committed[a].bytes for a in held]

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
            self._garbage(data, [(out.offsets[i], out.sizes[i]) for i in range(out.placed) if out.places[i] == FILE])
        memory, out.memory = out.memory, []
        for buf in memory:
            buf.release()
        self._hold(out, -len(memory), -out.memory_bytes)

    def _garbage(self, data: ShuffleData, ranges: list[tuple[int, int]]) -> None:
        assert data.file is not None
        self.garbage.extend(Garbage(data, data.file.path, offset, length) for offset, length in ranges)

    # -- spill side (the Spiller does the I/O)

    def take_for_spill(self, out: MapOutput, limit: int | None = None) -> tuple[int, int]:
        """Mark the attempt's oldest in-memory pieces not being written (at most `limit`) as being written:
        their index range. The rest stay, and new pushes go after them. Pieces in memory that an object
        holds already are freed first (no write needed)."""
        self.release_placed(out)
        start = out.taken = max(out.taken, out.placed)
        end = out.pieces if limit is None else min(out.pieces, start + limit)
        out.taken = end
        return start, end

    def spilled(self, out: MapOutput, start: int, end: int, offset: int, place: int = FILE) -> None:
        """Pieces [start, end) are in `place` (the shuffle's file, or an object) from `offset` on, back to back:
        free their memory. An attempt dropped meanwhile leaves garbage instead."""
        data = out.shuffle
        assert start == out.placed, "spills of an attempt end in the order they were taken"
        at = offset
        for i in range(start, end):
            out.offsets.append(at)
            at += out.sizes[i]
        out.places.extend(array("I", [place]) * (end - start))
        out.placed = end
        if out.dead:
            out.spilled = end
            if place == FILE and not data.removed and data.file is not None:
                self._garbage(data, [(offset, at - offset)])
            return
        self.release_placed(out)

    def release_placed(self, out: MapOutput) -> int:
        """Free the memory of pieces that also have a place (spilled, or uploaded as a durable copy); the
        segments freed."""
        n = out.placed - out.spilled
        if n <= 0:
            return 0
        moved, out.memory = out.memory[:n], out.memory[n:]
        out.spilled = out.placed
        length = sum(b.length for b in moved)
        for buf in moved:
            buf.release()
        self._hold(out, -n, -length)
        return n

    def uploaded(self, out: MapOutput, indices: list[int], place: int, offset: int) -> None:
        """Pieces `indices` (ascending, every piece of the attempt not yet in an object from the first on)
        are now in object `place`, back to back from `offset`: those in the data file leave it (their blocks
        become garbage), those in memory stay there as a cache until memory is needed."""
        data = out.shuffle
        moved: list[tuple[int, int]] = []
        at = offset
        for i in indices:
            if i < out.placed:
                if out.places[i] == FILE:
                    moved.append((out.offsets[i], out.sizes[i]))
                out.places[i] = place
                out.offsets[i] = at
            else:
                assert i == out.placed, "memory pieces are uploaded in push order"
                out.places.append(place)
                out.offsets.append(at)
                out.placed += 1
            at += out.sizes[i]
        if moved and data.file is not None and not data.removed:
            self._garbage(data, moved)

    def add_object(self, data: ShuffleData, stored: StoredObject) -> int:
        """A new object of the shuffle; its place."""
        data.objects.append(stored)
        return len(data.objects)

    @staticmethod
    def unspilled(out: MapOutput, start: int) -> None:
        """A spill or upload failed: its pieces stay where they were, to be taken again first."""
        out.taken = min(out.taken, start)

    def wrote(self, data: ShuffleData, written: int) -> None:
        """Bytes a spill appended to the shuffle's file (a dropped shuffle settled its accounting already)."""
        if not data.removed:
            data.disk_bytes += written
            data.usage.disk_bytes += written

    def largest_in_memory(
        self, app: str | None = None, busy: Container[MapOutput] = ()
    ) -> tuple[ShuffleData, list[MapOutput]] | None:
        """The shuffle holding the most memory (of one application, or of all) and its attempts holding
        memory that is not being written, the largest first then in push order; None if none."""
        candidates = [
            d
            for name, shuffles in self.apps.items()
            if app is None or name == app
            for d in shuffles.values()
            if d.segments
        ]
        for data in sorted(candidates, key=lambda d: d.segments, reverse=True):
            outs = [o for o in (*data.committed.values(), *data.open.values()) if o.movable and o not in busy]
            if outs:
                largest = max(outs, key=lambda o: o.movable)
                outs.remove(largest)
                return data, [largest, *outs]
        return None

    # -- read side

    def lookup(
        self, app: str, shuffle: int, start: int, end: int, attempts: list[int], *, digest: bytes
    ) -> tuple[ShuffleData, list[MapOutput]] | None:
        """The shuffle and these committed attempts, for a read of partitions [start, end); None for a
        shuffle this daemon does not hold when no attempt is named.

        The one gate every path that serves stored bytes passes, at the moment it serves (a client's read,
        a peer's relayed or resumed read, a failover to this daemon's own copy, a drain's copy): `digest`,
        the requester's token digest, must be the one the application is bound to now (`authorize`). A
        check made once, when a request arrives, is not enough: an application with no data here yet has
        no binding, and its first push binds it while a read naming it waits to fail over here.
        """
        self.authorize(app, digest)
        data = self.apps.get(app, {}).get(shuffle)
        if data is None:
            if not attempts:
                return None
            raise PartitionNotFound(f"shuffle {app}/{shuffle} is not held by this daemon")
        if not 0 <= start <= end <= data.partitions:
            raise InvalidRequest(f"partition range [{start}, {end}) outside 0..{data.partitions}")
        committed = data.committed
        missing = [a for a in attempts if a not in committed]
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
            raise PartitionNotFound(f"map attempts not committed here for {app}/{shuffle}: {shown}")
        data.usage.last_active = time.monotonic()
        return data, [committed[a] for a in attempts]

    # -- restart

    def restore(self, loaded: LoadedShuffle, file: SpillFile | None, node: str | None = None) -> ShuffleData:
        """Committed data found at start (the data dir's journal), or proved by a node's objects (`node`: their
        writer, None for this daemon's own), becomes servable. Attempts held already are left as they are.
        Returns the shuffle."""
        data = self._shuffle(loaded.app, loaded.shuffle, loaded.partitions)
        if file is not None:
            data.directory = loaded.directory
            data.file = file
            data.disk_bytes += file.size
            data.usage.disk_bytes += file.size
        if loaded.app_key is not None:
            self.bind(loaded.app, loaded.app_key)
        held = {o.key: place for place, o in enumerate(data.objects, start=1)}
        places = [FILE]  # a loaded place -> the shuffle's (an object adopted again keeps its place)
        for o in loaded.objects:
            places.append(held.get(o.key) or self.add_object(data, o))
        for attempt, found in loaded.committed.items():
            if attempt in data.committed or attempt in data.open:
                continue
            of = loaded.replica_of.get(attempt, node)
            out = MapOutput(data, found.map_index, attempt, found.serial, of, loaded.replicas.get(attempt, 1))
            out.state = MapState.COMMITTED
            out.runs = None
            out.firsts, out.lasts, out.sizes, out.crcs, out.offsets = (
                found.firsts,
                found.lasts,
                found.sizes,
                found.crcs,
                found.offsets,
            )
            out.places = array("I", map(places.__getitem__, found.places))
            out.placed = out.spilled = out.taken = out.pieces
            out.durable = out.wants_durable = attempt in loaded.durable
            out.starts = array("I", [0])
            out.starts.extend(i for i in range(1, out.pieces) if out.firsts[i] < out.lasts[i - 1])
            out.bytes, out.size = found.stored, sum(found.sizes)
            data.committed[attempt] = out
            data.bytes += out.bytes
            self._mark(data, out, loaded.copies.get(attempt, ()))
        return data

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

    def remove_application(self, app: str) -> tuple[int, list[ShuffleData]]:
        shuffles = self.apps.pop(app, {})
        self.usage.pop(app, None)
        self.app_keys.pop(app, None)
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
