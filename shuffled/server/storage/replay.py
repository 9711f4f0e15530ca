"""A data dir read back at start: every shuffle's journal replayed into what a restarted daemon may serve
(disk.py says what a journal records). An attempt is served again only if its commit record is intact and
its intact piece records account for exactly its pieces, each inside the file or the object holding it;
whatever under an `app-*` dir cannot be served is deleted, before the daemon listens. Entries the daemon
did not write are never touched.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ...logs import event
from .disk import (
    DATA,
    JOURNAL,
    LOCK,
    Disk,
    LoadedAttempt,
    LoadedShuffle,
    StoredObject,
    app_dir_name,
    decode_records,
    unlink,
)

log = logging.getLogger(__name__)


def load(disk: Disk) -> list[LoadedShuffle]:
    """Read every journal; delete whatever under an `app-*` dir cannot be served (before the daemon listens)."""
    loaded: list[LoadedShuffle] = []
    for app_entry in sorted(os.scandir(disk.root), key=lambda e: e.name):
        if app_entry.name == LOCK:
            continue
        if not app_entry.name.startswith("app-") or not app_entry.is_dir(follow_symlinks=False):
            # Not ours (lost+found on a mount point, an operator's file): never deleted.
            event(
                log,
                "ignoring an entry of the data dir this daemon did not write",
                logging.WARNING,
                path=app_entry.path,
            )
            continue
        for entry in sorted(os.scandir(app_entry.path), key=lambda e: e.name):
            shuffle = _load_shuffle(disk, entry.path) if entry.is_dir(follow_symlinks=False) else None
            if shuffle is None or not shuffle.committed:
                event(log, "removing leftover spill data it cannot serve", path=entry.path)
                disk.remove_now(entry.path) if entry.is_dir(follow_symlinks=False) else unlink(entry.path)
            else:
                loaded.append(shuffle)
        try:
            os.rmdir(app_entry.path)
        except OSError:
            pass
    for s in loaded:
        disk.stats.files += 1
        disk.stats.used_bytes += s.file_size
    return loaded


def _load_shuffle(disk: Disk, directory: str) -> LoadedShuffle | None:
    journal = os.path.join(directory, JOURNAL)
    try:
        with open(journal, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    records, end = decode_records(raw)
    if end < len(raw):
        event(log, "journal has a torn or corrupt tail; dropped", logging.WARNING, path=journal, bytes=len(raw) - end)
        os.truncate(journal, end)
    try:
        return _replay(disk, directory, records)
    except (KeyError, TypeError, ValueError) as exc:
        event(log, "journal does not describe a shuffle", logging.WARNING, path=journal, reason=exc)
        return None


def _replay(disk: Disk, directory: str, records: list[dict[str, Any]]) -> LoadedShuffle | None:
    head = next((r for r in records if r.get("k") == "shuffle"), None)
    if head is None:
        return None
    out = LoadedShuffle(str(head["app"]), int(head["shuffle"]), int(head["partitions"]), directory)
    if app_dir_name(out.app) != os.path.basename(os.path.dirname(directory)):
        return None
    key = head.get("key")
    if isinstance(key, bytes):
        out.app_key = key
    if head.get("kid") is not None:
        out.key_id = str(head["kid"])
    pieces: dict[tuple[int, int], LoadedAttempt] = {}
    commits: dict[tuple[int, int], dict[str, Any]] = {}
    durable: set[tuple[int, int]] = set()
    for r in records:
        kind = r.get("k")
        if kind == "pieces":
            at = int(r["o"])
            for attempt, serial, rows, *sealed in r["a"]:
                found = pieces.setdefault((int(attempt), int(serial)), LoadedAttempt(0, int(serial), 0))
                at = found.add(at, bytes(rows), bytes(sealed[0]) if sealed else None)
        elif kind == "object":
            kid = r.get("kid")
            out.objects.append(StoredObject(str(r["key"]), int(r["size"]), kid=None if kid is None else str(kid)))
            for attempt, serial, start, offset, rows, *sealed in r["a"]:
                found = pieces.setdefault((int(attempt), int(serial)), LoadedAttempt(0, int(serial), 0))
                found.put(int(start), len(out.objects), int(offset), bytes(rows), bytes(sealed[0]) if sealed else None)
            durable.update((int(a), int(s)) for a, s in r.get("d", ()))
        elif kind == "commit":
            commits[int(r["attempt"]), int(r["serial"])] = r
    path = disk.data_path(directory)
    try:
        out.file_size = os.stat(path).st_size
    except FileNotFoundError:
        out.file_size = 0
    # An attempt is servable only if its intact piece records account for exactly its committed pieces,
    # each inside the file or the object holding it.
    ends = [out.file_size, *(o.size for o in out.objects)]
    kids = [out.key_id, *(o.kid for o in out.objects)]
    for (attempt, serial), r in commits.items():
        found = pieces.get((attempt, serial), LoadedAttempt(0, serial, 0))
        if not found.matches(r) or found.outside(ends) or not found.sealed(kids):
            continue
        out.adopt(attempt, found, r, (attempt, serial) in durable)
    keep = {JOURNAL, DATA} if out.committed else set()
    for entry in os.scandir(directory):
        if entry.name not in keep:
            unlink(entry.path)
    return out
