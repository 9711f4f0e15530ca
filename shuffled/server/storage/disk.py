"""Spill files on local disk: one append-only data file and one checksummed journal per shuffle.

Layout under `--data-dir`:

    LOCK                               flock'ed by the one daemon using the dir (holds its pid)
    app-<id>/<shuffle>/journal         records: u32 length, u32 CRC32C of the body, msgpack map
    app-<id>/<shuffle>/data            pieces (pushed packed groups) of every map attempt, in spill order

The journal says what the data file means: a header naming the shuffle (and the
digest of the token its application is bound to), one record per spill write listing
its pieces (per map attempt: 16 bytes a piece, its length, CRC32C, first and last
partition; they lie back to back from the record's offset) and one per committed map
attempt (its bytes, pieces and their total length). Pieces and commits name the
attempt and its *serial*, which tells an attempt id aborted and pushed again apart.
A restarted daemon serves an attempt only if its commit record is intact and its
intact piece records account for exactly its pieces, inside the file (replay.py);
reads check each piece's CRC32C. Data is written before the record describing it, so a crash
between the two leaves only bytes nobody points at; what the writes survive beyond the daemon's
crash is fsync.py's (`--fsync`).

The event loop never touches a file: every write, journal append and deletion
runs on one writer thread, in submission order (a shuffle's deletion can never
overtake its last spill, a record never lands before its header), and reads run
on a small pool of reader threads. Buffers are handed to the threads as
memoryviews of pool segments; the threads write from and read into them without
copying (`os.writev`, `os.preadv`).
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, TypeVar
from urllib.parse import quote

import msgpack

from ...logs import event
from ...ops.stats import DiskStats
from ...protocol.integrity import checksum
from .at_rest import Opener, Sealer, set_seal, split_seals
from .fsync import Record, Syncs, Unsynced

log = logging.getLogger(__name__)

T = TypeVar("T")

_RECORD = struct.Struct(">II")
#: a piece in a journal record: length, CRC32C, first and last partition
PIECE_ROW = struct.Struct(">IIII")
JOURNAL = "journal"
DATA = "data"
#: held (flock) by the daemon using the data dir
LOCK = "LOCK"
#: most iovecs handed to one writev/preadv call (Linux IOV_MAX is 1024)
_IOV_MAX = 512


def encode_record(record: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(record, use_bin_type=True)
    return _RECORD.pack(len(body), checksum(body)) + body


def decode_records(raw: bytes) -> tuple[list[dict[str, Any]], int]:
    """Intact records from the start of a journal, and the offset where they end (a torn tail is dropped)."""
    records: list[dict[str, Any]] = []
    pos = 0
    while pos + _RECORD.size <= len(raw):
        length, crc = _RECORD.unpack_from(raw, pos)
        body = raw[pos + _RECORD.size : pos + _RECORD.size + length]
        if len(body) < length or checksum(body) != crc:
            break
        try:
            record = msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception:
            break
        if not isinstance(record, dict):
            break
        records.append(record)
        pos += _RECORD.size + length
    return records, pos


def app_dir_name(app: str) -> str:
    """A file name for an application id that cannot escape the data dir ('..', '/') and that no other id
    maps to. Long ids are cut and get a hash after a '+', a character that quoting always escapes: a
    short id can never name a long one's directory (and delete its files with its own shuffle)."""
    name = quote(app, safe="")
    if len(name) > 200:
        name = name[:100] + "+" + hashlib.sha256(app.encode()).hexdigest()
    return "app-" + name


_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_libc: Any = None


def _punch_holes(path: str, ranges: list[tuple[int, int]]) -> None:
    """fallocate(2) with FALLOC_FL_PUNCH_HOLE, which the os module does not offer (posix_fallocate only
    allocates); ext4, xfs, btrfs and tmpfs support it. Raises OSError (EOPNOTSUPP elsewhere)."""
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        _libc = lib
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return  # the shuffle was removed meanwhile: its blocks are free already
    try:
        for offset, length in ranges:
            if _libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE, offset, length) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"cannot free aborted data in {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _consume(pending: list[memoryview], n: int) -> None:
    """Drop the first `n` bytes from a list of views (after a short writev/preadv)."""
    while n and pending:
        if n >= len(pending[0]):
            n -= len(pending.pop(0))
        else:
            pending[0] = pending[0][n:]
            n = 0


def _write_all(fd: int, views: Sequence[memoryview]) -> None:
    pending = [v for v in views if len(v)]
    while pending:
        _consume(pending, os.writev(fd, pending[:_IOV_MAX]))


def _read_exact(fd: int, views: Sequence[memoryview], offset: int) -> None:
    pending = [v for v in views if len(v)]
    while pending:
        n = os.preadv(fd, pending[:_IOV_MAX], offset)
        if n == 0:
            raise EOFError(f"spill file ends before offset {offset}")
        offset += n
        _consume(pending, n)


@dataclass(slots=True, eq=False)
class SpillFile:
    """One shuffle's data file; `size` counts every byte appended (also those of aborted attempts)."""

    path: str
    size: int = 0


@dataclass(slots=True, eq=False)
class StoredObject:
    """An object in the object store holding pieces of one shuffle (storage/object_format.py)."""

    key: str
    size: int
    #: written by this daemon (not adopted from another node's objects)
    own: bool = True
    #: the at-rest key its pieces are sealed with; None: not sealed
    kid: str | None = None


@dataclass(slots=True)
class Appended:
    """Where appended pieces start in their data file, and the CRC32C of each as written (None: sealed)."""

    offset: int
    crcs: list[int] | None
    #: with encryption at rest, the seals of the pieces, SEAL bytes each, back to back
    seals: bytes | None = None


@dataclass(slots=True)
class LoadedAttempt:
    """A committed attempt a journal (or a node's objects) proves: its pieces in push order, each in the data
    file (place 0) or in an object (place k: the k-th of the shuffle's objects)."""

    map_index: int
    serial: int
    #: bytes of its runs (what its CommitAck summed to)
    stored: int
    firsts: array[int] = field(default_factory=lambda: array("I"))
    lasts: array[int] = field(default_factory=lambda: array("I"))
    sizes: array[int] = field(default_factory=lambda: array("I"))
    crcs: array[int] = field(default_factory=lambda: array("I"))
    offsets: array[int] = field(default_factory=lambda: array("Q"))
    places: array[int] = field(default_factory=lambda: array("I"))
    #: with encryption at rest, each piece's seal
    seals: list[bytes] = field(default_factory=list)
    #: records disagreed about its pieces (a gap, or other pieces at an index): it proves nothing
    broken: bool = False

    def add(self, offset: int, rows: bytes, seals: bytes | None = None) -> int:
        """Pieces of a spill record, back to back in the data file from `offset` (sealed with `seals`);
        returns where they end."""
        self.put(len(self.sizes), 0, offset, rows, seals)
        return offset + sum(_words(rows)[0::4])

    def put(self, start: int, place: int, offset: int, rows: bytes, seals: bytes | None = None) -> None:
        """Pieces `start`.. of the attempt (PIECE_ROW each) lie back to back at `offset` of `place` (sealed
        there with `seals`): new ones are appended, known ones (moved from the file to an object) only
        change place and seal."""
        if seals is not None:
            for i, seal in enumerate(split_seals(seals), start=start):
                set_seal(self.seals, i, seal)
        words = _words(rows)
        sizes = words[0::4]
        offsets = array("Q", accumulate(sizes[:-1], initial=offset)) if sizes else array("Q")
        known = len(self.sizes)
        if start > known:
            self.broken = True
            return
        overlap = min(known - start, len(sizes))
        end = start + overlap
        if self.sizes[start:end] != sizes[:overlap] or self.crcs[start:end] != words[1::4][:overlap]:
            self.broken = True
            return
        self.places[start:end] = array("I", [place]) * overlap
        self.offsets[start:end] = offsets[:overlap]
        self.sizes.extend(sizes[overlap:])
        self.crcs.extend(words[1::4][overlap:])
        self.firsts.extend(words[2::4][overlap:])
        self.lasts.extend(words[3::4][overlap:])
        self.offsets.extend(offsets[overlap:])
        self.places.extend(array("I", [place]) * (len(sizes) - overlap))

    def sealed(self, kids: list[str | None]) -> bool:
        """Every piece in a sealed place (`kids[place]`: the key of the file, and of each object) has a seal."""
        seals = self.seals
        return all(kids[p] is None or (i < len(seals) and seals[i]) for i, p in enumerate(self.places))

    def outside(self, ends: list[int]) -> bool:
        """A piece ends beyond where its place ends (`ends[place]`: the file's size, each object's data)."""
        return any(o + s > ends[p] for p, o, s in zip(self.places, self.offsets, self.sizes, strict=True))

    def matches(self, commit: dict[str, Any]) -> bool:
        """Its pieces are exactly those its commit record counts (number and total length)."""
        ok = not self.broken and len(self.sizes) == int(commit["pieces"]) and sum(self.sizes) == int(commit["size"])
        if ok:
            self.map_index, self.stored = int(commit["map"]), int(commit["bytes"])
        return ok


def _words(rows: bytes) -> array[int]:
    """PIECE_ROW rows as u32 words (length, CRC32C, first, last per piece)."""
    words = array("I")
    words.frombytes(rows)
    if sys.byteorder == "little":
        words.byteswap()
    return words


@dataclass
class LoadedShuffle:
    """What a journal on disk proves: the attempts that can be served and their pieces."""

    app: str
    shuffle: int
    partitions: int
    directory: str
    #: attempt -> its pieces
    committed: dict[int, LoadedAttempt] = field(default_factory=dict)
    file_size: int = 0
    #: the commits' replica marking (§12.4): replica attempt -> primary, copies wanted, where the copies are
    replica_of: dict[int, str] = field(default_factory=dict)
    replicas: dict[int, int] = field(default_factory=dict)
    copies: dict[int, tuple[str, ...]] = field(default_factory=dict)
    #: the digest of the token the application was bound to (`Store.app_keys`); None if not journaled
    app_key: bytes | None = None
    #: the at-rest key its pieces are sealed with (its journal header's `kid`); None: not sealed
    key_id: str | None = None
    #: the objects its pieces lie in (place k is the k-th), and the attempts made durable in them
    objects: list[StoredObject] = field(default_factory=list)
    durable: set[int] = field(default_factory=set)

    def adopt(self, attempt: int, found: LoadedAttempt, commit: dict[str, Any], durable: bool) -> None:
        """An attempt proved by its commit record (a journal's, or an object footer's)."""
        self.committed[attempt] = found
        self.replicas[attempt] = int(commit.get("r", 1))
        if "of" in commit:
            self.replica_of[attempt] = str(commit["of"])
        if "copies" in commit:
            self.copies[attempt] = tuple(str(c) for c in commit["copies"])
        if durable:
            self.durable.add(attempt)


class Disk:
    """The data dir: where shuffles' files live, and the threads that touch them."""

    def __init__(
        self,
        root: str,
        read_threads: int = 2,
        fsync: str = "none",
        fsync_interval: float = 1.0,
    ) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        self._lock = self._take_lock()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="shuffled-write")
        self._readers = ThreadPoolExecutor(read_threads, thread_name_prefix="shuffled-read")
        self.stats = DiskStats()
        #: what the writer thread wrote since its last sync
        # (with `--fsync none` too: a writer may ask for its commit to be synced)
        self._unsynced = Unsynced()
        #: the event loop's side of syncing (fsync.py): a sync is queued behind everything written before it
        self.syncs = Syncs(lambda r: self._on(self._writer, self._sync, r), fsync, fsync_interval, self.stats)

    def _take_lock(self) -> int:
        """One daemon per data dir: a second one would delete the first one's files as leftovers."""
        fd = os.open(os.path.join(self.root, LOCK), os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OSError(errno.EBUSY, f"another daemon (pid {holder}) uses this data dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def shuffle_dir(self, app: str, shuffle: int) -> str:
        return os.path.join(self.root, app_dir_name(app), str(shuffle))

    @staticmethod
    def data_path(directory: str) -> str:
        return os.path.join(directory, DATA)

    @staticmethod
    def _on(executor: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Submit now (so the writer thread sees jobs in call order); await the result later."""
        return asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    # -- writes (one thread, FIFO)

    def append(
        self,
        file: SpillFile,
        views: Sequence[memoryview],
        journal: str,
        record: Callable[[Appended], bytes],
        seal: Sealer | None = None,
    ) -> asyncio.Future[Appended]:
        """Append pieces to a data file (sealed by `seal` first, on the writer thread), then the journal
        record that describes them.

        On any error the data file is cut back to where it was, so nothing half
        written is ever described (or served).
        """
        self.syncs.wrote(sum(len(v) for v in views))
        return self._on(self._writer, self._append, file.path, views, journal, record, seal)

    def _append(
        self,
        path: str,
        views: Sequence[memoryview],
        journal: str,
        record: Callable[[Appended], bytes],
        seal: Sealer | None,
    ) -> Appended:
        fd = self._open_for_write(path, os.O_WRONLY, journal=False)
        try:
            offset = os.lseek(fd, 0, os.SEEK_END)
            try:
                # A sealed piece's CRC32C is checked once it is opened on a read: here it would only log early
                crcs, seals = None, None
                if seal is None:
                    crcs = [checksum(v) for v in views]
                else:
                    views, seals = seal(views)
                _write_all(fd, views)
                done = Appended(offset, crcs, seals)
                self._journal_append(journal, record(done))
            except BaseException:
                os.ftruncate(fd, offset)
                raise
        finally:
            os.close(fd)
        return done

    def append_journal(self, journal: str, data: bytes) -> asyncio.Future[None]:
        self.syncs.wrote(len(data))
        return self._on(self._writer, self._journal_append, journal, data)

    def _journal_append(self, journal: str, data: bytes) -> None:
        fd = self._open_for_write(journal, os.O_WRONLY | os.O_APPEND, journal=True)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                _write_all(fd, [memoryview(data)])
            except BaseException:
                os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)

    def _open_for_write(self, path: str, flags: int, journal: bool) -> int:
        """Open (made with its directories if need be) on the writer thread, noting what a sync must cover."""
        unsynced = self._unsynced
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):  # a shuffle's first write: one stat for every other one
            unsynced.made_dirs(directory, self.root)
            os.makedirs(directory, exist_ok=True)
        try:
            fd = os.open(path, flags)
            created = False
        except FileNotFoundError:
            fd = os.open(path, flags | os.O_CREAT, 0o640)
            created = True
        unsynced.wrote(path, journal, created)
        return fd

    def _sync(self, records: list[Record]) -> int:
        return self._unsynced.sync(records, self._journal_append)

    def punch(self, path: str, ranges: list[tuple[int, int]]) -> asyncio.Future[None]:
        """Give the blocks of byte ranges of a data file back to the file system (after every write
        submitted before); the file keeps its size, so the offsets of everything else stay valid."""
        return self._on(self._writer, _punch_holes, path, ranges)

    def remove(self, directory: str) -> asyncio.Future[None]:
        """Delete a shuffle's directory (after every write submitted before), and its app dir once empty."""
        return self._on(self._writer, self._remove, directory)

    def _remove(self, directory: str) -> None:
        self._unsynced.removed(directory)
        self.remove_now(directory)

    @staticmethod
    def remove_now(directory: str) -> None:
        shutil.rmtree(directory, ignore_errors=True)
        try:
            os.rmdir(os.path.dirname(directory))
        except OSError:
            pass  # other shuffles of the application remain

    def space(self) -> tuple[int, int] | None:
        """(capacity, free bytes) of the data directory's file system; None if it cannot be told."""
        try:
            usage = shutil.disk_usage(self.root)
        except OSError:
            return None
        return usage.total, usage.free

    def sync(self) -> asyncio.Future[None]:
        """Done when every write submitted so far is."""
        return self._on(self._writer, lambda: None)

    # -- reads (a few threads; one read stream's loads are sequential)

    def read(
        self, fd: int | None, path: str, offset: int, views: Sequence[memoryview], unseal: Opener | None = None
    ) -> asyncio.Future[tuple[int, list[int]]]:
        """Fill `views` from `path` at `offset` (opening it unless `fd` is given), opened by `unseal` when
        sealed; resolves to the fd and CRCs. A piece that fails its seal raises CorruptData."""
        return self._on(self._readers, self._read, fd, path, offset, views, unseal)

    @staticmethod
    def _read(
        fd: int | None, path: str, offset: int, views: Sequence[memoryview], unseal: Opener | None
    ) -> tuple[int, list[int]]:
        if fd is None:
            fd = os.open(path, os.O_RDONLY)
        try:
            if unseal is None:
                _read_exact(fd, views, offset)
            else:  # the ciphertexts straight into the opener's memory, opened into `views`
                unseal(views, lambda room: _read_exact(fd, room, offset))
        except BaseException:  # a read that failed, or a piece that failed its seal: the fd goes too
            os.close(fd)
            raise
        return fd, [checksum(v) for v in views]

    def close(self) -> None:
        self.syncs.stop()
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        os.close(self._lock)  # releases the lock

    # -- start: what the data dir holds


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            event(log, "cannot remove", logging.WARNING, path=path, reason=exc)
