"""The shuffles' journals in the data dir: one next to each shuffle's data file, started with a header (the
shuffle, and the application's binding so a restart keeps it) and the commits so far once the shuffle
first has data on disk, then a record per commit, spill write (the pieces it placed) and object (what it
holds). A restart reads them back (replay.py) and serves again what they prove. Records are appended
on the disk's writer thread in the order they are asked for, after the writes they describe were queued.
"""

from __future__ import annotations

import asyncio
import logging

from ...logs import event
from .disk import JOURNAL, Disk, encode_record
from .shuffles import ShuffleData, commit_fields
from .store import Store

log = logging.getLogger(__name__)


class Journals:
    """The journals of the store's shuffles (see the module); nothing is journaled without a data dir."""

    def __init__(self, store: Store, disk: Disk | None) -> None:
        self.store = store
        self.disk = disk

    def open(self, data: ShuffleData) -> str:
        """The shuffle's directory; the first call starts its journal with a header and the commits so far."""
        disk = self.disk
        assert disk is not None
        if data.directory is None:
            directory = disk.shuffle_dir(data.app, data.shuffle)
            head: dict[str, object] = {
                "k": "shuffle",
                "app": data.app,
                "shuffle": data.shuffle,
                "partitions": data.partitions,
            }
            key = self.store.app_keys.get(data.app)
            if key is not None:  # the application's binding, so a restart (and its drain) keeps it
                head["key"] = key
            if self.store.at_rest is not None:  # the key its pieces are sealed with (at_rest.py)
                head["kid"] = data.key_id = self.store.at_rest.current
            records = [encode_record(head)]
            records += [self._commit_record(data, a) for a in data.committed]
            self._journal(directory, b"".join(records))  # raises if the writer is shut down (at stop)
            data.directory = directory  # only now: later records must follow a queued header
        return data.directory

    def committed(self, data: ShuffleData, attempt: int) -> None:
        """Journal a commit once the shuffle has files (before that, it lives in memory only)."""
        if data.directory is not None and self.disk is not None:
            self._journal(data.directory, self._commit_record(data, attempt))

    def append(self, data: ShuffleData, record: dict[str, object]) -> None:
        """Append a record to the shuffle's journal (started if need be), with a data dir; else nothing."""
        if self.disk is not None and not data.removed:
            self._journal(self.open(data), encode_record(record))

    def commit_record(self, data: ShuffleData, attempt: int) -> tuple[str, bytes]:
        """A commit's record and the journal it goes to, for a sync to append (fsync.py): the shuffle has files."""
        assert data.directory is not None
        return f"{data.directory}/{JOURNAL}", self._commit_record(data, attempt)

    @staticmethod
    def _commit_record(data: ShuffleData, attempt: int) -> bytes:
        return encode_record({"k": "commit", **commit_fields(data, attempt)})

    def _journal(self, directory: str, record: bytes) -> None:
        assert self.disk is not None
        self.disk.append_journal(f"{directory}/{JOURNAL}", record).add_done_callback(_log_journal_failure)


def _log_journal_failure(done: asyncio.Future[None]) -> None:
    if not done.cancelled() and done.exception() is not None:
        event(
            log,
            "journal write failed (the data it describes will not survive a restart)",
            logging.WARNING,
            reason=done.exception(),
        )
