"""Fixed off-heap memory: one anonymous mmap cut into equal segments.

Each segment is followed by `SLACK` bytes that are never data: a socket read that
fills the end of a payload may run on into them with the start of the next
frame (its header), which saves one read per frame (see `FrameReader`).

`GlobalPool` (Flink's NetworkBufferPool) owns every segment and never grows;
`LocalPool` (Flink's LocalBufferPool) is one consumer's share with a guaranteed
minimum and a maximum, rebalanced when pools come and go. A `Buffer` is a segment
plus a fill length plus a recycler; it is reference counted because the same
stored segment may be lent to several transports at once, and uvloop keeps a
reference to written memory until the kernel took it (recycling earlier would
let the next writer overwrite bytes still on their way out).

When the pool is empty, requests wait on a future: that wait is back-pressure.
A `reserve` of segments is kept for readers, so stored data can never take the
memory that reading it back (and so freeing it) needs. It is also all readers
get (besides floating buffers): a read holds its memory for as long as its
client takes to consume it, which a client may never do, so memory that
pushes were promised can never be held by reads. Four classes take memory,
each waiting in its own line:

- `PUSH`: anything but the part of the reserve readers do not hold;
- `FRAME` (a frame of a read served here): up to the whole reserve;
- `LOAD` (pieces read back from disk or the object store): never the reserve's
  last eighth, which is the frames': loaded pieces go out through frames, and
  a frame goes back as soon as its reader took it, so frames always come;
- `EXCLUSIVE` (a read gate's exclusive buffers): as loads, and never the
  reserve's last quarter. They wait for peers' frames to fill them, and the
  peers' frames and loads come out of the peers' reserves: two daemons whose
  reserves were all exclusive buffers waiting for each other would stop each
  other.

Floating buffers (a read's extra credit beyond its exclusive buffers) only speed
a read up, so they get memory nobody else needs to make progress: never the
reserve, only while fewer than `floating_ceiling` segments are in use, nobody
waits for memory and nothing is being spilled. By default the ceiling leaves twice
the reserve free (75 % used), which left a loaded daemon's reads their exclusive
buffers only; a daemon that can spill raises it to just below where its
background spilling starts (`set_floating_budget`): stored data normally sits
between the spiller's watermarks, and below the start mark floating buffers alone
never make the daemon spill stored data (whose room they would then take).
Floating memory cannot block a push for good: no floating buffer is given while
anyone waits for memory or stored data is being spilled, a spare one goes back as
soon as either happens (`FloatingPool.keep_spare`), the ones a read still needs
come back as it proceeds (it always can: its exclusive buffers and disk loads use
the reserve), and the pushes' room above the ceiling is more than the spiller
needs to find worth spilling.
"""

from __future__ import annotations

import asyncio
import mmap
from collections.abc import Callable

Recycler = Callable[["Buffer"], None]
#: who asks for memory (see the module): the rule it gets memory by, and the line it waits in
PUSH, FRAME, LOAD, EXCLUSIVE = 0, 1, 2, 3
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
#: scratch bytes after each segment (a multiple of 64, so segments stay cache-line aligned)
SLACK = 64


class Buffer:
    __slots__ = ("_recycler", "index", "length", "memory", "reader", "refs", "room")

    def __init__(self, index: int, room: memoryview, size: int) -> None:
        self.index = index
        #: the segment and the slack after it: where a payload of up to `size` bytes is read
        self.room = room
        self.memory = room[:size]
        self.length = 0
        self.refs = 0
        #: taken by a reader (counted in `GlobalPool.reading` until it comes back)
        self.reader = False
        self._recycler: Recycler | None = None

    def data(self) -> memoryview:
        return self.memory[: self.length]

    def set_recycler(self, recycler: Recycler) -> None:
        """Hand the buffer to a new owner (e.g. from a push pool to the store)."""
        self._recycler = recycler

    def retain(self) -> None:
        if self.refs <= 0:
            raise RuntimeError(f"buffer {self.index} retained after it was recycled")
        self.refs += 1

    def release(self) -> None:
        if self.refs <= 0:
            raise RuntimeError(f"buffer {self.index} released more often than retained")
        self.refs -= 1
        if self.refs == 0:
            recycler = self._recycler
            assert recycler is not None
            self._recycler = None
            recycler(self)

    def __repr__(self) -> str:
        return f"Buffer(#{self.index}, length={self.length}, refs={self.refs})"


class PoolExhausted(Exception):
    """Raised by `GlobalPool` only for requests larger than the pool could ever satisfy."""


class GlobalPool:
    def __init__(
        self, size_bytes: int, segment_size: int = 32 << 10, reserve: int = 0, reads_in_reserve: bool = True
    ) -> None:
        """`reads_in_reserve`: readers hold the reserve only (see the module): a daemon's, whose readers are
        other parties; a client's own reads may take any memory its writers do not (its writers still
        leave the reserve to them)."""
        if segment_size < 4096 or segment_size % 4096:
            raise ValueError("segment size must be a positive multiple of 4096 bytes")
        count = size_bytes // segment_size
        if count < 1:
            raise ValueError(f"pool of {size_bytes} bytes holds no segment of {segment_size} bytes")
        if not 0 <= reserve < count:
            raise ValueError("the read reserve must be smaller than the pool")
        self.segment_size = segment_size
        self.total = count
        self.reserve = reserve
        # Fault the whole region in now: the pool is reserved memory, and touching
        # pages lazily made the first pushes into a fresh daemon about 2x slower.
        stride = segment_size + SLACK
        self._mmap = mmap.mmap(-1, count * stride, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE)
        view = memoryview(self._mmap)
        self._buffers = [Buffer(i, view[i * stride : (i + 1) * stride], segment_size) for i in range(count)]
        self._free: list[Buffer] = list(reversed(self._buffers))
        self._waiters: list[tuple[int, int, asyncio.Future[list[Buffer]]]] = []
        self.locals = LocalPools(count - reserve)
        #: floating buffers are given only while fewer segments than this are in use
        self.floating_ceiling = count - 2 * reserve
        #: floating buffers out now (`LocalPool.hold_extra` minus `drop_extra`)
        self.floating = 0
        #: segments local pools hold as push credit not yet used (`LocalPool.promise`), in all and by holder: a
        #: writer keeps them for as long as it likes, so they are not memory that comes back by itself
        self.promised = 0
        self.promised_by: dict[str, int] = {}
        #: set while stored data is being spilled to make room (the spiller's pressure): memory is wanted
        self.spilling = False
        #: segments readers hold (`Buffer.reader`): never more than the reserve, whose rest pushes leave free
        self.reading = 0
        #: of those, read gates' exclusive buffers (their pools' minimums), and the most they may be
        self.exclusive = 0
        self.reads_in_reserve = reads_in_reserve
        loads = reserve - reserve // 8
        readers = (reserve, loads, loads) if reads_in_reserve else (count, count, count)
        #: per class, the most segments readers may hold with this one's request (pushes: the most it can get)
        self._caps = (count - reserve, *readers)
        self.exclusive_limit = reserve - reserve // 4 if reads_in_reserve else count

    def set_floating_budget(self, ceiling: int) -> None:
        """Let floating buffers fill the pool up to `ceiling` used segments (kept clear of the read reserve)."""
        self.floating_ceiling = max(0, min(ceiling, self.total - self.reserve - 1))

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.total - len(self._free)

    @property
    def push_room(self) -> int:
        """Segments pushes may still take: what is free less the part of the reserve readers do not hold
        (less all of it if readers may hold more)."""
        kept = self.reserve - self.reading if self.reads_in_reserve else self.reserve
        return len(self._free) - kept

    def room(self, klass: int) -> int:
        """How many segments a taker of this class (see the module) may have now."""
        if klass == PUSH:
            return self.push_room
        room = min(self._caps[klass] - self.reading, len(self._free))
        return min(room, self.exclusive_limit - self.exclusive) if klass == EXCLUSIVE else room

    def try_take(self, n: int = 1, klass: int = PUSH) -> list[Buffer] | None:
        """n segments now for a taker of this class, all or nothing."""
        return self._grant(n, klass) if self.room(klass) >= n else None

    def _grant(self, n: int, klass: int) -> list[Buffer]:
        out = self._pop(n)
        if klass != PUSH:
            self.reading += n
            for b in out:
                b.reader = True
            if klass == EXCLUSIVE:
                self.exclusive += n
        return out

    def try_take_spare(self, n: int = 1) -> list[Buffer]:
        """Up to n segments for a read's floating buffers, within the floating budget (see the module):
        floating buffers speed a read up but are not needed for it to finish, so they never take the
        memory that pushes (and other reads' exclusive buffers) wait for."""
        if self.wanted:
            return []
        n = min(n, self.floating_ceiling - self.used, self.push_room)
        if n <= 0:
            return []
        self.floating += n
        return self._pop(n)

    def _pop(self, n: int) -> list[Buffer]:
        out = [self._free.pop() for _ in range(n)]
        for b in out:
            b.refs = 1
            b.length = 0
        return out

    @property
    def wanted(self) -> bool:
        """Someone waits for memory (a withdrawn wait counts until the next segment comes back), or stored
        data is being spilled to make room."""
        return self.spilling or bool(self._waiters)

    @property
    def waiting(self) -> int:
        """Requests waiting for memory (back-pressure in effect)."""
        return sum(1 for _, _, fut in self._waiters if not fut.done())

    @property
    def free_for_loads(self) -> int:
        """Segments a load may take now without taking what a waiting load can use (loads waiting come
        first; pushes have memory of their own)."""
        if any(klass == LOAD and not fut.done() for _, klass, fut in self._waiters):
            return 0
        return max(0, min(len(self._free), self._caps[LOAD] - self.reading))

    def take_later(self, n: int = 1, klass: int = PUSH) -> asyncio.Future[list[Buffer]]:
        """A future for n segments, registered now; cancel it to withdraw the request."""
        limit = min(self._caps[klass], self.exclusive_limit) if klass == EXCLUSIVE else self._caps[klass]
        if n > limit:
            raise PoolExhausted(f"{n} segments requested, the pool can give at most {limit}")
        fut: asyncio.Future[list[Buffer]] = asyncio.get_running_loop().create_future()
        got = self.try_take(n, klass)
        if got is not None:
            fut.set_result(got)
        else:
            self._waiters.append((n, klass, fut))
        return fut

    async def take(self, n: int = 1, klass: int = PUSH) -> list[Buffer]:
        """n segments, waiting (never spinning) until they are free."""
        fut = self.take_later(n, klass)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._give_back(fut.result(), klass)
            raise

    def _give_back(self, segments: list[Buffer], klass: int) -> None:
        """Undo a grant of this class."""
        if klass == EXCLUSIVE:
            self.exclusive -= len(segments)
        for b in segments:
            self.give(b)

    def give(self, buffer: Buffer) -> None:
        """Return a segment (the recycler of buffers owned by nobody else)."""
        buffer.refs = 0
        buffer.length = 0
        if buffer.reader:
            buffer.reader = False
            self.reading -= 1
        self._free.append(buffer)
        if self._waiters:
            self._serve_waiters()

    def _serve_waiters(self) -> None:
        # First come, first served within each class (see the module), so small
        # requests cannot starve a large one; the classes are independent, so a
        # waiting pusher never blocks a reader, nor a waiting gate a frame.
        # Cancelled waiters are dropped here.
        keep = []
        blocked = [False, False, False, False]
        for n, klass, fut in self._waiters:
            if fut.done():
                continue
            if not blocked[klass] and self.room(klass) >= n:
                fut.set_result(self._grant(n, klass))
            else:
                blocked[klass] = True
                keep.append((n, klass, fut))
        self._waiters = keep

    async def create_local_pool(self, minimum: int, maximum: int, gate: bool = False, holder: str = "") -> LocalPool:
        """A new local pool holding its `minimum` segments (waits for them); `holder` names whose credit it
        promises (an application's); `gate`: a read gate's, whose minimum is its exclusive buffers."""
        if not 0 <= minimum <= maximum:
            raise ValueError("local pool needs 0 <= min <= max")
        pool = LocalPool(self, minimum, maximum, gate, [], holder)
        self.locals.add(pool)
        try:
            segments = await self.take(minimum, EXCLUSIVE if gate else PUSH) if minimum else []
        except BaseException:
            self.locals.drop(pool)
            raise
        pool.add_segments(segments)
        return pool


class LocalPools:
    """The local pools of one global pool, and their targets: the segments above every pool's minimum shared
    in proportion to what each may still take (Flink's redistribution)."""

    def __init__(self, shared: int) -> None:
        #: the segments local pools share (all but the read reserve)
        self.shared = shared
        self._pools: set[LocalPool] = set()
        #: the pools with max > min: only they can change size, so only they are visited (a thousand
        #: concurrent fixed-size read pools cost nothing here)
        self._flexible: set[LocalPool] = set()
        self.min_total = 0

    def __len__(self) -> int:
        return len(self._pools)

    def add(self, pool: LocalPool) -> None:
        """A new pool joins before it asks for its minimum, so pools holding more than their new share give
        the excess back first."""
        self._pools.add(pool)
        self.min_total += pool.min
        if pool.max > pool.min:
            self._flexible.add(pool)
        self.redistribute()

    def drop(self, pool: LocalPool) -> None:
        if pool in self._pools:
            self._pools.remove(pool)
            self.min_total -= pool.min
            self._flexible.discard(pool)
            self.redistribute()

    def redistribute(self) -> None:
        if not self._flexible:
            return
        spare = sum(p.max - p.min for p in self._flexible)
        excess = self.shared - self.min_total
        for pool in self._flexible:
            extra = 0 if spare == 0 else max(0, excess) * (pool.max - pool.min) // spare
            pool.set_target(pool.min + min(pool.max - pool.min, extra))


class LocalPool:
    """One consumer's segments: `min` guaranteed, up to `target` (<= max) when memory allows."""

    def __init__(
        self,
        owner: GlobalPool,
        minimum: int,
        maximum: int,
        gate: bool,
        segments: list[Buffer],
        holder: str = "",
    ) -> None:
        self.owner = owner
        self.holder = holder
        self.min = minimum
        self.max = maximum
        self.target = minimum
        self.gate = gate
        #: the class its segments beyond the minimum are taken as (a gate's: as loads, see the module)
        self._grows = LOAD if gate else PUSH
        self._held: list[Buffer] = []
        self.issued = 0
        #: floating buffers this pool holds beyond its share (counted in the global pool's `floating`)
        self.extra = 0
        #: held segments already promised to a peer (push credit): never taken back (`promise`)
        self.promised = 0
        self.destroyed = False
        self.add_segments(segments)

    def add_segments(self, segments: list[Buffer]) -> None:
        for b in segments:
            b.refs = 0
            self._held.append(b)

    @property
    def size(self) -> int:
        return len(self._held) + self.issued

    @property
    def available(self) -> int:
        return len(self._held)

    def set_target(self, target: int) -> None:
        """New share from redistribution; held segments go back unless they are promised."""
        self.target = target
        while len(self._held) > self.promised and self.size > max(self.target, self.min):
            self.owner.give(self._held.pop())

    def promise(self, n: int) -> None:
        """n more held segments are promised to a peer as push credit (counted in the global pool's too)."""
        self.promised += n
        self._count_promised(n)

    def _count_promised(self, n: int) -> None:
        owner = self.owner
        owner.promised += n
        left = owner.promised_by.get(self.holder, 0) + n
        if left:
            owner.promised_by[self.holder] = left
        else:
            del owner.promised_by[self.holder]

    def request(self) -> Buffer | None:
        """A buffer now, or None (never waits)."""
        if self._held:
            buf = self._held.pop()
            if self.promised:
                self.promised -= 1
                self._count_promised(-1)
        elif not self.destroyed and self.size < self.target:
            got = self.owner.try_take(1, self._grows)
            if got is None:
                return None
            buf = got[0]
        else:
            return None
        self.issued += 1
        buf.refs = 1
        buf.length = 0
        buf.set_recycler(self.recycle)
        return buf

    async def add_exclusive(self, n: int) -> None:
        """Guarantee n segments more (waits for them): a read that reopens a channel on another daemon
        needs new exclusive buffers while the failed channel's may still be on their way to the client."""
        got = await self.owner.take(n, EXCLUSIVE)
        if self.destroyed:
            self.owner._give_back(got, EXCLUSIVE)
            return
        self.add_segments(got)
        self.min += n
        self.max += n
        self.target += n
        self.owner.locals.min_total += n

    def grow(self, n: int = 1) -> int:
        """Take up to n more segments from the global pool into this pool, as far as its target allows and
        the global pool has them free; how many."""
        if self.destroyed:
            return 0
        n = min(n, self.target - self.size, self.owner.room(self._grows))
        if n <= 0:
            return 0
        got = self.owner.try_take(n, self._grows)
        assert got is not None, "n is within the global pool's room"
        for buf in got:
            buf.refs = 0
        self._held.extend(got)
        return n

    async def grow_wait(self) -> None:
        """Wait until the global pool gives this pool one more segment."""
        (buf,) = await self.owner.take(1, self._grows)
        if self.destroyed:
            self.owner.give(buf)
            return
        buf.refs = 0
        self._held.append(buf)

    def hold_extra(self, n: int = 1) -> int:
        """Hold up to n segments more than now, as far as the global pool has them to spare
        (`try_take_spare`); how many it got. Backs floating credit before it is announced, so the
        buffers it promises exist."""
        if self.destroyed:
            return 0
        got = self.owner.try_take_spare(n)
        for b in got:
            b.refs = 0
        self._held += got
        self.target = max(self.target, self.min) + len(got)
        self.extra += len(got)
        return len(got)

    @property
    def wanted(self) -> bool:
        """Someone waits for global memory: floating buffers held beyond need should go back."""
        return self.owner.wanted

    def drop_extra(self, n: int = 1) -> None:
        """Undo n of `hold_extra`: the segments go back to the global pool now if they are here, else
        when they are recycled."""
        counted = min(n, self.extra)
        self.extra -= counted
        self.owner.floating -= counted
        self.target -= n
        held = self._held
        while len(held) > self.promised and self.size > max(self.target, self.min):
            self.owner.give(held.pop())

    def detach(self, buf: Buffer, recycler: Recycler) -> None:
        """The buffer leaves this pool for good (e.g. pushed data now owned by the store)."""
        self.issued -= 1
        buf.set_recycler(recycler)

    def recycle(self, buf: Buffer) -> None:
        self.issued -= 1
        if self.destroyed or self.size >= max(self.target, self.min):
            self.owner.give(buf)
        else:
            self._held.append(buf)

    def destroy(self) -> None:
        """Give back every held segment now; issued ones go straight back when recycled."""
        if self.destroyed:
            return
        self.destroyed = True
        self.owner.floating -= self.extra
        self.extra = 0
        if self.promised:
            self._count_promised(-self.promised)
            self.promised = 0
        owner = self.owner
        if self.gate:
            owner.exclusive -= self.min
        while self._held:
            owner.give(self._held.pop())
        owner.locals.drop(self)
        if owner._waiters:  # what it holds may all be out, but its exclusive share is free now
            owner._serve_waiters()
