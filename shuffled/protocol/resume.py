"""Where a failed-over read goes on (PROTOCOL.md §10.6), and how a relay keeps track of it; no IO.

A resume point counts bytes: of `attempt`, every pair below `partition` and the first `bytes` bytes of
pair (`partition`, `attempt`) were relayed, and the attempts in `done` were relayed whole. Bytes, not
payloads, because copies of an attempt need not be packed alike (a drain may re-pack), while the bytes
of a pair are the same on every copy.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest, ProtocolError
from .packed import BytesLike, walk


@dataclass(frozen=True, slots=True)
class Resume:
    """A PartitionRequest's `resume` as a value; None `attempt`: only `done` (a read stopped between attempts)."""

    done: tuple[int, ...] = ()
    attempt: int | None = None
    partition: int = 0
    bytes: int = 0

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Resume:
        """The map the decoder checked the shape of (frames.optional_resume)."""
        if m.get("attempt") is None:
            return cls(tuple(m["done"]))
        return cls(tuple(m["done"]), m["attempt"], m["partition"], m["bytes"])

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {"done": list(self.done)}
        if self.attempt is not None:
            m |= {"attempt": self.attempt, "partition": self.partition, "bytes": self.bytes}
        return m

    def check(self, start: int, end: int, attempts: Collection[int]) -> None:
        """InvalidRequest (on the stream, §10.6) unless this point fits the request it came with: `done` and
        `attempt` among the named `attempts` (and `attempt` not done), `partition` within [start, end)."""
        stray = sorted(set(self.done) - set(attempts))
        if stray:
            raise InvalidRequest(f"resume: attempts {stray} in done are not named by the request")
        if self.attempt is None:
            return
        if self.attempt not in attempts or self.attempt in self.done:
            raise InvalidRequest(f"resume: attempt {self.attempt} is not a named attempt still to be read")
        if not start <= self.partition < end:
            raise InvalidRequest(f"resume: partition {self.partition} is outside the request's [{start}, {end})")


class ReadProgress:
    """How far a read stream got, group by group: the `Resume` another copy would go on from.

    A relaying daemon adds each payload before it relays it; the work is a few struct calls per group
    (its header, first and last run: `packed.walk`), none per run. ProtocolError when a payload breaks
    the order a single location's stream keeps (§10.1: an attempt's pairs together, ascending).
    """

    __slots__ = ("_attempt", "_bytes", "_done", "_partition")

    def __init__(self) -> None:
        self._done: list[int] = []
        self._attempt: int | None = None
        self._partition = -1
        self._bytes = 0

    def add(self, payload: BytesLike) -> int:
        """Take a payload into account; returns the bytes of its runs (what the relay counts)."""
        total = 0
        for attempt, runs, first, last, length, data in walk(payload):
            total += data
            if attempt != self._attempt:
                if attempt in self._done:
                    raise ProtocolError(f"attempt {attempt} came back after another attempt's data")
                if self._attempt is not None:
                    self._done.append(self._attempt)
                self._attempt, self._partition, self._bytes = attempt, last, length
            elif first < self._partition:
                raise ProtocolError(f"attempt {attempt}: partition {first} after partition {self._partition}")
            elif runs == 1 and first == self._partition:
                self._bytes += length
            else:
                self._partition, self._bytes = last, length
        return total

    def resume(self) -> Resume | None:
        """The resume point; None before any data (a copy then serves the request from its start)."""
        if self._attempt is None:
            return None
        return Resume(tuple(self._done), self._attempt, self._partition, self._bytes)
