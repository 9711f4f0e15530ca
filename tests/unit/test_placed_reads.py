"""A read served in place (shuffled/net/streams.py, shuffled/buffers/shm.py): each buffer is copied into a
read slot of a real region and named in a BufferPlaced with the buffers queued behind it, as far as credit
and free slots allow and no further (credit never negative, sequence numbers consecutive, the backlog after
each); with no slot free a buffer goes as a BufferResponse in turn; every pool segment comes back at once;
a slot is lent until returned, and returning one not lent is refused without losing the others; a flush
copies about a socket's high watermark into shared memory and then lets other connections send.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffled.buffers import Chunk
from shuffled.buffers.pool import GlobalPool
from shuffled.buffers.shm import MappedRegion, ReadSlots, RegionLost, SharedRegion
from shuffled.net.sender import COPY_BYTES_PER_TURN, Sender
from shuffled.net.streams import MAX_BUFFERS_PER_PLACED, BufferResponseStream, PlacedBufferResponseStream
from shuffled.protocol.codec import decode_all
from shuffled.protocol.frames import BUFFER_PLACED_FIELDS, BufferKind, BufferPlaced, BufferResponse
from shuffled.protocol.integrity import checksum
from tests.aio import within
from tests.transports import InstantTransport
from tests.turns import until

SLOT = 4096
PUSH_SLOTS = 8


def _client_side(region: SharedRegion) -> MappedRegion:
    """The region as its client maps it (the read slots' file read-only)."""
    offer = region.offer()
    reads = (offer["reads"]["path"], offer["reads"]["size"]) if "reads" in offer else None
    return MappedRegion(offer["path"], offer["size"], SLOT, reads)


def _send_all(stream: PlacedBufferResponseStream) -> list[tuple[object, int]]:
    """Every frame the stream can send now, as the sender packs them, decoded, each with the read slots that
    were lent when it was packed."""
    out: list[tuple[object, int]] = []
    while stream.ready():
        item, seq, backlog, is_event = stream.pop()
        head = bytearray(1 << 12)
        lent = len(stream.slots.lent)
        n, buf = stream.pack(head, 0, item, seq, backlog, is_event)
        assert stream.credit >= 0
        frame = bytes(head[:n])
        if buf is not None:  # a BufferResponse's payload, lent to the transport
            frame += buf.data()
            buf.release()
        (decoded,) = decode_all(frame)
        out.append((decoded, lent))
    return out


@settings(max_examples=40, deadline=None)
@given(
    read_slots=st.integers(1, 90),
    sizes=st.lists(st.integers(1, SLOT), min_size=1, max_size=150),
    credits=st.lists(st.integers(1, 70), min_size=1, max_size=5),
    give_back=st.booleans(),
)
def test_buffers_go_in_place_while_credit_and_slots_last_then_through_the_socket(
    tmp_path_factory: pytest.TempPathFactory, read_slots: int, sizes: list[int], credits: list[int], give_back: bool
) -> None:
    directory = str(tmp_path_factory.mktemp("r"))
    region = SharedRegion(directory, PUSH_SLOTS, SLOT, read_slots=read_slots)
    mapped = _client_side(region)
    reads = region.reads
    assert reads is not None
    pool = GlobalPool(len(sizes) * SLOT, SLOT)
    stream = PlacedBufferResponseStream(9, 0, reads)
    payloads = [bytes((k * 7 + i) % 251 for i in range(n)) for k, n in enumerate(sizes)]
    for data in payloads:
        (buf,) = pool.try_take(1) or []
        buf.memory[: len(data)] = data
        buf.length, buf.refs = len(data), 1
        buf.set_recycler(pool.give)
        stream.push_data(Chunk(buf, checksum(data)))
    stream.end()
    got: list[bytes] = []
    for credit in [*credits, len(sizes)]:
        stream.add_credit(credit)
        for f, lent in _send_all(stream):
            if isinstance(f, BufferPlaced):
                assert f.receiver == 9
                entries = [
                    f.placed[i : i + BUFFER_PLACED_FIELDS] for i in range(0, len(f.placed), BUFFER_PLACED_FIELDS)
                ]
                assert 1 <= len(entries) <= MAX_BUFFERS_PER_PLACED
                for sequence, backlog, crc, slot, length in entries:
                    assert sequence == len(got) and backlog == len(sizes) - len(got) - 1
                    assert PUSH_SLOTS <= slot < PUSH_SLOTS + read_slots and slot in reads.lent
                    data = bytes(mapped.read_slot(slot)[:length])
                    assert crc == checksum(data)
                    got.append(data)
                    if give_back:
                        reads.returned([slot])
            else:
                assert isinstance(f, BufferResponse) and f.receiver == 9 and f.sequence == len(got)
                if f.kind is BufferKind.END_OF_PARTITION:
                    continue
                assert lent == read_slots, "through the socket only with no read slot free"
                got.append(bytes(f.payload))
        assert stream.credit >= 0
    assert got == payloads, "every buffer once, in order, whole"
    assert pool.used == 0, "a pool segment is free once its buffer is in a slot or sent"
    assert len(reads.lent) == (0 if give_back else min(read_slots, len(sizes)))
    region.close()


class _Transport(InstantTransport):
    """Logs (connection, bytes placed in shared memory by the frames written)."""

    def __init__(self, name: str, log: list[tuple[str, int]]) -> None:
        self.name = name
        self.log = log

    def writelines(self, parts: list[Any]) -> None:
        frames = decode_all(b"".join(bytes(p) for p in parts))
        placed = sum(f.placed[i + 4] for f in frames if isinstance(f, BufferPlaced) for i in range(0, len(f.placed), 5))
        self.log.append((self.name, placed))


def _queue(stream: BufferResponseStream, pool: GlobalPool, n: int, size: int) -> None:
    for k in range(n):
        (buf,) = pool.try_take(1) or []
        buf.memory[:size] = bytes([k % 251]) * size
        buf.length, buf.refs = size, 1
        buf.set_recycler(pool.give)
        stream.push_data(Chunk(buf, checksum(buf.data())))


@pytest.mark.parametrize(("big", "n"), [(32 << 10, 160), (512 << 10, 20)])
@within(30)
async def test_a_flush_copies_about_a_watermark_in_place_then_lets_other_connections_send(
    tmp_path: Path, big: int, n: int
) -> None:
    """A read in place puts bytes in shared memory and writes only small BufferPlaced frames, so the socket's
    watermarks never stop its flush: without a bound of its own one flush copied everything credit and free
    slots allowed (16 MiB by default) while every other connection of the daemon waited. With large segments
    one frame's copies alone could pass the bound, so a frame takes no more slots than it leaves."""
    region = SharedRegion(str(tmp_path), PUSH_SLOTS, big, read_slots=n)
    reads = region.reads
    assert reads is not None
    pool = GlobalPool((n + 8) * big, big)
    log: list[tuple[str, int]] = []
    placed = PlacedBufferResponseStream(1, n, reads)
    other = BufferResponseStream(2, 4)
    _queue(placed, pool, n, big)
    _queue(other, pool, 4, 100)
    a = Sender(_Transport("in place", log), tally=None)  # type: ignore[arg-type]
    b = Sender(_Transport("socket", log), tally=None)  # type: ignore[arg-type]
    a.wake(placed)
    b.wake(other)
    await until(lambda: not a.scheduler and not b.scheduler)
    first_other = next(i for i, (who, _) in enumerate(log) if who == "socket")
    before = sum(nbytes for who, nbytes in log[:first_other] if who == "in place")
    assert 0 < before < n * big, "the other connection sent before the read in place had placed everything"
    assert before <= COPY_BYTES_PER_TURN + big, "one turn's copies: a watermark's worth, a slot more at most"
    assert sum(nbytes for who, nbytes in log if who == "in place") == n * big, "and the rest at the next turns"
    assert len(reads.lent) == n and pool.used == 0
    region.close()


def test_a_frame_ends_at_an_event_and_gives_back_the_slots_it_took_for_more(tmp_path: Path) -> None:
    """A BufferPlaced takes its slots together, as many as credit and the queue allow; where an event comes
    first, the slots it did not fill are free again (not lent), and the data after the event goes in order."""
    region = SharedRegion(str(tmp_path), PUSH_SLOTS, SLOT, read_slots=8)
    reads = region.reads
    assert reads is not None
    pool = GlobalPool(3 * SLOT, SLOT)
    stream = PlacedBufferResponseStream(9, 5, reads)
    for item in [b"one", b"two", None, b"three"]:
        if item is None:
            stream.push_event(None)  # an event between data items: the frame ends there
            continue
        (buf,) = pool.try_take(1) or []
        buf.memory[: len(item)] = item
        buf.length, buf.refs = len(item), 1
        buf.set_recycler(pool.give)
        stream.push_data(Chunk(buf, checksum(item)))
    frames = [f for f, _ in _send_all(stream)]
    assert [type(f) for f in frames] == [BufferPlaced, BufferResponse, BufferPlaced]
    first, event, last = frames
    assert isinstance(first, BufferPlaced) and isinstance(event, BufferResponse) and isinstance(last, BufferPlaced)
    entries = [first.placed[i : i + BUFFER_PLACED_FIELDS] for i in range(0, len(first.placed), BUFFER_PLACED_FIELDS)]
    assert [e[0] for e in entries] == [0, 1] and event.sequence == 2 and last.placed[0] == 3, "in order"
    assert event.kind is BufferKind.END_OF_PARTITION
    assert len(reads.lent) == 3 and stream.credit == 2, "three buffers lent, three credits used, no slot lost"
    assert len(reads.take(8)) == 5, "the slot taken for a fourth buffer of the first frame is free again"
    assert pool.used == 0
    region.close()


def test_a_slot_is_lent_until_returned_and_a_wrong_return_keeps_the_rest(tmp_path: Path) -> None:
    region = SharedRegion(str(tmp_path), PUSH_SLOTS, SLOT, read_slots=3)
    reads = region.reads
    assert reads is not None
    taken = reads.take(4)
    assert sorted(taken) == [8, 9, 10], "three read slots, after the push slots"
    with pytest.raises(ValueError, match="slot 3 holds no served buffer"):
        reads.returned([8, 3, 9, 9])  # a push slot, and one slot twice
    assert reads.lent == {10}, "the slots it did hold are back, each once"
    assert set(reads.take(1) + reads.take(1)) == {8, 9} and reads.take(1) == []
    pushes, _ = region.take(PUSH_SLOTS)
    assert sorted(pushes) == list(range(PUSH_SLOTS)), "push slots are never lent to reads"
    region.close()
    assert reads.lent == set() and reads.take(1) == [], "a closed region lends nothing"
    assert os.listdir(tmp_path) == []


@pytest.fixture
def tmpfs_dir() -> Iterator[Path]:
    """A directory on tmpfs, where regions live: its files' block counts are their pages (on a disk
    filesystem they count the extent tree's blocks too, which move with how the file's blocks were placed)."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this host")
    path = Path(tempfile.mkdtemp(prefix="shuffled-test-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_free_slots_keep_their_pages_until_the_reads_were_idle_for_a_while(
    tmpfs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slots given back keep their pages for the next buffers (no page given back and faulted in anew per
    buffer), and a read takes the highest free ones (slots lent together then mostly follow each other);
    once the client has held no slot and been lent none for `IDLE` seconds, a connection whose reads once
    held many keeps the pages of `ReadSlots.WARM` of them only, the highest (without a timer, as soon as none
    is lent)."""
    now = [100.0]
    monkeypatch.setattr("shuffled.buffers.shm.time", SimpleNamespace(monotonic=lambda: now[0]))
    many = ReadSlots.WARM + 50
    region = SharedRegion(str(tmpfs_dir), PUSH_SLOTS, SLOT, read_slots=many)
    reads = region.reads
    assert reads is not None and region.path is not None
    due: list[tuple[float, Callable[[], None]]] = []
    reads.later = lambda seconds, trim: due.append((now[0] + seconds, trim))  # when it runs

    def pages() -> int:
        assert reads.file.path is not None
        return os.stat(reads.file.path).st_blocks * 512

    def run_due(at: float) -> None:
        (when, trim), *rest = due
        assert when == at and not rest
        due.clear()
        now[0] = when
        trim()

    held = reads.take(many)
    before = pages()
    assert len(held) == many and before >= many * SLOT
    reads.returned(held[1:])
    again = reads.take(many - 1)
    assert again == held[1:][::-1] and pages() == before, "taken again, the highest first, no new pages"
    reads.returned(again + held[:1])
    assert pages() == before and [at for at, _ in due] == [100 + ReadSlots.IDLE], "a trim is due, none done yet"
    now[0] += 2
    reads.returned(reads.take(1))  # lent one more 2 s later, and given it back
    run_due(100 + ReadSlots.IDLE)
    assert pages() == before, "lent one 3 s before: nothing goes yet"
    run_due(102 + ReadSlots.IDLE)
    assert before - pages() == (many - ReadSlots.WARM) * SLOT, "idle: all but the warm ones gave theirs back"
    kept = reads.take(ReadSlots.WARM)
    assert set(kept) == set(held[-ReadSlots.WARM :]), "the highest kept theirs"
    reads.later = None
    reads.returned(kept + reads.take(many))
    assert before - pages() == (many - ReadSlots.WARM) * SLOT and not due, "without a timer, as soon as none is lent"
    region.close()


def test_a_region_its_client_shrank_is_copied_from_and_into_without_a_signal(tmp_path: Path) -> None:
    """The client may shrink its region's file (it holds it open read-write). A daemon loading from or storing
    into its own mapping past the file's end dies of SIGBUS; through its descriptor, a placed group reads
    short (RegionLost, the slot free again) and a served buffer grows the file back. A buffer that cannot be
    put (here: the connection ended) is told once, for the daemon to end the connection."""
    region = SharedRegion(str(tmp_path), PUSH_SLOTS, SLOT, read_slots=2)
    mapped = _client_side(region)
    assert region.path is not None and region.reads is not None and region.reads.file.path is not None
    (slot,), _ = region.take(1)
    mapped.slot(slot)[:100] = b"p" * 100
    (lent,) = region.reads.take(1)
    region.reads.returned([lent])  # free, its pages kept for the next buffer
    os.truncate(region.path, 0)
    os.truncate(region.reads.file.path, 0)  # a client that makes its read slots' file writable
    pool = GlobalPool(SLOT, SLOT)
    (buf,) = pool.try_take(1) or []
    free = region.free
    with pytest.raises(RegionLost, match="was shrunk"):
        region.copy_out([(slot, buf.memory[:100])])
    assert region.free == free + 1, "the slot is free again"
    assert region.reads.take(1) == [lent], "a slot with pages first: no allocation grows the file before the put"
    region.reads.put([(lent, memoryview(b"s" * 300))])
    assert bytes(mapped.read_slot(lent)[:300]) == b"s" * 300, "the client reads what was put past the end"
    lost: list[RegionLost] = []
    region.reads.on_lost = lost.append
    region.close()
    region.reads.put([(lent, memoryview(b"t" * 10))])
    region.reads.put([(lent, memoryview(b"t" * 10))])
    assert len(lost) == 1 and "connection is closed" in str(lost[0])


@settings(max_examples=60, deadline=None)
@given(
    slots=st.lists(st.integers(0, 15), min_size=1, max_size=16, unique=True),
    short=st.lists(st.booleans(), min_size=16, max_size=16),
)
def test_buffers_put_together_land_each_in_its_slot_and_nothing_past_their_ends(
    tmp_path_factory: pytest.TempPathFactory, slots: list[int], short: list[bool]
) -> None:
    """Served buffers put in one call, slots in any order, some shorter than a slot: each slot holds its buffer,
    and the bytes after a short one are what the slot held (a write never takes a segment's tail, which may
    hold anyone's earlier buffer)."""
    region = SharedRegion(str(tmp_path_factory.mktemp("p")), PUSH_SLOTS, SLOT, read_slots=16)
    assert region.reads is not None and region.reads.file.path is not None
    with open(region.reads.file.path, "r+b") as f:  # what the slots held before
        f.write(b"\xee" * 16 * SLOT)
    mapped = _client_side(region)
    data = {PUSH_SLOTS + s: bytes([s + 1]) * (SLOT - 1 - s if short[s] else SLOT) for s in slots}
    region.reads.put([(s, memoryview(d)) for s, d in data.items()])
    for s in range(PUSH_SLOTS, PUSH_SLOTS + 16):
        held = bytes(mapped.read_slot(s))
        want = data.get(s, b"")
        assert held == want + b"\xee" * (SLOT - len(want)), f"slot {s}"
    region.close()


@settings(max_examples=60, deadline=None)
@given(
    slots=st.lists(st.integers(0, PUSH_SLOTS - 1), min_size=1, max_size=PUSH_SLOTS, unique=True),
    short=st.lists(st.booleans(), min_size=PUSH_SLOTS, max_size=PUSH_SLOTS),
)
def test_groups_copied_out_together_fill_each_its_segment_and_nothing_past_their_ends(
    tmp_path_factory: pytest.TempPathFactory, slots: list[int], short: list[bool]
) -> None:
    """Placed groups copied out in one call, slots in any order, some shorter than a slot: each segment holds
    its own slot's group and, past its length, what it held (a slot's tail is not the group's, and a
    segment's tail may be in use); every slot is free again."""
    region = SharedRegion(str(tmp_path_factory.mktemp("p")), PUSH_SLOTS, SLOT)
    mapped = _client_side(region)
    region.take(PUSH_SLOTS)  # all slots granted, as a writer holds them
    for s in range(PUSH_SLOTS):
        mapped.slot(s)[:] = bytes([s + 1]) * SLOT
    lengths = {s: SLOT - 1 - s if short[s] else SLOT for s in slots}
    into = {s: bytearray(b"\xee" * SLOT) for s in slots}
    region.copy_out([(s, memoryview(into[s])[: lengths[s]]) for s in slots])
    for s in slots:
        assert into[s] == bytes([s + 1]) * lengths[s] + b"\xee" * (SLOT - lengths[s]), f"slot {s}"
    assert region.free == len(slots)
    region.close()


def test_more_slots_in_a_row_than_one_system_call_takes_are_copied_all_the_same(tmp_path: Path) -> None:
    """A frame may name more full slots in a row than the kernel takes buffers in one `preadv`/`pwritev`
    (IOV_MAX, 1,024): they are copied in several calls, not refused as a region lost."""
    many = 1100
    region = SharedRegion(str(tmp_path), many, SLOT, read_slots=many)
    assert region.reads is not None
    mapped = _client_side(region)
    taken, _ = region.take(many)
    for s in taken:
        mapped.slot(s)[:] = s.to_bytes(2, "big") * (SLOT // 2)
    into = bytearray(many * SLOT)
    region.copy_out([(s, memoryview(into)[s * SLOT : (s + 1) * SLOT]) for s in taken])
    assert into == b"".join(s.to_bytes(2, "big") * (SLOT // 2) for s in range(many)) and region.free == many
    lent = region.reads.take(many)
    assert len(lent) == many
    region.reads.put([(s, memoryview(into)[(s - many) * SLOT : (s - many + 1) * SLOT]) for s in lent])
    assert all(bytes(mapped.read_slot(s)) == (s - many).to_bytes(2, "big") * (SLOT // 2) for s in lent)
    region.close()


def test_the_client_maps_the_read_slots_read_only(tmp_path: Path) -> None:
    """The read slots are a file of their own, without write bits, which the client maps read-only: a served
    buffer is the client's to read, never to change; the push slots stay writable."""
    region = SharedRegion(str(tmp_path), PUSH_SLOTS, SLOT, mode=0o660, read_slots=2)
    assert region.reads is not None and region.reads.file.path is not None and region.path is not None
    assert stat.S_IMODE(os.stat(region.reads.file.path).st_mode) == 0o440
    assert stat.S_IMODE(os.stat(region.path).st_mode) == 0o660
    mapped = _client_side(region)
    (lent,) = region.reads.take(1)
    region.reads.put([(lent, memoryview(b"r" * 10))])
    view = mapped.read_slot(lent)
    assert view.readonly and bytes(view[:10]) == b"r" * 10
    with pytest.raises(TypeError):
        view[0] = 1
    mapped.slot(0)[:1] = b"w"  # a push slot
    region.close()
    assert os.listdir(tmp_path) == [], "both names gone"
    told: list[str] = []
    region.reads.on_full = told.append
    assert region.reads.take(1) == [] and told == [], "closed: nothing lent, and no full tmpfs told of"
