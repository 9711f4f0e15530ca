"""Where a map output's pieces are: memory, the shuffle's data file, or one of its objects.

The pieces of an attempt keep their push order wherever they go (shuffles.py): a spill writes the oldest
in-memory pieces and places them, an upload gives pieces an object as their place, and the memory of a
piece with a place is freed when memory is needed. Bytes of the data file that no read will want again
(pieces moved to an object, or of an aborted attempt) become garbage the spiller gives back to the file
system. The Spiller and the ObjectTier do the I/O; this does the bookkeeping, and counts the memory freed
through the store's `hold`.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Container

from .disk import StoredObject
from .shuffles import FILE, Garbage, MapOutput, ShuffleData


class Placement:
    """The places of the store's pieces (see the module)."""

    def __init__(self, apps: dict[str, dict[int, ShuffleData]], hold: Callable[[MapOutput, int, int], None]) -> None:
        #: the store's applications (their shuffles), and how it counts memory held (or, negative, freed)
        self.apps = apps
        self.hold = hold
        #: spilled bytes no read will want, for the spiller to give back to the file system
        self.garbage: list[Garbage] = []

    def discard(self, data: ShuffleData, ranges: list[tuple[int, int]]) -> None:
        """Ranges of the shuffle's data file no read will want again, for the spiller to punch."""
        assert data.file is not None
        self.garbage.extend(Garbage(data, data.file.path, offset, length) for offset, length in ranges)

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
                self.discard(data, [(offset, at - offset)])
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
        self.hold(out, -n, -length)
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
            self.discard(data, moved)

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

    def coldest_in_memory(
        self, app: str | None = None, busy: Container[MapOutput] = (), batch: int = 1
    ) -> tuple[ShuffleData, list[MapOutput]] | None:
        """The shuffle to write next (of one application, or of all) and its attempts holding memory that is
        not being written, the largest first then in push order; None if none. Shuffles being pushed go
        last, then those holding less than a write's `batch` (one write each would be many small ones),
        and otherwise the one used longest ago first; none being pushed while a colder one's memory is
        still being written. Not the largest: in a long session the shuffle being pushed grows largest
        while the finished queries' shuffles sit unread, and writing it out made its own reads, which come
        next, load it back from disk."""
        candidates = [
            d
            for name, shuffles in self.apps.items()
            if app is None or name == app
            for d in shuffles.values()
            if d.segments
        ]
        writing = False  # a colder shuffle's memory is being written already
        for data in sorted(candidates, key=lambda d: (bool(d.open), d.segments < batch, d.used)):
            if writing and data.open:
                return None
            held = [o for o in (*data.committed.values(), *data.open.values()) if o.movable]
            outs = [o for o in held if o not in busy]
            if outs:
                largest = max(outs, key=lambda o: o.movable)
                outs.remove(largest)
                return data, [largest, *outs]
            writing = writing or bool(held)
        return None

    def coldest_on_disk(
        self, first: Container[str], claimed: Container[MapOutput], most: int, others: bool = True
    ) -> tuple[ShuffleData, list[tuple[MapOutput, list[int]]]] | None:
        """The shuffle whose spilled pieces move to an object next and which pieces (the oldest in its file,
        of committed attempts not `claimed` by a write under way, up to `most` bytes and one at least); None
        if none is left. Shuffles of the applications named `first` (over their own quota) go before the
        others, which are candidates only if `others`; otherwise the one used longest ago first, as in
        `coldest_in_memory`: a moved piece is read from the object store, slower than from the file, so the
        shuffle read next should keep its."""
        candidates = [
            d
            for app, shuffles in self.apps.items()
            if others or app in first
            for d in shuffles.values()
            if d.file is not None and not d.removed
        ]
        for data in sorted(candidates, key=lambda d: (d.app not in first, d.used)):
            found = sorted(
                (
                    (out.offsets[i], out, i)
                    for out in data.committed.values()
                    if out not in claimed
                    for i in range(out.placed)
                    if out.places[i] == FILE
                ),
                key=lambda f: f[0],
            )
            chosen: dict[MapOutput, list[int]] = {}
            size = 0
            for _, out, i in found:
                if size + out.sizes[i] > most and chosen:
                    break
                chosen.setdefault(out, []).append(i)
                size += out.sizes[i]
            if chosen:
                return data, [(out, sorted(indices)) for out, indices in chosen.items()]
        return None
