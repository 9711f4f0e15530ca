"""Data served again: what a previous run of this daemon left on disk and can prove (its journal), and
what a node's objects prove it committed (adopt.py). Either becomes committed attempts of the store's
shuffles, in place: nothing is copied, each piece stays where it is found."""

from __future__ import annotations

import logging

from ...config import ConfigError
from ...logs import event
from . import replay
from .disk import Disk, LoadedShuffle, SpillFile
from .shuffles import FILE, MapOutput, ShuffleData
from .store import Store

log = logging.getLogger(__name__)


def restore(store: Store, disk: Disk) -> int:
    """Serve again what a previous run left on disk and can prove (everything else was deleted by
    `replay.load`); the number of shuffles restored."""
    loaded = replay.load(disk)
    keys = store.at_rest
    for shuffle in loaded:
        for kid in {k for k in (shuffle.key_id, *(o.kid for o in shuffle.objects)) if k is not None}:
            if keys is None or not keys.knows(kid):
                raise ConfigError(
                    f"{shuffle.directory} is sealed with at-rest key {kid}, which "
                    + ("at-rest-key-file does not hold" if keys else "no at-rest-key-file gives")
                    + ": give the key (rotation keeps old keys below the new one, docs/security.md)"
                )
    for shuffle in loaded:
        restore_shuffle(store, shuffle, SpillFile(disk.data_path(shuffle.directory), shuffle.file_size))
        event(
            log,
            "restored",
            app=shuffle.app,
            shuffle=shuffle.shuffle,
            attempts=len(shuffle.committed),
            bytes=sum(a.stored for a in shuffle.committed.values()),
        )
    return len(loaded)


def restore_shuffle(
    store: Store, loaded: LoadedShuffle, file: SpillFile | None, node: str | None = None
) -> ShuffleData:
    """Committed data found at start (the data dir's journal), or proved by a node's objects (`node`: their
    writer, None for this daemon's own), becomes servable. Attempts held already are left as they are.
    Returns the shuffle."""
    data = store.shuffle_data(loaded.app, loaded.shuffle, loaded.partitions)
    if file is not None:
        data.directory = loaded.directory
        data.key_id = loaded.key_id
        data.file = file
        data.disk_bytes += file.size
        data.usage.disk_bytes += file.size
    if loaded.app_key is not None:
        store.app_keys.bind(loaded.app, loaded.app_key)
    held = {o.key: place for place, o in enumerate(data.objects, start=1)}
    places = [FILE]  # a loaded place -> the shuffle's (an object adopted again keeps its place)
    for o in loaded.objects:
        places.append(held.get(o.key) or store.placement.add_object(data, o))
    for attempt, found in loaded.committed.items():
        if attempt in data.committed or attempt in data.open:
            continue
        of, replicas = loaded.replica_of.get(attempt, node), loaded.replicas.get(attempt, 1)
        out = MapOutput.restored(data, attempt, found, places, of, replicas)
        out.durable = out.wants_durable = attempt in loaded.durable
        data.committed[attempt] = out
        data.bytes += out.bytes
        data.mark(out, loaded.copies.get(attempt, ()))
    return data
