"""A local client's push through shared memory, as its stream frames it (shuffled/net/streams.py): the groups
queued behind one go out in the same PushPlaced as far as credit allows and no further (credit never
negative, sequence numbers consecutive, a commit never overtaken), credit granted as PushCredit goes as
PushData in turn, and a push that ended hands out no slot.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffled.buffers.pool import GlobalPool
from shuffled.buffers.shm import MappedRegion
from shuffled.net.streams import MAX_PLACED_PER_FRAME, Payload, Placed, PlacedPushStream, PushEvent
from shuffled.protocol.codec import decode_all
from shuffled.protocol.frames import CommitMapOutput, PushData, PushPlaced

SLOT = 4096
SLOTS = 200


def _region(tmp_path: Path) -> MappedRegion:
    path = tmp_path / "region"
    path.write_bytes(bytes(SLOT * SLOTS))
    return MappedRegion(str(path), SLOT * SLOTS, SLOT)


def _send_all(stream: PlacedPushStream) -> list[object]:
    """Every frame the stream can send now, as the sender packs them, decoded."""
    out = bytearray()
    while stream.ready():
        item, seq, backlog, is_event = stream.pop()
        head = bytearray(1 << 12)
        n, buf = stream.pack(head, 0, item, seq, backlog, is_event)
        assert stream.credit >= 0
        out += head[:n]
        if buf is not None:  # a PushData's payload, lent to the transport
            out += buf.data()
            buf.release()
    return list(decode_all(bytes(out)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 80), min_size=1, max_size=6))
def test_queued_groups_share_frames_within_credit(tmp_path_factory: pytest.TempPathFactory, grants: list[int]) -> None:
    stream = PlacedPushStream(7, _region(tmp_path_factory.mktemp("r")))
    sent: list[int] = []  # the sequence numbers of the groups sent, in order
    slot_of: dict[int, int] = {}
    pushed = 0
    for granted in grants:
        stream.add_slots(list(range(granted)))
        while (slot := stream.take_slot()) is not None:  # the writer packs into every slot it has
            stream.push_data(Placed(slot, 100 + pushed, pushed))
            slot_of[pushed] = slot
            pushed += 1
        frames = _send_all(stream)
        for f in frames:
            assert isinstance(f, PushPlaced) and f.writer == 7
            entries = [f.placed[i : i + 4] for i in range(0, len(f.placed), 4)]
            assert 1 <= len(entries) <= MAX_PLACED_PER_FRAME
            for sequence, crc, slot, length in entries:
                assert (crc, slot, length) == (sequence, slot_of[sequence], 100 + sequence)
                sent.append(sequence)
        assert stream.credit == 0 and stream.queued == 0
    assert sent == list(range(pushed)), "every group once, in order"
    stream.push_event(PushEvent.COMMIT)
    (commit,) = _send_all(stream)
    assert commit == CommitMapOutput(7, pushed)


def test_a_group_queued_without_credit_waits_and_a_commit_is_not_overtaken(tmp_path: Path) -> None:
    stream = PlacedPushStream(3, _region(tmp_path))
    stream.add_slots([5, 6])
    for sequence in range(3):  # the third has no credit yet
        stream.push_data(Placed(sequence, 10, 0))
    stream.push_event(PushEvent.COMMIT)
    (first,) = _send_all(stream)
    assert first == PushPlaced(3, [0, 0, 0, 10, 1, 0, 1, 10])
    assert stream.credit == 0 and stream.queued == 1
    stream.add_slots([9])
    placed, commit = _send_all(stream)
    assert placed == PushPlaced(3, [2, 0, 2, 10]) and commit == CommitMapOutput(3, 3)


def test_a_push_that_ended_hands_out_no_slot(tmp_path: Path) -> None:
    """Its slots are the daemon's again once it failed or ended: a group written into one could overwrite
    another push's."""
    stream = PlacedPushStream(1, _region(tmp_path))
    stream.add_slots([0, 1, 2])
    assert stream.take_slot() == 0
    stream.shutdown()
    assert stream.take_slot() is None


def test_credit_granted_as_push_credit_goes_as_push_data_in_sequence(tmp_path: Path) -> None:
    """A daemon whose tmpfs had no room grants PushCredit on the connection (§6.3): the writer's group in a
    segment of its pool goes as PushData, between PushPlaced frames, its sequence number in turn, and a
    PushPlaced never takes a PushData's group into its entries."""
    stream = PlacedPushStream(4, _region(tmp_path))
    pool = GlobalPool(4 * SLOT, SLOT)
    stream.add_slots([3])
    stream.add_credit(1)
    stream.add_slots([8])
    assert stream.take_slot() == 3 and stream.take_plain() and not stream.take_plain()
    stream.push_data(Placed(3, 20, 0))
    (buf,) = pool.try_take(1) or []
    buf.set_recycler(pool.give)  # as the client's session lends it to a writer
    buf.memory[:5] = b"group"
    buf.length = 5
    stream.push_data(Payload(buf))
    assert stream.take_slot() == 8
    stream.push_data(Placed(8, 30, 0))
    first, data, last = _send_all(stream)
    assert first == PushPlaced(4, [0, 0, 3, 20])
    assert isinstance(data, PushData) and data.sequence == 1 and bytes(data.payload) == b"group"
    assert last == PushPlaced(4, [2, 0, 8, 30])
    assert stream.credit == 0 and pool.used == 0, "the segment is back in the pool once sent"
