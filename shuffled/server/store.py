"""What a daemon holds: application → shuffle → map outputs and reduce partitions.

Pushed buffers stay with their map output until commit; commit appends them to the
shuffle's reduce partitions in one step (the event loop is single-threaded, so a
reader sees all of an attempt or none of it). A reduce partition is one list of
chunks fed by every local map task, each chunk tagged with its map attempt, so a
reader gets one sequential stream per host and the daemon can filter attempts.

A chunk lives in a pool segment or, once spilled, at an offset of its partition's
file; committed spilled chunks are kept as 24-byte rows of `SpilledChunks`, not
as objects, so a daemon with much data on disk stays small. Every live in-memory
chunk of a partition, committed or not, is also listed in push order in
`Subpartition.memory`: a spill writes the front of that list, so for any
one (partition, attempt) the chunks on disk are a prefix, in file order, of what
was pushed, and the chunks in memory are the rest. A read therefore serves each
pair as one run: its disk chunks sorted by offset, then its memory chunks; pairs
follow each other in the order their data starts in the file, so the file is
still read mostly front to back.

Memory lives in pool segments: each in-memory chunk holds one reference on its
buffer, dropped exactly once (spilled, aborted or removed); readers and spills take
their own references, so dropping a shuffle while it is being read or spilled
frees its memory once the last of them let go. This module does no I/O.
"""

from __future__ import annotations

import hmac
import time
from array import array
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..buffers import Buffer
from ..protocol.errors import (
    AuthFailed,
    InvalidRequest,
    LimitExceeded,
    MapOutputStateError,
    PartitionNotFound,
    QuotaExceeded,
    ShuffledError,
)
from .chunks import Chunk
from .disk import LoadedShuffle, SpillFile
from .stats import StoreStats

MAX_PARTITIONS = 1 << 24


class MapState(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(slots=True, eq=False)
class StoredChunk:
    attempt: int
    length: int
    #: the pool segment while in memory; None once spilled or dropped
    buffer: Buffer | None
    #: offset in the partition's spill file once spilled
    offset: int = -1
    crc: int = 0
    #: its attempt was aborted or its shuffle removed: never spilled or served again
    dead: bool = False
    committed: bool = False


@dataclass(slots=True, frozen=True)
class Resume:
    """Where a read another copy served stopped (PROTOCOL.md §10.6): in partition `partition`, the pairs
    of attempts `done` were relayed whole, and the first `chunks` chunks (`bytes` in all) of `attempt`'s."""

    partition: int
    done: tuple[int, ...] = ()
    attempt: int | None = None
    chunks: int = 0
    bytes: int = 0

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Resume:
        """A PartitionRequest's `resume` map, whose types frames.py checked."""
        return cls(m["partition"], tuple(m["done"]), m.get("attempt"), m.get("chunks") or 0, m.get("bytes") or 0)

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {"partition": self.partition, "done": list(self.done)}
        if self.attempt is not None:
            m |= {"attempt": self.attempt, "chunks": self.chunks, "bytes": self.bytes}
        return m


@dataclass(slots=True, frozen=True)
class Garbage:
    """Bytes in a spill file that no read will ever want: an aborted attempt's chunk."""

    shuffle: ShuffleData
    path: str
    offset: int
    length: int


@dataclass(slots=True, frozen=True)
class DiskChunk:
    """A spilled chunk a read has to load: where it is and what it must checksum to."""

    path: str
    offset: int
    length: int
    crc: int
    partition: int
    attempt: int


class SpilledChunks:
    """A partition's committed chunks that live in its spill file: 24 bytes each in four arrays.

    A spilled chunk needs only where it is and what it must checksum to, and a
    daemon may hold millions of them; as objects they would cost several times more.
    """

    __slots__ = ("attempts", "crcs", "lengths", "offsets")

    def __init__(self) -> None:
        self.attempts = array("Q")
        self.offsets = array("Q")
        self.lengths = array("I")
        self.crcs = array("I")

    def __len__(self) -> int:
        return len(self.offsets)

    def append(self, attempt: int, offset: int, length: int, crc: int) -> None:
        self.attempts.append(attempt)
        self.offsets.append(offset)
        self.lengths.append(length)
        self.crcs.append(crc)

    def select(self, path: str, partition: int, wanted: set[int]) -> list[DiskChunk]:
        """The chunks of these attempts, in file order (one sequential pass)."""
        found = [
            DiskChunk(path, self.offsets[i], self.lengths[i], self.crcs[i], partition, a)
            for i, a in enumerate(self.attempts)
            if a in wanted
        ]
        found.sort(key=lambda c: c.offset)
        return found


@dataclass(slots=True, eq=False)
class Subpartition:
    """One reduce partition on this host (Flink's ResultSubpartition, blocking)."""

    partition: int
    #: committed chunks in memory, in commit order
    chunks: list[StoredChunk] = field(default_factory=list)
    #: committed chunks in the spill file
    spilled: SpilledChunks = field(default_factory=SpilledChunks)
    #: live in-memory chunks, committed or not, in push order (what a spill writes)
    memory: list[StoredChunk] = field(default_factory=list)
    memory_segments: int = 0
    bytes: int = 0
    file: SpillFile | None = None


@dataclass(slots=True, eq=False)
class MapOutput:
    shuffle: ShuffleData
    map_index: int
    attempt: int
    pending: list[tuple[Subpartition, StoredChunk]] = field(default_factory=list)
    #: bytes pushed per partition, sparse: an open map output costs nothing per declared partition
    #: (a writer may declare 2^24 of them; the full list exists only while the commit is answered)
    lengths: dict[int, int] = field(default_factory=dict)
    state: MapState = MapState.OPEN
    #: fails the push session (e.g. when spilling its data hit a full disk)
    on_failure: Callable[[ShuffledError], None] | None = None
    #: a replica push (§12.4): the node of the primary it copies; None for data a client pushed here
    replica_of: str | None = None
    #: copies of this map output wanted, this one included
    replicas: int = 1


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
    subpartitions: dict[int, Subpartition] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)  # attempt -> map index
    open: dict[int, MapOutput] = field(default_factory=dict)  # attempt -> map output
    #: committed attempt -> bytes per partition (only nonzero ones), for the journal
    lengths: dict[int, dict[int, int]] = field(default_factory=dict)
    segments: int = 0
    bytes: int = 0
    disk_bytes: int = 0
    files: int = 0
    #: replica attempt -> the primary's node (§12.4); these count everywhere like any other attempt
    replica_of: dict[int, str] = field(default_factory=dict)
    #: committed attempt -> copies its pusher wanted, this one included
    replicas: dict[int, int] = field(default_factory=dict)
    #: attempt pushed here by a client -> the daemons holding its replicas (those that acked the commit)
    copies: dict[int, tuple[str, ...]] = field(default_factory=dict)
    #: committed bytes of replica attempts, and attempts pushed here with fewer copies than wanted
    replica_bytes: int = 0
    under_replicated: int = 0
    #: the shuffle's directory once it has a journal on disk
    directory: str | None = None
    removed: bool = False
    last_commit: float = field(default_factory=time.monotonic)


class Store:
    def __init__(self, segment_size: int = 32 << 10, memory_quota: int = 0, disk_quota: int = 0) -> None:
        self.apps: dict[str, dict[int, ShuffleData]] = {}
        self.usage: dict[str, AppUsage] = {}
        self.segment_size = segment_size
        #: per application, in segments and bytes; 0 = no cap
        self.memory_quota = memory_quota // segment_size
        self.disk_quota = disk_quota
        #: spill is possible (a data dir is set): the memory quota spills instead of refusing
        self.can_spill = False
        #: most reduce partitions a shuffle may declare here (a daemon setting, at most MAX_PARTITIONS)
        self.max_partitions = MAX_PARTITIONS
        #: pool segments all stored chunks hold (what spilling can free)
        self.memory_segments = 0
        self.commits = 0
        #: bytes of every attempt ever committed here (a counter: what Spark's map tasks wrote)
        self.committed_bytes = 0
        self.aborts = 0
        #: spilled bytes of aborted attempts, for the spiller to give back to the file system
        self.garbage: list[Garbage] = []
        #: application -> digest of the token it is bound to (b"": bound to requests without one)
        self.app_keys: dict[str, bytes] = {}

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
        out = MapOutput(data, map_index, attempt, replica_of=replica_of, replicas=replicas)
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
        if self.disk_quota and usage.disk_bytes >= self.disk_quota:
            raise QuotaExceeded(
                f"application {app} holds {usage.disk_bytes} bytes on this daemon's disk, "
                f"its quota is {self.disk_quota} (--app-disk-quota)"
            )

    def add(self, out: MapOutput, partition: int, buffer: Buffer, crc: int) -> None:
        """Take ownership of a pushed buffer (its one reference moves to the store) and its checked CRC32C."""
        if out.state is not MapState.OPEN:
            buffer.release()
            raise MapOutputStateError(f"push to a map output that is {out.state.value}")
        data = out.shuffle
        if not 0 <= partition < data.partitions:
            buffer.release()
            raise InvalidRequest(f"partition {partition} outside 0..{data.partitions - 1}")
        usage = data.usage
        try:
            self._check_disk_quota(data.app, usage)
            if self.memory_quota and not self.can_spill and usage.segments >= self.memory_quota:
                raise QuotaExceeded(
                    f"application {data.app} holds {usage.segments} segments of this daemon's memory, its quota "
                    f"is {self.memory_quota} (--app-memory-quota; without --data-dir nothing can be spilled)"
                )
        except QuotaExceeded:
            buffer.release()
            raise
        sub = data.subpartitions.get(partition)
        if sub is None:
            sub = data.subpartitions[partition] = Subpartition(partition)
        chunk = StoredChunk(out.attempt, buffer.length, buffer, crc=crc)
        out.pending.append((sub, chunk))
        sub.memory.append(chunk)
        sub.memory_segments += 1
        out.lengths[partition] = out.lengths.get(partition, 0) + buffer.length
        data.segments += 1
        self.memory_segments += 1
        usage.segments += 1

    def over_memory_quota(self, app: str) -> bool:
        usage = self.usage.get(app)
        return bool(self.memory_quota) and usage is not None and usage.segments > self.memory_quota

    def commit(self, out: MapOutput, copies: tuple[str, ...] = ()) -> list[int]:
        """Make the attempt readable; `copies` are the daemons that committed its replicas first."""
        if out.state is not MapState.OPEN:
            raise MapOutputStateError(f"commit of a map output that is {out.state.value}")
        data = out.shuffle
        out.state = MapState.COMMITTED
        del data.open[out.attempt]
        data.committed[out.attempt] = out.map_index
        data.lengths[out.attempt] = {p: n for p, n in out.lengths.items() if n}
        for sub, chunk in out.pending:
            chunk.committed = True
            if chunk.buffer is not None:
                sub.chunks.append(chunk)
            else:  # spilled before the commit
                sub.spilled.append(chunk.attempt, chunk.offset, chunk.length, chunk.crc)
            sub.bytes += chunk.length
            data.bytes += chunk.length
        out.pending = []
        self.commits += 1
        self.committed_bytes += sum(out.lengths.values())
        self._mark(data, out.attempt, out.replica_of, out.replicas, copies)
        data.last_commit = data.usage.last_active = time.monotonic()
        return [out.lengths.get(p, 0) for p in range(data.partitions)]

    @staticmethod
    def _mark(data: ShuffleData, attempt: int, replica_of: str | None, replicas: int, copies: tuple[str, ...]) -> None:
        """Record what a committed attempt is a copy of, or where its copies are (commit and restart)."""
        data.replicas[attempt] = replicas
        if replica_of is not None:
            data.replica_of[attempt] = replica_of
            data.replica_bytes += sum(data.lengths[attempt].values())
            return
        if copies:
            data.copies[attempt] = copies
        if len(copies) < replicas - 1:
            data.under_replicated += 1

    def holds(self, app: str, shuffle: int, attempts: list[int]) -> tuple[list[int], list[int]]:
        """Which of these attempts are committed here, and the bytes each holds (for a drain deciding what
        still needs a copy elsewhere)."""
        data = self.apps.get(app, {}).get(shuffle)
        if data is None:
            return [], []
        held = [a for a in attempts if a in data.committed]
        return held, [sum(data.lengths[a].values()) for a in held]

    def abort(self, out: MapOutput) -> None:
        if out.state is not MapState.OPEN:
            return
        out.state = MapState.ABORTED
        data = out.shuffle
        data.open.pop(out.attempt, None)
        touched: dict[int, Subpartition] = {}
        for sub, chunk in out.pending:
            if chunk.buffer is None and chunk.offset >= 0 and sub.file is not None:
                self.garbage.append(Garbage(data, sub.file.path, chunk.offset, chunk.length))
            self._drop(data, sub, chunk)
            touched[sub.partition] = sub
        for sub in touched.values():
            sub.memory = [c for c in sub.memory if not c.dead]
        out.pending = []
        self.aborts += 1

    def _drop(self, data: ShuffleData, sub: Subpartition, chunk: StoredChunk) -> None:
        """The chunk is gone for good: give back its memory (spilled bytes stay until the file goes)."""
        chunk.dead = True
        if chunk.buffer is not None:
            self._release_memory(data, sub, chunk)

    def _release_memory(self, data: ShuffleData, sub: Subpartition, chunk: StoredChunk) -> None:
        buf, chunk.buffer = chunk.buffer, None
        assert buf is not None
        buf.release()
        sub.memory_segments -= 1
        data.segments -= 1
        self.memory_segments -= 1
        data.usage.segments -= 1

    # -- spill side (the Spiller does the I/O)

    def take_for_spill(self, sub: Subpartition, limit: int | None = None) -> list[StoredChunk]:
        """The partition's oldest in-memory chunks (at most `limit`), in push order; the rest stay, and new
        pushes go after them."""
        memory, n = sub.memory, 0
        taken: list[StoredChunk] = []
        while n < len(memory) and (limit is None or len(taken) < limit):
            chunk = memory[n]
            n += 1
            if chunk.buffer is not None and not chunk.dead:
                taken.append(chunk)
        sub.memory = memory[n:]
        return taken

    def spilled(self, data: ShuffleData, sub: Subpartition, chunks: list[StoredChunk], offset: int) -> int:
        """The chunks are in the file from `offset` on: free their memory. Returns the bytes written."""
        written = 0
        moved = False
        for chunk in chunks:
            crc = chunk.crc
            chunk.offset = offset + written
            written += chunk.length
            if chunk.dead and not data.removed and sub.file is not None:  # aborted while being written
                self.garbage.append(Garbage(data, sub.file.path, chunk.offset, chunk.length))
            if chunk.buffer is not None and not chunk.dead:
                self._release_memory(data, sub, chunk)
                if chunk.committed:
                    sub.spilled.append(chunk.attempt, chunk.offset, chunk.length, crc)
                    moved = True
        if moved:
            sub.chunks = [c for c in sub.chunks if c.buffer is not None]
        if not data.removed:  # a dropped shuffle settled its disk accounting when it was dropped
            data.disk_bytes += written
            data.usage.disk_bytes += written
        return written

    def unspilled(self, sub: Subpartition, chunks: list[StoredChunk]) -> None:
        """A spill failed: the chunks stay in memory, ahead of anything pushed meanwhile."""
        sub.memory[:0] = [c for c in chunks if c.buffer is not None and not c.dead]

    def largest_in_memory(
        self, app: str | None = None, busy: Container[Subpartition] = ()
    ) -> tuple[ShuffleData, Subpartition] | None:
        """The partition holding the most memory (of one application, or of all), leaving out `busy` ones;
        None if none holds any."""
        best: tuple[ShuffleData, Subpartition] | None = None
        most = 0
        for name, shuffles in self.apps.items():
            if app is not None and name != app:
                continue
            for data in shuffles.values():
                for sub in data.subpartitions.values():
                    if sub.memory_segments > most and sub.memory and sub not in busy:
                        best, most = (data, sub), sub.memory_segments
        return best

    # -- read side

    def snapshot(
        self,
        app: str,
        shuffle: int,
        start: int,
        end: int,
        attempts: list[int],
        resume: Resume | None = None,
        *,
        digest: bytes,
    ) -> tuple[list[Chunk | DiskChunk], int]:
        """Chunks of partitions [start, end) from exactly these committed attempts, and how many are on disk.

        The one gate every path that serves stored bytes passes, at the moment it serves (a client's read,
        a peer's relayed or resumed read, a failover to this daemon's own copy, a drain's copy): `digest`,
        the requester's token digest, must be the one the application is bound to now (`authorize`). A
        check made once, when a request arrives, is not enough: an application with no data here yet has
        no binding, and its first push binds it while a read naming it waits to fail over here.

        In-memory chunks are retained once each (the reader's reference). With `resume` (PROTOCOL.md §10.6)
        partition `start` goes on where another copy's read stopped: every copy holds a pair as the same
        chunks, so skipping the first `chunks` of the pair in progress (and the pairs `done`) leaves exactly
        what that read had not relayed. Everything is checked before any chunk is retained.
        """
        self.authorize(app, digest)
        data = self.apps.get(app, {}).get(shuffle)
        if data is None:
            if not attempts:
                return [], 0
            raise PartitionNotFound(f"shuffle {app}/{shuffle} is not held by this daemon")
        if not 0 <= start <= end <= data.partitions:
            raise InvalidRequest(f"partition range [{start}, {end}) outside 0..{data.partitions}")
        missing = [a for a in attempts if a not in data.committed]
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
            raise PartitionNotFound(f"map attempts not committed here for {app}/{shuffle}: {shown}")
        data.usage.last_active = time.monotonic()
        wanted = set(attempts)
        first = self._resumed(data, start, wanted, resume) if resume is not None else None
        # Partitions that hold data, without walking a huge range that holds little.
        subs = data.subpartitions
        wanted_parts = range(start, end) if end - start <= len(subs) else sorted(p for p in subs if start <= p < end)
        out: list[Chunk | DiskChunk] = []
        on_disk = 0
        for p in wanted_parts:
            if first is not None and p == start:
                runs = [first]
            elif (sub := subs.get(p)) is not None:
                runs = list(self._runs(sub, p, wanted).values())
            else:
                continue
            for run in runs:
                for item in run:
                    if isinstance(item, DiskChunk):
                        out.append(item)
                        on_disk += 1
                    else:
                        assert item.buffer is not None
                        item.buffer.retain()
                        out.append(Chunk(item.buffer, p, item.attempt, item.crc))
        return out, on_disk

    @staticmethod
    def _runs(sub: Subpartition, p: int, wanted: set[int]) -> dict[int, list[StoredChunk | DiskChunk]]:
        """One run per attempt (PROTOCOL.md §10.1: a reader reads a pair as one stream): its spilled prefix
        in file order, then the rest from memory. A spill file holds several attempts interleaved (two map
        tasks pushing at once), so file order alone would interleave pairs."""
        runs: dict[int, list[StoredChunk | DiskChunk]] = {}
        if sub.spilled:
            assert sub.file is not None
            for disk in sub.spilled.select(sub.file.path, p, wanted):
                runs.setdefault(disk.attempt, []).append(disk)
        for chunk in sub.chunks:
            if chunk.attempt in wanted:
                runs.setdefault(chunk.attempt, []).append(chunk)
        return runs

    def _resumed(
        self, data: ShuffleData, start: int, wanted: set[int], resume: Resume
    ) -> list[StoredChunk | DiskChunk]:
        """What partition `start` still owes a resumed read: the rest of the pair in progress, then the
        pairs not yet begun, in the usual order."""
        if resume.partition != start:
            raise InvalidRequest(f"resume names partition {resume.partition}, the request starts at {start}")
        named = set(resume.done) | ({resume.attempt} if resume.attempt is not None else set())
        if not named <= wanted:
            raise InvalidRequest("resume names map attempts the request does not")
        sub = data.subpartitions.get(start)
        runs = self._runs(sub, start, wanted) if sub is not None else {}
        rest: list[StoredChunk | DiskChunk] = []
        if resume.attempt is not None:
            run = runs.pop(resume.attempt, [])
            if len(run) < resume.chunks or sum(c.length for c in run[: resume.chunks]) != resume.bytes:
                raise InvalidRequest("resume point does not match this copy")
            rest += run[resume.chunks :]
        for attempt, run in runs.items():
            if attempt not in named:
                rest += run
        return rest

    # -- restart

    def restore(self, loaded: LoadedShuffle, files: dict[int, SpillFile]) -> None:
        """Committed data found on disk at start becomes servable again."""
        data = self._shuffle(loaded.app, loaded.shuffle, loaded.partitions)
        data.directory = loaded.directory
        if loaded.app_key is not None:
            self.bind(loaded.app, loaded.app_key)
        for attempt, (map_index, lengths) in loaded.committed.items():
            data.committed[attempt] = map_index
            data.lengths[attempt] = lengths
            self._mark(
                data,
                attempt,
                loaded.replica_of.get(attempt),
                loaded.replicas.get(attempt, 1),
                loaded.copies.get(attempt, ()),
            )
        for p, items in loaded.chunks.items():
            sub = data.subpartitions[p] = Subpartition(p, file=files[p])
            for attempt, offset, length, crc in items:
                sub.spilled.append(attempt, offset, length, crc)
                sub.bytes += length
            data.bytes += sub.bytes
        disk_bytes = sum(f.size for f in files.values())
        data.files += len(files)
        data.disk_bytes += disk_bytes
        data.usage.disk_bytes += disk_bytes

    # -- cleanup

    def _free(self, data: ShuffleData) -> int:
        freed = data.segments
        for out in list(data.open.values()):
            self.abort(out)
        for sub in data.subpartitions.values():
            for chunk in sub.chunks:
                self._drop(data, sub, chunk)
            sub.memory = []
        data.subpartitions.clear()
        data.committed.clear()
        data.removed = True
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
        return StoreStats(
            applications=len(self.apps),
            shuffles=len(shuffles),
            stored_segments=sum(d.segments for d in shuffles),
            stored_bytes=sum(d.bytes for d in shuffles),
            open_map_outputs=sum(len(d.open) for d in shuffles),
            commits=self.commits,
            committed_bytes=self.committed_bytes,
            aborts=self.aborts,
            replica_attempts=sum(len(d.replica_of) for d in shuffles),
            replica_bytes=sum(d.replica_bytes for d in shuffles),
            under_replicated=sum(d.under_replicated for d in shuffles),
        )
