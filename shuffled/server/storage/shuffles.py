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
spill writes and served frames take their own references. This module does no I/O; the
`Store` (store.py) keeps these, and `Placement` (placement.py) moves pieces between their places.
"""

from __future__ import annotations

import itertools
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

from ...buffers import Buffer
from ...protocol.errors import ShuffledError
from ...protocol.packed import LengthTally, PushedGroup
from .at_rest import set_seal
from .disk import LoadedAttempt, SpillFile, StoredObject

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
        "seals",
        "serial",
        "shuffle",
        "size",
        "sizes",
        "spilled",
        "starts",
        "state",
        "taken",
        "wants_durable",
        "wants_sync",
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
        #: with encryption at rest, each piece's seal (at_rest.py, SEAL bytes) once its place holds it sealed
        #: (b"": not sealed there)
        self.seals: list[bytes] = []
        #: pieces [0, spilled) are no longer in memory (spilled <= placed)
        self.spilled = 0
        #: pieces [placed, taken) are being written by a spill; an upload takes them all
        self.taken = 0
        #: its commit is to be made durable in the object store, and has been (an object holds its commit)
        self.wants_durable = False
        #: its writer asked for its CommitAck to follow an fsync (`--fsync commit` for this one output)
        self.wants_sync = False
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

    @classmethod
    def restored(
        cls, data: ShuffleData, attempt: int, found: LoadedAttempt, places: list[int], of: str | None, replicas: int
    ) -> MapOutput:
        """A committed attempt as a journal or a node's objects recorded it (`places`: a loaded place -> the
        shuffle's), every piece placed."""
        out = cls(data, found.map_index, attempt, found.serial, of, replicas)
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
        out.seals = found.seals
        out.placed = out.spilled = out.taken = out.pieces
        out.starts = array("I", [0])
        out.starts.extend(i for i in range(1, out.pieces) if out.firsts[i] < out.lasts[i - 1])
        out.bytes, out.size = found.stored, sum(found.sizes)
        return out

    def seal(self, index: int, seal: bytes) -> None:
        """Piece `index` is now sealed with `seal` where it is placed (at_rest.py)."""
        set_seal(self.seals, index, seal)

    def append(self, buffer: Buffer, crc: int, group: PushedGroup) -> None:
        """A pushed piece, checked (its CRC32C and directory) and taken by the store, becomes the last one."""
        assert self.runs is not None
        self.runs.add(group.entries)
        first, length = group.first, buffer.length
        if not self.sizes or first < self.lasts[-1]:
            self.starts.append(len(self.sizes))
        self.firsts.append(first)
        self.lasts.append(group.last)
        self.sizes.append(length)
        self.crcs.append(crc)
        self.memory.append(buffer)
        self.bytes += group.data_bytes
        self.size += length

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
    #: the at-rest key its file's pieces are sealed with (named in its journal header); None: not sealed
    key_id: str | None = None
    removed: bool = False
    last_commit: float = field(default_factory=time.monotonic)
    #: its last use (a push opened, a commit, a batch of a read), as a count of uses (`touch`): the spiller
    #: writes the shuffles used longest ago first, which a long session's finished queries' are
    used: int = 0

    def mark(self, out: MapOutput, copies: tuple[str, ...]) -> None:
        """Record what a committed attempt is a copy of, or where its copies are (commit and restart)."""
        self.replicas[out.attempt] = out.replicas
        if out.replica_of is not None:
            self.replica_of[out.attempt] = out.replica_of
            self.replica_bytes += out.bytes
            return
        if copies:
            self.copies[out.attempt] = copies
        if len(copies) < out.replicas - 1:
            self.under_replicated += 1


#: uses of shuffles so far, in this process (only their order matters)
_USES = itertools.count(1)


def touch(data: ShuffleData | None) -> None:
    """The shuffle is used now (a push opened, a commit, a read's batch): the last the spiller writes."""
    if data is not None:
        data.used = next(_USES)


def piece_ids(pieces: Iterable[tuple[MapOutput, int]]) -> list[tuple[int, int, int]]:
    """What a seal binds each of these pieces to (at_rest.py): its attempt, the attempt's serial, its index."""
    return [(out.attempt, out.serial, i) for out, i in pieces]


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
