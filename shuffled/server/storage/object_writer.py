"""One object of the tier written (tier.py): pieces of one shuffle back to back, from memory as they are
and from the data file read back and checked, then the footer that indexes them; and deleted again.

The writer is what the tier's three writers share (spills, moves, durable uploads): this daemon's name
and the journal objects are recorded in, and which attempts a write under way holds, so no two writes
take the same pieces and the spiller leaves them alone.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Container

from ...buffers import Buffer
from ...logs import event
from ...ops.stats import TierStats
from ...protocol.errors import StorageError
from .disk import PIECE_ROW, Disk, StoredObject
from .loader import read_back
from .object_format import FOOTER_GUESS, Entry, Footer, object_key
from .objects import ObjectStore
from .shuffles import FILE, MapOutput, ShuffleData, commit_fields
from .store import Store

log = logging.getLogger(__name__)

#: pieces of one attempt an object takes: their indices, ascending
Pieces = tuple[MapOutput, list[int]]


class ObjectWriter:
    """Writes the tier's objects (see the module)."""

    def __init__(
        self,
        store: Store,
        objects: ObjectStore,
        disk: Disk | None,
        stats: TierStats,
        journal: Callable[[ShuffleData, dict[str, object]], None] | None = None,
        busy: Container[MapOutput] = (),
    ) -> None:
        self.store = store
        self.objects = objects
        self.disk = disk
        self.stats = stats
        self.part = objects.config.part_size
        #: the most bytes of pieces an object takes: under two parts, with room for the footer
        self.most = 2 * self.part - FOOTER_GUESS
        #: this daemon's name (set once it listens): objects are written under it
        self.node = ""
        #: appends a record to a shuffle's journal (the spiller's, with a data dir)
        self.journal = journal if journal is not None else _no_journal
        #: attempts the spiller is writing (their pieces are not taken)
        self.busy = busy
        #: attempts a tier write under way holds: their pieces (an upload, a move) or their commit record
        self.claimed: set[MapOutput] = set()
        self._sequence = itertools.count(time.time_ns())

    async def write(self, data: ShuffleData, pieces: list[Pieces], commits: list[MapOutput], why: str) -> int | None:
        """One object of these pieces, back to back in this order, and the commit records of `commits`; its
        place in the shuffle once complete, None if the shuffle was removed meanwhile (the object is then
        deleted). Raises StorageError (nothing changed) or CorruptData (a piece read back from the data
        file failed its check)."""
        held: list[Buffer] = []
        try:
            chunks = await self._chunks(data, pieces, held)
            footer = Footer(data.app, data.shuffle, data.partitions, self.node, self.store.app_keys.get(data.app))
            offset = 0
            for out, indices in pieces:
                for run in _runs(indices):
                    rows = b"".join(PIECE_ROW.pack(out.sizes[i], out.crcs[i], out.firsts[i], out.lasts[i]) for i in run)
                    footer.entries.append(Entry(out.attempt, out.serial, run[0], offset, rows))
                    offset += sum(out.sizes[i] for i in run)
            footer.commits = [commit_fields(data, out.attempt) for out in commits]
            tail = footer.encode()
            key = object_key(data.app, data.shuffle, self.node, next(self._sequence))
            size = await self.objects.write(key, [*chunks, tail], single=True)
        finally:
            for buf in held:
                buf.release()
        if data.removed:
            await self.delete([key])
            return None
        stats = self.stats
        setattr(stats, f"{why}_objects", getattr(stats, f"{why}_objects") + 1)
        setattr(stats, f"{why}_bytes", getattr(stats, f"{why}_bytes") + offset)
        place = self.store.placement.add_object(data, StoredObject(key, size))
        record: dict[str, object] = {
            "k": "object",
            "key": key,
            "size": size,
            "a": [[e.attempt, e.serial, e.start, e.offset, e.rows] for e in footer.entries],
            "d": [[out.attempt, out.serial] for out in commits],
        }
        self.journal(data, record)
        return place

    async def _chunks(self, data: ShuffleData, pieces: list[Pieces], held: list[Buffer]) -> list[memoryview]:
        """The pieces' bytes in order: memory ones as they are (a reference each in `held`), those in the data
        file read back with one read per run of them that lies back to back, and checked."""
        chunks: list[memoryview] = []
        #: pieces in the file: (offset, [(chunk slot, size, CRC32C)]) per run, and where the last run ends
        runs: list[tuple[int, list[tuple[int, int, int]]]] = []
        end = -1
        for out, indices in pieces:
            for i in indices:
                buf = out.buffer(i)
                if buf is not None:
                    buf.retain()
                    held.append(buf)
                    chunks.append(buf.data())
                    continue
                assert i < out.placed and out.places[i] == FILE, "a tier write takes no piece an object holds"
                at, size = out.offsets[i], out.sizes[i]
                if at != end:
                    runs.append((at, []))
                runs[-1][1].append((len(chunks), size, out.crcs[i]))
                end = at + size
                chunks.append(memoryview(b""))
        for at, slots in runs:
            await self._read_back(data, at, slots, chunks)
        return chunks

    async def _read_back(
        self, data: ShuffleData, offset: int, slots: list[tuple[int, int, int]], chunks: list[memoryview]
    ) -> None:
        """Read pieces lying back to back in the shuffle's file from `offset` into memory of their own (the
        loader's `read_back`), as `chunks[slot]`."""
        assert self.disk is not None
        room = memoryview(bytearray(sum(size for _, size, _ in slots)))
        at = 0
        for slot, size, _ in slots:
            chunks[slot] = room[at : at + size]
            at += size
        await read_back(self.disk, data, offset, [chunks[slot] for slot, _, _ in slots], [crc for *_, crc in slots])

    def placed(self, pieces: list[Pieces], place: int) -> None:
        """Written pieces are in object `place`, back to back in this order (attempts dropped meanwhile aside)."""
        offset = 0
        for out, indices in pieces:
            if not out.dead:
                self.store.placement.uploaded(out, indices, place, offset)
            offset += sum(out.sizes[i] for i in indices)

    async def delete(self, keys: list[str]) -> None:
        """Delete these objects; a delete that fails is logged (the sweep finds what it left)."""
        if not keys:
            return
        try:
            await self.objects.delete(keys)
            self.stats.deleted_objects += len(keys)
        except StorageError as exc:
            event(log, "deleting objects failed", logging.WARNING, objects=len(keys), reason=exc.message)


def _runs(indices: list[int]) -> list[list[int]]:
    """Ascending indices cut into runs of consecutive ones."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][-1] + 1 == i:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _no_journal(data: ShuffleData, record: dict[str, object]) -> None:
    """Without a data dir nothing is journaled: footers describe the objects."""
