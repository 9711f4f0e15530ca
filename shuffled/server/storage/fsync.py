"""fsync: what the data dir's writes survive (docs/durability.md, "fsync").

Without fsync a write is in the page cache: it survives the daemon's crash, not the kernel's or the power's.
`--fsync commit` makes a CommitAck (and a finished flush) mean the data, its journal records and the
directories that name them are on the device; `background` syncs what was written within `--fsync-interval`;
`none` never syncs. Syncs are batched (group commit): every request waits for the next sync to start after
it, and one sync serves all the requests made while the one before ran, so many commits share one fsync of
each file they touched.

`Unsynced` lives on the disk's writer thread, which makes every write, so it knows what each sync must
cover; `Syncs` is the event loop's side, which batches the requests and reports what is not yet synced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...logs import event
from ...ops.stats import DiskStats

log = logging.getLogger(__name__)

#: (journal path, record bytes): appended by a sync once the data before it is on the device
Record = tuple[str, bytes]
#: a request waiting for the next sync: its records, and its future
Waiting = tuple[list[Record], "asyncio.Future[None]"]


@dataclass(slots=True)
class Unsynced:
    """The files and directories written since the last sync (the writer thread's own: no lock)."""

    #: data files and journals whose writes are not yet synced
    files: set[str] = field(default_factory=set)
    journals: set[str] = field(default_factory=set)
    #: directories that gained or lost an entry (a new file, a new directory) since the last sync
    dirs: set[str] = field(default_factory=set)

    def wrote(self, path: str, journal: bool, created: bool) -> None:
        (self.journals if journal else self.files).add(path)
        if created:
            self.dirs.add(os.path.dirname(path))

    def made_dirs(self, path: str, root: str) -> None:
        """`path`'s missing directories are about to be made under `root`: each one's parent must be synced."""
        while path != root and not os.path.isdir(path):
            self.dirs.add(os.path.dirname(path))
            path = os.path.dirname(path)

    def removed(self, directory: str) -> None:
        """A shuffle's directory is deleted: nothing in it needs a sync, its parent does."""
        inside = directory + os.sep
        for paths in (self.files, self.journals, self.dirs):
            paths.difference_update([p for p in paths if p == directory or p.startswith(inside)])
        self.dirs.add(os.path.dirname(directory))

    def sync(self, records: list[Record], append: Callable[[str, bytes], None]) -> int:
        """Sync the data files, then append `records` (so a journal never names data the device may not
        hold), then sync the journals and directories; the number of fsyncs. A file deleted meanwhile
        needs none."""
        done = _sync_all(self.files, os.fdatasync)
        self.files.clear()
        for journal, record in records:
            append(journal, record)
            self.journals.add(journal)
        done += _sync_all(self.journals, os.fsync)
        done += _sync_all(self.dirs, os.fsync)
        self.journals.clear()
        self.dirs.clear()
        return done


def _sync_all(paths: set[str], sync: Callable[[int], None]) -> int:
    done = 0
    for path in sorted(paths):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # deleted with its shuffle after the write
        try:
            sync(fd)
        finally:
            os.close(fd)
        done += 1
    return done


class Syncs:
    """The event loop's side of syncing (see the module): `submit` queues one sync of everything written
    before it on the writer thread, appending the records it is given after the data."""

    def __init__(
        self, submit: Callable[[list[Record]], asyncio.Future[int]], mode: str, interval: float, stats: DiskStats
    ) -> None:
        self._submit = submit
        self.mode = mode
        self.interval = interval
        #: the disk's counters: syncs, fsyncs, their failures and time, the bytes not yet synced
        self.stats = stats
        #: the requests waiting for the next sync: their records and futures
        self._waiting: list[Waiting] = []
        self._running: asyncio.Future[int] | None = None
        #: since when written bytes wait for a sync (monotonic; None: nothing unsynced)
        self.unsynced_since: float | None = None
        self._background: asyncio.Task[None] | None = None

    @property
    def on_commit(self) -> bool:
        """A CommitAck waits for its sync."""
        return self.mode == "commit"

    def wrote(self, size: int) -> None:
        """`size` bytes were queued for the writer thread (data or journal); the first write starts
        `--fsync background`'s syncs."""
        if self.mode != "none":
            self.stats.unsynced_bytes += size
            if self.unsynced_since is None:
                self.unsynced_since = time.monotonic()
            if self.mode == "background" and self._background is None:
                self._background = asyncio.get_running_loop().create_task(self._run_background())

    def stop(self) -> None:
        if self._background is not None:
            self._background.cancel()

    def snapshot(self) -> DiskStats:
        """The disk's counters now, with how long the oldest write not yet synced has waited."""
        since = self.unsynced_since
        return dataclasses.replace(self.stats, unsynced_seconds=time.monotonic() - since if since is not None else 0.0)

    def sync(self, records: list[Record] | None = None) -> asyncio.Future[None]:
        """Done once a sync that started after this call is: what was written before it is on the device,
        and `records` are appended and synced after the data they name."""
        done = asyncio.get_running_loop().create_future()
        self._waiting.append((records or [], done))
        if self._running is None:
            self._start()
        return done

    def _start(self) -> None:
        batch, self._waiting = self._waiting, []
        self.stats.unsynced_bytes, self.unsynced_since = 0, None
        started = time.monotonic()
        try:
            running = self._submit([r for records, _ in batch for r in records])
        except BaseException as exc:  # the writer is shut down (at stop)
            for _, done in batch:
                if not done.done():  # its waiter may have given up
                    done.set_exception(exc)
            return
        self._running = running
        running.add_done_callback(lambda ran: self._ended(ran, batch, started))

    def _ended(self, ran: asyncio.Future[int], batch: list[Waiting], started: float) -> None:
        self._running = None
        stats = self.stats
        stats.syncs += 1
        stats.sync_seconds += time.monotonic() - started
        error = ran.exception() if not ran.cancelled() else asyncio.CancelledError()
        if error is None:
            stats.fsyncs += ran.result()
        else:
            stats.sync_failures += 1
        for _, done in batch:
            if not done.done():
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)
        if self._waiting:
            self._start()

    async def _run_background(self) -> None:
        """`--fsync background`: sync whatever was written, every `interval` seconds at most after it was."""
        while True:
            since = self.unsynced_since
            wait = self.interval if since is None else max(0.0, since + self.interval - time.monotonic())
            await asyncio.sleep(wait)  # a period, not a synchronisation
            if self.unsynced_since is not None:
                try:
                    await self.sync()
                except OSError as exc:  # the next round tries again
                    event(log, "fsync failed", logging.WARNING, reason=exc)
