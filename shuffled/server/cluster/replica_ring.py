"""Where an attempt's replicas live: a pure function of the daemons' peer list, so that any daemon (the
primary that forwards a push, a daemon relaying a read whose primary is gone, a draining daemon handing
its data over) names the same daemons without asking a coordinator.

Placement is per (primary, application, shuffle), not per map attempt: every attempt a primary holds for
one shuffle has the same candidates, so a read of that primary's location fails over as one stream to one
daemon. The rotation `k` is the same for every primary of a shuffle, which makes the first candidates a
permutation of the ring: each daemon is the first replica of exactly one primary per shuffle, and the
replica load spreads evenly. Daemons in another zone than the primary come first, so a copy survives the
loss of the primary's whole failure domain; within a zone the ring order is kept.

The hash is spelled out in proto/PROTOCOL.md (§12.4) so that every implementation agrees.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping


def rotation(app: str, shuffle: int, n: int) -> int:
    """The ring offset of a shuffle's first replica, 1..n-1 (never the primary itself)."""
    digest = hashlib.sha256(f"{app}\n{shuffle}".encode()).digest()
    return 1 + int.from_bytes(digest[:8], "big") % (n - 1)


def candidates(peers: Iterable[str], zones: Mapping[str, str], primary: str, app: str, shuffle: int) -> list[str]:
    """Every daemon but `primary`, in the order its replicas are placed and looked for.

    `peers` may or may not include the primary; the primary is on the ring even when the list lost it, so
    daemons whose lists differ only by the primary still agree. Sorting is by code point, as everywhere
    in the protocol.
    """
    ring = sorted(set(peers) | {primary})
    n = len(ring)
    if n < 2:
        return []
    i = ring.index(primary)
    k = rotation(app, shuffle, n)
    order = [x for x in (ring[(i + k + j) % n] for j in range(n)) if x != primary]
    home = zones.get(primary, "")
    return [x for x in order if zones.get(x, "") != home] + [x for x in order if zones.get(x, "") == home]
