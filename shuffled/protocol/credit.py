"""Credit-based flow control as pure state machines (Flink's scheme, counts only).

Receiver side: every remote channel owns `exclusive` buffers, its initial credit.
Its gate shares a `FloatingPool`. With each data buffer the sender announces its
backlog; the channel then tries to hold `backlog + exclusive` free buffers by
taking floating ones, each becoming credit. Credit is announced lazily: the shell
is told to send AddCredit only once enough is unannounced (`ANNOUNCE_BATCH`) or
the sender runs short, and then carries all of it at once. Recycling a buffer gives credit back, or
returns a floating buffer to the pool when the channel holds more than it needs and its backlog
is gone or someone else wants the buffer.

Sender side: `OutboundStream` never releases a data item without credit; events
pass without it. `SendScheduler` serves ready streams round-robin.

These classes hold counters, not memory: the shell pairs each counted buffer with
a real pool segment, and the property tests drive them with random interleavings.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Protocol, TypeVar

from .errors import CreditViolation, ProtocolError, SequenceGap

T = TypeVar("T")

#: Buffers per channel (Flink's default) and at most this many floating buffers per gate. Flink's
#: floating default is 8, but its gates have a channel per upstream task; a read here has one channel per
#: daemon, often a single one, and 2 + 8 buffers (320 KiB) in flight cannot keep a stream busy while the
#: processes at either end take turns on the CPUs (measured: 8 -> 32 -> 64 took one local stream from
#: about 1.2 to 1.9 to 2.2 GiB/s). Floating buffers are only taken while memory is to spare (`FloatingPool.acquire`),
#: so a larger maximum costs nothing when memory is short.
DEFAULT_EXCLUSIVE = 2
DEFAULT_FLOATING = 64
#: New credit is held back until this much has accumulated, unless the sender is down to less than this:
#: each AddCredit costs a socket write at the receiver and a wake-up at the sender, and with a window of
#: dozens of buffers announcing every freed buffer bought nothing.
ANNOUNCE_BATCH = 8


class FloatingMemory(Protocol):
    """What backs a gate's floating buffers with memory: the gate's `LocalPool`, which takes a segment from
    the global pool when a floating buffer becomes credit and gives it back when the channel no longer
    needs it, so an idle or memory-short daemon never holds floating buffers nobody can use."""

    def hold_extra(self, n: int) -> int:
        """Back up to n more floating buffers now; how many it could (0: no memory to spare)."""
        ...

    def drop_extra(self, n: int) -> None:
        """The memory behind n floating buffers is no longer needed."""
        ...

    @property
    def wanted(self) -> bool:
        """Someone else waits for this memory (a spare floating buffer should go back)."""
        ...


class FloatingPool:
    """A gate's floating buffers, handed to channels first come, first served.

    `size` caps how many the gate's channels hold together. The memory behind them
    is the shell's business, given as `memory` (composition, not a subclass, so
    the compiled module has no interpreted subclasses): it is asked before buffers
    become credit (and may give fewer or none: memory is short, the channel keeps
    the credit it has and asks again with its next buffer), and told when some come
    back. Both count buffers, so a channel takes what its backlog asks for, and a
    closed one gives back what it held, in one call each rather than one per buffer.
    Without memory the pool only counts (the state machine's tests; a client reader
    before its local pool exists, when no buffer can arrive yet).
    """

    __slots__ = ("_waiting", "free", "memory", "size")

    def __init__(self, size: int, memory: FloatingMemory | None = None) -> None:
        if size < 0:
            raise ValueError("floating pool size must be >= 0")
        self.size = size
        self.free = size
        self.memory = memory
        self._waiting: deque[ChannelCredit] = deque()

    def acquire(self, n: int) -> int:
        """Back up to n more floating buffers with memory now; how many it could (0: none)."""
        return n if self.memory is None else self.memory.hold_extra(n)

    def release(self, n: int) -> None:
        """The memory behind n floating buffers is no longer needed."""
        if self.memory is not None:
            self.memory.drop_extra(n)

    def memory_wanted(self) -> bool:
        """Someone else waits for the memory behind floating buffers."""
        return self.memory is not None and self.memory.wanted

    def keep_spare(self) -> bool:
        """A channel may keep a floating buffer it holds beyond its need: no other channel waits for one
        and no one waits for the memory behind it."""
        waiting = self._waiting
        while waiting and not waiting[0].needs_floating():  # no longer waiting (e.g. the asking channel)
            waiting.popleft().waiting = False
        return not waiting and not self.memory_wanted()

    def take(self, channel: ChannelCredit, want: int) -> int:
        """Up to `want` buffers for `channel` (> 0); if it gets fewer it waits for the rest."""
        got = self.acquire(min(want, self.free)) if self.free else 0
        self.free -= got
        if got < want and not channel.waiting:
            channel.waiting = True
            self._waiting.append(channel)
        return got

    def give_back(self, n: int = 1) -> list[ChannelCredit]:
        """n buffers return; waiting channels may take them. Returns channels with new credit to announce."""
        self.free += n
        self.release(n)
        announce: list[ChannelCredit] = []
        waiting = self._waiting
        while self.free and waiting:
            channel = waiting[0]
            want = channel.shortfall()
            if want <= 0:
                waiting.popleft().waiting = False
                continue
            got = self.acquire(min(want, self.free))
            if not got:
                break  # memory is short: the channel stays first in line
            self.free -= got
            if channel.add_floating(got):
                announce.append(channel)
            if got == want:
                waiting.popleft().waiting = False
        return announce


class ChannelCredit:
    """Receiver-side credit of one input channel.

    Invariants (checked by tests): available == sender_credit + unannounced, and
    exclusive + floating == available + in_use.
    """

    __slots__ = (
        "available",
        "backlog",
        "closed",
        "exclusive",
        "floating",
        "in_use",
        "owner",
        "pool",
        "sender_credit",
        "unannounced",
        "waiting",
    )

    def __init__(self, exclusive: int, pool: FloatingPool, owner: object = None) -> None:
        if exclusive < 1:
            raise ValueError("a channel needs at least one exclusive buffer")
        self.exclusive = exclusive
        self.pool = pool
        self.available = exclusive
        self.floating = 0
        self.in_use = 0
        self.sender_credit = exclusive  # sent as the PartitionRequest's initial credit
        self.unannounced = 0
        self.backlog = 0
        self.closed = False
        #: the shell object this credit belongs to (so pool callbacks can find it)
        self.owner = owner
        #: queued in the pool's waiting list (closed channels are skipped when reached)
        self.waiting = False

    def needs_floating(self) -> bool:
        return not self.closed and self.available < self.backlog + self.exclusive

    def shortfall(self) -> int:
        """Floating buffers the backlog asks for beyond what the channel holds (<= 0: none)."""
        return 0 if self.closed else self.backlog + self.exclusive - self.available

    def add_floating(self, n: int) -> bool:
        self.floating += n
        self.available += n
        return self._add_unannounced(n)

    def _add_unannounced(self, n: int = 1) -> bool:
        self.unannounced += n
        return self._due()

    def _due(self) -> bool:
        """Unannounced credit should go out now (see ANNOUNCE_BATCH); the sender is never left without credit
        while some is unannounced, since it then has fewer than ANNOUNCE_BATCH."""
        n = self.unannounced
        return n > 0 and (n >= ANNOUNCE_BATCH or self.sender_credit < ANNOUNCE_BATCH)

    def on_buffer(self, backlog: int) -> bool:
        """A data buffer arrived. Returns True when an AddCredit should be scheduled."""
        if self.sender_credit <= 0:
            raise CreditViolation("data buffer received on a channel with no credit")
        self.sender_credit -= 1
        self.available -= 1
        self.in_use += 1
        return self.on_backlog(backlog) or self._due()

    def on_backlog(self, backlog: int) -> bool:
        self.backlog = backlog
        want = self.shortfall()
        if want <= 0:
            return False
        got = self.pool.take(self, want)
        return got > 0 and self.add_floating(got)

    def on_recycle(self) -> tuple[bool, list[ChannelCredit]]:
        """A buffer of this channel was recycled.

        Returns (announce this channel, other channels that got a floating buffer).
        """
        if self.in_use <= 0:
            raise ValueError("recycled more buffers than were in use")
        self.in_use -= 1
        self.available += 1
        if self.floating and (self.closed or self._surplus()):
            self.floating -= 1
            self.available -= 1
            return False, self.pool.give_back()
        if self.closed:
            return False, []
        return self._add_unannounced(), []

    def _surplus(self) -> bool:
        """More buffers free than the backlog needs, and the extra floating one should go back now.

        While the sender still has a backlog, a surplus is kept unless another channel or anyone else
        wants it: a short stream's backlog counts down by one per buffer, and giving a floating buffer
        back each time (to take it again with the next stream) was work per buffer that bought nothing.
        The channel holds no more than it took, and all of it goes back once the backlog is gone or the
        stream ends.
        """
        if self.available <= self.backlog + self.exclusive:
            return False
        return self.backlog == 0 or not self.pool.keep_spare()

    def take_announcement(self) -> int:
        """Credit to put in the next AddCredit (0: nothing to announce)."""
        n = self.unannounced
        self.sender_credit += n
        self.unannounced = 0
        return n

    def close(self) -> list[ChannelCredit]:
        """Stream ended or cancelled: free floating buffers go back now, in-use ones on recycle."""
        if self.closed:
            return []
        self.closed = True
        self.unannounced = 0
        free = min(self.floating, self.available)
        if not free:
            return []
        self.floating -= free
        self.available -= free
        return self.pool.give_back(free)


class SequenceChecker:
    """Every buffer of a stream carries the next sequence number; anything else is an error."""

    __slots__ = ("expected", "seen")

    def __init__(self) -> None:
        self.expected = 0
        self.seen = 0

    def is_duplicate(self, sequence: int) -> bool:
        """A number already seen: behind the expected one by less than half the u32 space.

        A pusher that lost a reply may send a buffer again with its old number;
        the receiver drops it instead of storing the bytes twice (PROTOCOL.md §12).
        """
        behind = (self.expected - sequence) & 0xFFFFFFFF
        return 0 < behind <= min(self.seen, 1 << 31)

    def check(self, sequence: int) -> None:
        if sequence != self.expected:
            raise SequenceGap(f"expected buffer {self.expected}, got {sequence}")
        self.expected = (self.expected + 1) & 0xFFFFFFFF
        self.seen += 1


class OutboundStream(Generic[T]):
    """Sender side of one stream: a queue of data items and events under credit."""

    __slots__ = ("_data", "_items", "closed", "credit", "deferred", "scheduled", "sequence", "stream", "upstream")

    def __init__(self, stream: int, credit: int) -> None:
        if credit < 0:
            raise ProtocolError("initial credit must be >= 0")
        self.stream = stream
        self.credit = credit
        self.sequence = 0
        self._items: deque[tuple[bool, T]] = deque()
        self._data = 0
        #: data items the stream will queue later (e.g. still on disk): announced as backlog too
        self.deferred = 0
        #: data items a relay's senders still hold for this stream (their announced backlog), announced too:
        #: the reader's window then follows the whole stream, not the few buffers the relay has at hand
        self.upstream = 0
        self.scheduled = False
        self.closed = False

    @property
    def backlog(self) -> int:
        """Data items queued or still to come (what the receiver is told it should make room for)."""
        return self._data + self.deferred + self.upstream

    @property
    def queued(self) -> int:
        """Data items queued and ready to send once there is credit."""
        return self._data

    def push_data(self, item: T) -> None:
        self._items.append((False, item))
        self._data += 1

    def push_many(self, items: list[T]) -> None:
        """Several data items at once (a batch a server's reader took from storage)."""
        self._items.extend([(False, item) for item in items])
        self._data += len(items)

    def push_event(self, item: T) -> None:
        self._items.append((True, item))

    def add_credit(self, n: int) -> None:
        if n <= 0:
            raise ProtocolError("credit must be positive")
        self.credit += n

    def add_slots(self, slots: list[int]) -> None:
        """Push credit as slots of shared memory (PushSlots, §6.3): only a stream that places its data there
        takes it."""
        raise ProtocolError(f"stream {self.stream}: push slots for a stream that does not use shared memory")

    def ready(self) -> bool:
        if not self._items or self.closed:
            return False
        return self._items[0][0] or self.credit > 0

    def pop(self) -> tuple[T, int, int, bool]:
        """Next item with (sequence, backlog after it, is_event); only call when ready()."""
        is_event, item = self._items[0]
        if not is_event:
            if self.credit <= 0:
                raise CreditViolation("no credit for the next data buffer")
            self.credit -= 1
            self._data -= 1
        self._items.popleft()
        seq = self.sequence
        self.sequence = (seq + 1) & 0xFFFFFFFF
        return item, seq, self.backlog, is_event

    def pop_more_data(self, like: T) -> T | None:
        """The next item if it is data of the same type as `like` and there is credit for it, else None: for a
        stream that puts several items in one frame (the credit and sequence counted as `pop` counts them)."""
        if not self._items or self.credit <= 0:
            return None
        is_event, item = self._items[0]
        if is_event or type(item) is not type(like):
            return None
        self.credit -= 1
        self._data -= 1
        self.sequence = (self.sequence + 1) & 0xFFFFFFFF
        return self._items.popleft()[1]

    def close(self) -> list[T]:
        """Stop sending; returns the items never sent so the caller can release them."""
        self.closed = True
        items = [item for _, item in self._items]
        self._items.clear()
        self._data = 0
        self.deferred = self.upstream = 0
        return items


class SendScheduler(Generic[T]):
    """Ready streams of one connection, served round-robin so none starves the others."""

    def __init__(self) -> None:
        self._ready: deque[OutboundStream[T]] = deque()

    def __bool__(self) -> bool:
        return bool(self._ready)

    def wake(self, stream: OutboundStream[T]) -> None:
        if not stream.scheduled and stream.ready():
            stream.scheduled = True
            self._ready.append(stream)

    def next(self) -> tuple[OutboundStream[T], T, int, int, bool] | None:
        """One item from the stream whose turn it is; the stream goes to the back if still ready."""
        while self._ready:
            stream = self._ready.popleft()
            stream.scheduled = False
            if not stream.ready():
                continue
            item, seq, backlog, is_event = stream.pop()
            self.wake(stream)
            return stream, item, seq, backlog, is_event
        return None
