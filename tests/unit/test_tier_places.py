"""Where pieces are once the object-store tier has them (storage/placement.py, storage/tier.py), in-process: an
upload re-places the pieces of the data file (their blocks become garbage) and keeps those in memory as a
cache the spiller frees without a write; an upload batch fills an object to at least a part and under two,
cutting an attempt whose pieces do not fit and leaving its commit to a later object; and healing's
responsibility rule picks exactly one holder among the survivors."""

from __future__ import annotations

import pytest

from shuffled.buffers import GlobalPool
from shuffled.config import DaemonConfig
from shuffled.server.cluster.healing import responsible
from shuffled.server.cluster.membership import Membership
from shuffled.server.cluster.survey import Copies
from shuffled.server.storage.disk import SpillFile, StoredObject
from shuffled.server.storage.durable import _Queue
from shuffled.server.storage.holdings import HeldAttempt
from shuffled.server.storage.object_config import ObjectStoreConfig
from shuffled.server.storage.object_format import FOOTER_GUESS
from shuffled.server.storage.objects import ObjectStore
from shuffled.server.storage.shuffles import FILE, MapOutput
from shuffled.server.storage.store import Store
from shuffled.server.storage.tier import ObjectTier
from tests.pieces import pack, push

SEG = 4096


def _attempt(pool: GlobalPool, store: Store, attempt: int, pieces: int, fill: int = 1000) -> MapOutput:
    out = store.open_map_output("app", 1, attempt, attempt, 4096)
    for i in range(pieces):
        push(pool, store, out, pack(attempt, [(i, bytes([attempt]) * fill)]))
    store.commit(out)
    return out


def test_an_upload_replaces_file_pieces_and_keeps_memory_ones_as_a_cache() -> None:
    pool = GlobalPool(64 * SEG, SEG, reserve=8)
    store = Store(SEG)
    out = _attempt(pool, store, 1, 5)
    data = out.shuffle
    data.file = SpillFile("/nonexistent/data")
    start, end = store.placement.take_for_spill(out, 2)
    store.placement.spilled(out, start, end, 100)  # pieces 0, 1 in the file at 100
    assert (out.placed, out.spilled, list(out.places)) == (2, 2, [FILE, FILE])
    place = store.placement.add_object(data, StoredObject("k", 1 << 20))
    store.placement.uploaded(out, [0, 1, 2, 3, 4], place, 0)
    assert list(out.places) == [place] * 5 and out.placed == 5 and out.spilled == 2
    assert [(g.offset, g.length) for g in store.placement.garbage] == [
        (100, out.sizes[0]),
        (100 + out.sizes[0], out.sizes[1]),
    ]
    assert out.buffer(3) is not None, "memory pieces an object holds stay in memory"
    assert out.movable == 3 and store.memory_segments == 3
    assert store.placement.take_for_spill(out) == (5, 5), "nothing to write: an object holds them all"
    assert out.spilled == 5 and store.memory_segments == 0 and pool.used == 0


def _tier(part: int) -> ObjectTier:
    config = ObjectStoreConfig("s3://bucket/p", endpoint="http://127.0.0.1:9", part_size=part)
    return ObjectTier(Store(SEG), ObjectStore(config, environ={}), None, DaemonConfig())


def test_an_upload_fills_an_object_to_a_part_and_cuts_what_does_not_fit() -> None:
    part = 5 << 20
    tier = _tier(part)
    pool = GlobalPool(4096 * SEG, SEG, reserve=8)
    small = [_attempt(pool, tier.store, a, 100, fill=3000) for a in (1, 2)]  # ~300 KB each
    big = _attempt(pool, tier.store, 3, 3000, fill=3800)  # ~11 MB: more than an object holds
    rest = _attempt(pool, tier.store, 4, 10, fill=3000)
    queue = _Queue([*small, big, rest])
    pieces, commits = queue.take(tier.writer)
    taken = sum(out.sizes[i] for out, indices in pieces for i in indices)
    assert part <= taken <= 2 * part - FOOTER_GUESS
    assert [out.attempt for out, _ in pieces] == [1, 2, 3] and commits == small, "attempt 3 is cut: no commit yet"
    assert pieces[2][1] == list(range(len(pieces[2][1])))
    tier.writer.busy = {small[0]}
    pieces, commits = queue.take(tier.writer)
    assert pieces[0][0] is small[1], "an attempt being spilled is left for later"


@pytest.mark.parametrize("lost", ["h0:1", "h1:1", "h2:1", "h3:1"])
def test_exactly_one_survivor_heals_an_attempt(lost: str) -> None:
    """Every daemon but `lost` holds the attempt or not as placement put it; exactly one of the holders left
    finds itself responsible (the first in placement order), whoever was lost."""
    peers = ["h0:1", "h1:1", "h2:1", "h3:1"]
    held = HeldAttempt("app", 3, 1, 1, 0, None, 2, 100)
    primary = "h0:1"
    placed = Membership(DaemonConfig(peers=peers), primary).candidates(primary, "app", 3)
    holders = {primary, placed[0]} - {lost}
    found = []
    for node in sorted(holders):
        others = holders - {node}
        h = Copies(held, primary, 1, [c for c in placed if c != node], holders=set(others))
        if responsible(node, Membership(DaemonConfig(peers=peers), node), h):
            found.append(node)
    assert len(found) == 1, found
    assert found[0] == next(d for d in [primary, *placed] if d in holders)
