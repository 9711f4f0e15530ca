"""What was dropped here, and why: so that a read of a gone shuffle fails instead of reading as empty.

A daemon that never held a shuffle answers a read naming no attempts with nothing (it may be one of many
daemons asked, PROTOCOL.md §10.1); one that held it and dropped it knows better, and says so: the read
fails with PARTITION_NOT_FOUND and the reason (unregistered, its application removed or expired). The
record is bounded (the oldest go first) and told only to the application's owner, so a stranger learns
nothing of which applications existed. A new push to the shuffle, or to a removed application, ends its
record: the id is in use again.
"""

from __future__ import annotations

from collections import OrderedDict

from .access import is_owner

#: records kept; past it the oldest go (a streaming query unregisters a shuffle every micro-batch)
MAX_DEPARTURES = 4096


class Departures:
    """Dropped shuffles and applications: (app, shuffle or None for all of it) -> (reason, owner digest)."""

    def __init__(self, limit: int = MAX_DEPARTURES) -> None:
        self.limit = limit
        self._gone: OrderedDict[tuple[str, int | None], tuple[str, bytes | None]] = OrderedDict()

    def left(self, app: str, shuffle: int | None, reason: str, owner: bytes | None) -> None:
        """`app` (or one shuffle of it) was dropped for `reason`; `owner` is the digest it was bound to."""
        key = (app, shuffle)
        self._gone.pop(key, None)
        self._gone[key] = (reason, owner)
        while len(self._gone) > self.limit:
            self._gone.popitem(last=False)

    def returned(self, app: str, shuffle: int) -> None:
        """A map output of `app`/`shuffle` opens: the ids are in use again."""
        self._gone.pop((app, shuffle), None)
        self._gone.pop((app, None), None)

    def why(self, app: str, shuffle: int, digest: bytes) -> str | None:
        """Why `app`/`shuffle` is no longer here, for its owner (`digest`); None if it was not dropped here,
        or the requester is not the one it belonged to."""
        for key in ((app, shuffle), (app, None)):
            found = self._gone.get(key)
            if found is not None:
                reason, owner = found
                return reason if owner is None or is_owner(owner, digest) else None
        return None
