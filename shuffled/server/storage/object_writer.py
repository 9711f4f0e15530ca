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
from typing import NamedTuple

from ...buffers import Buffer
from ...logs import event
from ...ops.stats import TierStats
from ...protocol.errors import StorageError
from .at_rest import off_loop, split_seals
from .disk import PIECE_ROW, Disk, StoredObject
from .loader import piece_opener, read_back
from .object_format import FOOTER_GUESS, Entry, Footer, object_key
from .objects import ObjectStore
from .shuffles import FILE, MapOutput, ShuffleData, commit_fields, piece_ids
from .store import Store

log = logging.getLogger(__name__)

#: pieces of one attempt an object takes: their indices, ascending
Pieces = tuple[MapOutput, list[int]]


class Written(NamedTuple):
    """An object written: its place in the shuffle, and with encryption at rest its pieces' seals in order."""

    place: int
    seals: list[bytes] | None


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

    async def write(
        self, data: ShuffleData, pieces: list[Pieces], commits: list[MapOutput], why: str
    ) -> Written | None:
        """One object of these pieces, back to back in this order (sealed, with encryption at rest), and the
        commit records of `commits`; None if the shuffle was removed meanwhile (the object is then deleted).
        Raises StorageError (nothing changed) or CorruptData (a piece read back from the data file failed its
        check)."""
        held: list[Buffer] = []
        try:
            chunks = await self._chunks(data, pieces, held)
            footer = Footer(data.app, data.shuffle, data.partitions, self.node, self.store.app_keys.get(data.app))
            seals = None
            keys = self.store.at_rest
            if keys is not None:
                footer.kid = keys.current
                ids = piece_ids((out, i) for out, indices in pieces for i in indices)
                seal = keys.sealer(keys.current, data.app, data.shuffle, ids, fresh=True)
                chunks, sealed = await off_loop(lambda: seal(chunks))
                seals = split_seals(sealed)
            offset, k = 0, 0
            for out, indices in pieces:
                for run in _runs(indices):
                    rows = b"".join(PIECE_ROW.pack(out.sizes[i], out.crcs[i], out.firsts[i], out.lasts[i]) for i in run)
                    run_seals = b"".join(seals[k : k + len(run)]) if seals is not None else None
                    footer.entries.append(Entry(out.attempt, out.serial, run[0], offset, rows, run_seals))
                    offset += sum(out.sizes[i] for i in run)
                    k += len(run)
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
        place = self.store.placement.add_object(data, StoredObject(key, size, kid=footer.kid))
        record: dict[str, object] = {
            "k": "object",
            "key": key,
            "size": size,
            "a": [e.encoded() for e in footer.entries],
            "d": [[out.attempt, out.serial] for out in commits],
        }
        if footer.kid is not None:
            record["kid"] = footer.kid
        self.journal(data, record)
        return Written(place, seals)

    async def _chunks(self, data: ShuffleData, pieces: list[Pieces], held: list[Buffer]) -> list[memoryview]:
        """The pieces' bytes in order: memory ones as they are (a reference each in `held`), those in the data
        file read back (and opened, when sealed there) with one read per run of them that lies back to back,
        and checked."""
        chunks: list[memoryview] = []
        #: pieces in the file: (offset, [(chunk slot, attempt, index)]) per run, and where the last run ends
        runs: list[tuple[int, list[tuple[int, MapOutput, int]]]] = []
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
                at = out.offsets[i]
                if at != end:
                    runs.append((at, []))
                runs[-1][1].append((len(chunks), out, i))
                end = at + out.sizes[i]
                chunks.append(memoryview(b""))
        for at, slots in runs:
            await self._read_back(data, at, slots, chunks)
        return chunks

    async def _read_back(
        self, data: ShuffleData, offset: int, slots: list[tuple[int, MapOutput, int]], chunks: list[memoryview]
    ) -> None:
        """Read pieces lying back to back in the shuffle's file from `offset` into memory of their own (the
        loader's `read_back`), as `chunks[slot]`."""
        assert self.disk is not None
        room = memoryview(bytearray(sum(out.sizes[i] for _, out, i in slots)))
        at = 0
        for slot, out, i in slots:
            chunks[slot] = room[at : at + out.sizes[i]]
            at += out.sizes[i]
        unseal = piece_opener(self.store.at_rest, data.key_id, data, [(out, i) for _, out, i in slots])
        views, crcs = [chunks[slot] for slot, _, _ in slots], [out.crcs[i] for _, out, i in slots]
        await read_back(self.disk, data, offset, views, crcs, unseal)

    def placed(self, pieces: list[Pieces], written: Written) -> None:
        """Written pieces are in object `place`, back to back in this order (attempts dropped meanwhile aside),
        sealed there with their `seals`."""
        offset = 0
        seals = iter(written.seals) if written.seals is not None else None
        for out, indices in pieces:
            if not out.dead:
                self.store.placement.uploaded(out, indices, written.place, offset)
            if seals is not None:
                for i in indices:
                    out.seal(i, next(seals))
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
