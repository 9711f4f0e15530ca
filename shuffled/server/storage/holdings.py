"""What the cluster asks of storage: which committed attempts are held here, and how much of them (a
drain's hand-over and healing survey the copies with it; the admin `holds` and `apps` answer from it)."""

from __future__ import annotations

from dataclasses import dataclass

from .shuffles import ShuffleData
from .store import Store


@dataclass(frozen=True, slots=True)
class HeldAttempt:
    """A committed attempt held here, as the cluster surveys its copies (a drain's hand-over, healing)."""

    app: str
    shuffle: int
    partitions: int
    attempt: int
    map_index: int
    #: None when it was pushed here, else the node of the primary it is a replica of
    replica_of: str | None
    #: copies its pusher wanted, this one included
    replicas: int
    #: bytes of its runs
    bytes: int


class Holdings:
    def __init__(self, store: Store) -> None:
        self.store = store

    def shuffle(self, app: str, shuffle: int) -> ShuffleData | None:
        return self.store.apps.get(app, {}).get(shuffle)

    def holds(self, app: str, shuffle: int, attempts: list[int]) -> tuple[list[int], list[int]]:
        """Which of these attempts are committed here, and the bytes each holds (admin `holds`: a drain or
        healing deciding what still needs a copy elsewhere)."""
        data = self.shuffle(app, shuffle)
        if data is None:
            return [], []
        held = [a for a in attempts if a in data.committed]
        return held, [data.committed[a].bytes for a in held]

    def committed_attempts(self) -> list[HeldAttempt]:
        return [
            HeldAttempt(
                d.app, d.shuffle, d.partitions, a, out.map_index, d.replica_of.get(a), d.replicas.get(a, 1), out.bytes
            )
            for shuffles in self.store.apps.values()
            for d in shuffles.values()
            for a, out in d.committed.items()
        ]

    def committed_bytes(self, app: str, shuffle: int, attempt: int) -> int | None:
        """The bytes of a committed attempt held here; None when it is not (any more)."""
        data = self.shuffle(app, shuffle)
        out = data.committed.get(attempt) if data is not None else None
        return out.bytes if out is not None else None

    def under_replicated(self, app: str, shuffle: int, attempts: int) -> None:
        """Healing found `attempts` of the shuffle lacking copies this daemon is to make (stats, the alert)."""
        data = self.shuffle(app, shuffle)
        if data is not None:
            data.under_replicated = attempts

    def applications(self) -> list[str]:
        return sorted(self.store.apps)
