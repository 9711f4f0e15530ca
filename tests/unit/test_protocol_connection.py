"""The sans-IO protocol connection: the handshake, the stream table's rules, and two of them talking.

The rule-based test wires a client and a daemon `ProtocolConnection` together in
memory and lets Hypothesis interleave reads (with credit granted as buffers are
consumed), cancels, pushes (committed or aborted), admin calls and the moving of
bytes either way. After every step, and at every quiet point, it checks what
must always hold: credit never negative on either side, the credit a sender
holds equal to what its reader granted minus what arrived, every ended read
delivered exactly what was served in order, every commit counted every push,
and, when nothing is in flight, both stream tables agree.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shuffled.protocol.codec import (
    encode,
    encode_abort,
    encode_add_credit,
    encode_admin_response,
    encode_buffer_response,
    encode_cancel,
    encode_commit_ack,
    encode_error,
    encode_push_data,
)
from shuffled.protocol.connection import Kind, Limits, Side
from shuffled.protocol.credit import OutboundStream
from shuffled.protocol.errors import (
    AuthFailed,
    CreditViolation,
    ErrorCode,
    InvalidRequest,
    MapOutputStateError,
    ProtocolError,
    StreamStateError,
)
from shuffled.protocol.events import (
    Aborted,
    AbortRequested,
    AdminAnswered,
    AdminRequested,
    BufferArrived,
    CommitRequested,
    Committed,
    ConnectionFailed,
    CreditAdded,
    Event,
    HandshakeDone,
    HelloReceived,
    PushCredited,
    PushDataArrived,
    PushOpened,
    PushOutOfTurn,
    ReadCancelled,
    ReadRequested,
    StreamFailed,
    StreamRefused,
)
from shuffled.protocol.frames import (
    REPLICA,
    AddCredit,
    BufferKind,
    CommitMapOutput,
    Hello,
    OpenMapOutput,
    PartitionRequest,
    PushCredit,
    Role,
)
from shuffled.protocol.streams import TRANSITIONS, State, Step, Stream, StreamTable
from tests.protocol_pair import (
    ABORT,
    ACCEPTOR,
    COMMIT,
    DIALER,
    MemoryConnection,
    Pair,
    landing,
    send_buffers,
    send_pushes,
)

NODE = "198.18.0.1:7337"


def _pair(dialer_secret: bytes | None = None, dialer_role: Role = Role.CLIENT, limits: Limits | None = None) -> Pair:
    return Pair(
        MemoryConnection(Side.DIALER, dialer_role, secret=dialer_secret, who="the daemon"),
        MemoryConnection(Side.ACCEPTOR, Role.DAEMON, limits=limits, who="the dialer"),
    )


def _open(pair: Pair, secret: bytes | None = None) -> None:
    pair.dialer.start({"name": "test"})
    (hello,) = pair.deliver(DIALER)
    assert isinstance(hello, HelloReceived)
    if secret is not None:
        pair.acceptor.challenge(secret)
        assert pair.deliver(ACCEPTOR) == []
        pair.deliver(DIALER)
    pair.acceptor.accept({"node": NODE})
    (done,) = pair.deliver(ACCEPTOR)
    assert done == HandshakeDone({"node": NODE}) and pair.dialer.is_open and pair.acceptor.is_open


def _request(receiver: int, buffers: int = 1, credit: int = 1) -> PartitionRequest:
    return PartitionRequest(receiver, credit, "app", 1, 0, buffers, {"": [1]})


# -- the handshake


def test_the_same_secret_on_both_sides_opens_the_connection() -> None:
    _open(_pair(b"s3cret"), b"s3cret")


@pytest.mark.parametrize(
    ("dialer", "acceptor", "fails", "why"),
    [
        (b"mine", b"theirs", DIALER, "could not prove"),  # the dialer checks the acceptor's proof first
        (None, b"theirs", ACCEPTOR, "has no secret configured"),
        (b"mine", None, DIALER, "does not authenticate"),
    ],
)
def test_a_secret_mismatch_fails_the_side_that_finds_it(
    dialer: bytes | None, acceptor: bytes | None, fails: str, why: str
) -> None:
    pair = _pair(dialer)
    pair.dialer.start({})
    pair.deliver(DIALER)
    if acceptor is not None:
        pair.acceptor.challenge(acceptor)
    else:
        pair.acceptor.accept({})
    with pytest.raises(AuthFailed, match=why):
        pair.deliver(ACCEPTOR)
        pair.deliver(DIALER)
    assert pair.side(fails).handshake.phase.value != "open" or fails == DIALER


def test_the_acceptor_wants_hello_first_and_nothing_before_it_answers() -> None:
    acceptor = MemoryConnection(Side.ACCEPTOR, Role.DAEMON)
    with pytest.raises(ProtocolError, match="first frame must be Hello"):
        acceptor.receive_data(encode(_request(1)))
    acceptor = MemoryConnection(Side.ACCEPTOR, Role.DAEMON)
    with pytest.raises(ProtocolError, match="before the handshake was answered"):
        acceptor.receive_data(encode(Hello(Role.CLIENT, info={})) + encode(_request(1)))


def test_a_refused_handshake_is_a_connection_failure_for_the_dialer() -> None:
    pair = _pair()
    pair.dialer.start({})
    pair.deliver(DIALER)
    events = pair.dialer.receive_data(pair.acceptor.fail(InvalidRequest("segment sizes differ")))
    assert len(events) == 1 and isinstance(events[0], ConnectionFailed)
    assert events[0].error.code == ErrorCode.INVALID_REQUEST and not pair.dialer.is_open


# -- the stream table


def test_stream_ids_are_never_zero_nor_reused_while_open() -> None:
    pair = _pair()
    _open(pair)
    pair.dialer.request_read(_request(1), landing)
    pair.deliver(DIALER)
    with pytest.raises(ProtocolError, match="already in use"):
        pair.acceptor.receive_data(encode(_request(1)))
    with pytest.raises(ProtocolError, match="reserved"):
        pair.acceptor.receive_data(encode(_request(0)))


def test_the_dialer_skips_ids_still_open_after_the_counter_wraps() -> None:
    conn = MemoryConnection(Side.DIALER, Role.CLIENT)
    conn.request_read(_request(1), landing)
    conn.streams._next_id = 0xFFFFFFFF
    assert [conn.streams.new_id(), conn.streams.new_id()] == [0xFFFFFFFF, 2]


def test_limits_refuse_one_stream_and_keep_the_connection() -> None:
    pair = _pair(limits=Limits(streams=2, pushes=1, admin=1))
    _open(pair)
    for rid in (1, 2, 3):
        pair.dialer.request_read(_request(rid), landing)
    refused = pair.deliver(DIALER)
    assert [type(e) for e in refused] == [ReadRequested, ReadRequested, StreamRefused]
    (failed,) = pair.deliver(ACCEPTOR)
    assert isinstance(failed, StreamFailed) and failed.stream == 3 and failed.error.code == ErrorCode.LIMIT_EXCEEDED
    pair.acceptor.send_error(1, InvalidRequest("done"))  # both reads end: room for two streams, but one push
    pair.acceptor.read_finished(2)
    pair.deliver(ACCEPTOR)
    for wid in (4, 5):
        pair.dialer.open_push(OpenMapOutput(wid, "app", 1, 0, wid, 1), OutboundStream(wid, 0))
    pair.dialer.request_admin("stats", {})
    pair.dialer.request_admin("stats", {})
    events = pair.deliver(DIALER)
    assert [type(e) for e in events] == [PushOpened, StreamRefused, AdminRequested, StreamRefused]
    assert "max-pushes-per-connection (1)" in events[1].error.message  # type: ignore[union-attr]
    assert "max-admin-per-connection (1)" in events[3].error.message  # type: ignore[union-attr]
    assert pair.acceptor.is_open


def test_a_client_is_not_asked_for_data_and_only_clients_push() -> None:
    pair = _pair()
    _open(pair)
    with pytest.raises(ProtocolError, match="not expected by a client"):
        pair.dialer.receive_data(encode(_request(1)))
    peers = _pair(dialer_role=Role.DAEMON)
    _open(peers)
    peers.dialer.open_push(OpenMapOutput(1, "app", 1, 0, 1, 1), OutboundStream(1, 0))
    with pytest.raises(ProtocolError, match="only clients push"):
        peers.deliver(DIALER)


# -- replica pushes between daemons (§7.1 features, §7.8)

PRIMARY = "198.18.0.2:7337"


def _peers(dialer: object, acceptor: object) -> Pair:
    """Two daemon ends, each offering `features` (any value, as a peer might send it) in its Hello/HelloAck."""
    pair = _pair(dialer_role=Role.DAEMON)
    pair.dialer.start({"node": PRIMARY, "features": dialer})
    pair.deliver(DIALER)
    pair.acceptor.accept({"node": NODE, "features": acceptor})
    pair.deliver(ACCEPTOR)
    assert pair.dialer.is_open and pair.acceptor.is_open
    return pair


@pytest.mark.parametrize(
    ("dialer", "acceptor", "agreed"),
    [
        (["replica", "x"], ["y", "replica"], {"replica"}),
        (["replica"], [], set()),
        (["replica"], None, set()),
        ("replica", ["replica"], set()),  # not a list: offers nothing
        ({"replica": True}, ["replica"], set()),
        (["replica", 7], ["replica", 7], {"replica"}),  # non-strings are not features
    ],
)
def test_the_agreed_features_are_what_both_ends_offered(dialer: object, acceptor: object, agreed: set[str]) -> None:
    pair = _peers(dialer, acceptor)
    assert pair.dialer.features == pair.acceptor.features == agreed


def test_a_client_offers_no_features_and_agrees_on_none() -> None:
    pair = _pair()
    _open(pair)
    assert pair.dialer.features == pair.acceptor.features == frozenset()


def _replica_open(writer: int, replica_of: str | None = PRIMARY) -> OpenMapOutput:
    return OpenMapOutput(writer, "app", 1, 0, writer, 2, replicas=2, replica_of=replica_of, app_key="")


@pytest.mark.parametrize("opener", [DIALER, ACCEPTOR])
def test_a_replica_push_runs_between_daemons_that_agreed_on_it(opener: str) -> None:
    """Either end may push to the other: the answers (PushCredit, CommitAck, AbortAck) then reach a daemon."""
    pair = _peers(["replica"], ["replica"])
    primary, replica = pair.side(opener), pair.side(ACCEPTOR if opener == DIALER else DIALER)
    served = ACCEPTOR if opener == DIALER else DIALER
    out: OutboundStream[Any] = OutboundStream(1, 0)
    primary.open_push(_replica_open(1), out)
    abort: OutboundStream[Any] = OutboundStream(2, 0)
    primary.open_push(_replica_open(2), abort)
    opened = pair.deliver(opener)
    assert opened == [PushOpened(_replica_open(1)), PushOpened(_replica_open(2))]
    for writer in (1, 2):
        replica.accept_push(writer, landing)
        replica.grant_push_credit(writer, 2)
    assert pair.deliver(served) == [PushCredited(1, 2), PushCredited(2, 2)]
    out.push_data(b"copy")
    out.push_event(COMMIT)
    abort.push_event(ABORT)
    send_pushes(primary, out, 1)
    send_pushes(primary, abort, 2)
    events = pair.deliver(opener)
    assert [type(e) for e in events] == [PushDataArrived, CommitRequested, AbortRequested]
    replica.ack_commit(1, [0, 4])
    replica.ack_abort(2)
    assert pair.deliver(served) == [Committed(1, [0, 4]), Aborted(2)]
    assert not primary.streams.own and not replica.streams.theirs


@pytest.mark.parametrize(
    ("dialer", "acceptor", "replica_of"),
    [
        ([], ["replica"], PRIMARY),  # the dialer offered nothing
        (["replica"], [], PRIMARY),  # the acceptor did not agree
        (["replica"], ["replica"], None),  # agreed, but not a replica push: daemons never push their own output
    ],
)
def test_a_daemon_push_without_the_feature_or_replica_of_is_fatal(
    dialer: list[str], acceptor: list[str], replica_of: str | None
) -> None:
    pair = _peers(dialer, acceptor)
    pair.dialer.open_push(_replica_open(1, replica_of), OutboundStream(1, 0))
    with pytest.raises(ProtocolError, match="only clients push") as info:
        pair.deliver(DIALER)
    assert info.value.code == ErrorCode.PROTOCOL


def test_push_answers_reach_a_daemon_only_with_the_feature() -> None:
    without = _peers([], [])
    with pytest.raises(ProtocolError, match="PushCredit is not expected by a daemon"):
        without.acceptor.receive_data(encode(PushCredit(1, 2)))
    agreed = _peers(["replica"], ["replica"])
    assert agreed.acceptor.receive_data(encode(PushCredit(1, 2))) == []  # a stream it never opened: ignored


def test_a_daemon_is_never_sent_answers_to_pushes() -> None:
    pair = _pair()
    _open(pair)
    with pytest.raises(ProtocolError, match="CommitAck is not expected by a daemon"):
        pair.acceptor.receive_data(encode_commit_ack(1, [3]))


@pytest.mark.parametrize(
    "frame",
    [encode_buffer_response(1, 0, 0, BufferKind.DATA, b"x"), encode_admin_response(1, {})],
    ids=["BufferResponse", "AdminResponse"],
)
def test_a_daemon_is_never_sent_answers_by_a_client(frame: bytes) -> None:
    """PROTOCOL.md §7: these go daemon to client or daemon to daemon; from a client they are fatal, not ignored."""
    pair = _pair()
    _open(pair)
    with pytest.raises(ProtocolError, match="is not expected from a client") as info:
        pair.acceptor.receive_data(frame)
    assert info.value.code == ErrorCode.PROTOCOL


def test_a_peer_daemon_may_answer_a_daemon() -> None:
    """The same frames from a peer daemon are answers to its own streams (here none is open: dropped)."""
    pair = _peers([], [])
    assert pair.acceptor.receive_data(encode_admin_response(1, {})) == []
    assert pair.acceptor.receive_data(encode_buffer_response(1, 0, 0, BufferKind.DATA, b"x")) == []


def test_an_error_on_a_stream_from_a_client_is_fatal() -> None:
    """A client serves no stream, so an Error on one (only a stream's server sends it, §7) breaks the rules."""
    pair = _pair()
    _open(pair)
    with pytest.raises(ProtocolError, match="Error on a stream is not expected from a client"):
        pair.acceptor.receive_data(encode_error(1, ErrorCode.INTERNAL, "x"))


@pytest.mark.parametrize("frame", [encode_add_credit(1, 2), encode_cancel(1)], ids=["AddCredit", "Cancel"])
def test_read_frames_naming_a_push_stream_are_fatal(frame: bytes) -> None:
    """AddCredit and CancelPartitionRequest for a stream that ended are dropped; naming an open push is wrong."""
    pair = _pair()
    _open(pair)
    pair.dialer.open_push(OpenMapOutput(1, "app", 1, 0, 1, 1), OutboundStream(1, 0))
    pair.deliver(DIALER)
    with pytest.raises(ProtocolError, match="which is not a read"):
        pair.acceptor.receive_data(frame)
    ended = _pair()
    _open(ended)
    assert ended.acceptor.receive_data(frame) == []  # a stream that ended (or was never opened): dropped


def test_push_data_behind_its_open_in_one_read_is_data_before_credit() -> None:
    pair = _pair()
    _open(pair)
    pair.dialer.open_push(OpenMapOutput(1, "app", 1, 0, 1, 1), OutboundStream(1, 0))
    pair.dialer.send(encode_push_data(1, 0, b"too early"))
    with pytest.raises(CreditViolation, match="before credit was granted"):
        pair.deliver(DIALER)


def test_a_step_outside_its_streams_table_is_refused_whichever_it_is() -> None:
    """The tables are the whole lifecycle of a stream: every pair of state and step they lack raises."""
    for (kind, theirs), table in TRANSITIONS.items():
        for state in State:
            for step in Step:
                streams = StreamTable(Limits())
                side = streams.theirs if theirs else streams.own
                side[5] = Stream(kind, state=state, moves=table)
                if (state, step) in table:
                    moved = streams.step(side, 5, kind, step)
                    assert moved is not None and moved.state is table[state, step]
                else:
                    with pytest.raises(StreamStateError, match=f"{step.name.lower()} is not allowed"):
                        streams.step(side, 5, kind, step)


def test_credit_for_a_read_whose_request_waits_is_kept_until_it_is_served() -> None:
    """A daemon may hold a request back (its backlog, serving/backlog.py) while the reader's AddCredit for
    it arrives: that credit is the sender's once the read is served, not lost."""
    pair = _pair()
    _open(pair)
    pair.dialer.request_read(_request(1, credit=1), landing)
    pair.dialer.add_credit(1, 2)
    requested, added = pair.deliver(DIALER)
    assert isinstance(requested, ReadRequested) and added == CreditAdded(1, 2)
    out: OutboundStream[Any] = OutboundStream(1, 1)
    pair.acceptor.accept_read(1, out)
    assert out.credit == 3


def test_a_commit_or_abort_out_of_turn_fails_that_push_and_the_connection_lives() -> None:
    """§12.2: before the first PushCredit, or after its commit, a writer's commit is not its turn; an abort
    after the commit is (a writer giving up waiting), and PushData behind either is dropped."""
    pair = _pair()
    _open(pair)
    pair.dialer.open_push(OpenMapOutput(1, "app", 1, 0, 1, 1), OutboundStream(1, 0))
    pair.deliver(DIALER)
    pair.dialer.send(encode(CommitMapOutput(1, 0)))
    (early,) = pair.deliver(DIALER)
    assert isinstance(early, PushOutOfTurn) and isinstance(early.error, MapOutputStateError)
    assert "before the daemon granted push credit" in early.error.message
    pair.dialer.open_push(OpenMapOutput(2, "app", 1, 0, 2, 1), OutboundStream(2, 0))
    pair.deliver(DIALER)
    pair.acceptor.accept_push(2, landing)
    pair.acceptor.grant_push_credit(2, 1)
    pair.deliver(ACCEPTOR)
    pair.dialer.send(encode(CommitMapOutput(2, 0)))
    pair.dialer.send(encode(CommitMapOutput(2, 0)))
    pair.dialer.send(encode_abort(2))
    commit, again, abort = pair.deliver(DIALER)
    assert commit == CommitRequested(2, 0) and abort == AbortRequested(2)
    assert isinstance(again, PushOutOfTurn) and "after its CommitMapOutput" in again.error.message
    pair.dialer.send(encode_push_data(2, 0, b"late"))  # a writer that gave up had it on its way: dropped
    assert pair.deliver(DIALER) == []
    assert pair.acceptor.streams.theirs[2].state is State.ENDING


def test_frames_for_ended_streams_are_dropped_quietly() -> None:
    pair = _pair()
    _open(pair)
    pair.dialer.request_read(_request(1), landing)
    pair.deliver(DIALER)
    pair.dialer.cancel_read(1)
    assert pair.deliver(DIALER) == [ReadCancelled(1)]
    assert pair.acceptor.receive_data(encode(AddCredit(1, 1))) == []  # credit already on its way
    late = send_buffers_once(pair.acceptor, 1, b"late")
    assert pair.dialer.receive_data(late) == [] and pair.dialer.streams.own == {}


def send_buffers_once(conn: MemoryConnection, receiver: int, payload: bytes) -> bytes:
    out: OutboundStream[Any] = OutboundStream(receiver, 1)
    out.push_data(payload)
    send_buffers(conn, out, receiver)
    return conn.data_to_send()


# -- two parties


class TwoParties(RuleBasedStateMachine):
    """A client reading and pushing through a daemon that serves and stores, bytes moved at random times."""

    def __init__(self) -> None:
        super().__init__()
        self.pair = _pair(limits=Limits(streams=6, pushes=3, admin=2))
        _open(self.pair)
        self.client = self.pair.dialer
        self.daemon = self.pair.acceptor
        # the client's side
        self.reads: dict[int, list[bytes]] = {}  # open reads: what arrived
        self.consumed: dict[int, int] = {}  # buffers consumed, whose credit is not yet granted again
        self.granted: dict[int, int] = {}  # credit granted in all
        self.arrived: dict[int, int] = {}
        self.pushes: dict[int, OutboundStream[Any]] = {}
        self.pushed: dict[int, list[bytes]] = {}
        self.finished = 0
        # the daemon's side
        self.served: dict[int, OutboundStream[Any]] = {}
        self.serving: dict[int, list[bytes]] = {}
        self.stored: dict[int, list[bytes]] = {}

    # -- the client acts

    @rule(buffers=st.integers(0, 5), credit=st.integers(1, 3))
    def open_read(self, buffers: int, credit: int) -> None:
        rid = self.client.streams.new_id()
        self.client.request_read(_request(rid, buffers, credit), landing)
        self.reads[rid] = []
        self.consumed[rid] = 0
        self.granted[rid] = credit
        self.arrived[rid] = 0

    @precondition(lambda self: any(self.consumed.values()))
    @rule(data=st.data())
    def consume_and_grant(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(r for r, n in self.consumed.items() if n)))
        n = data.draw(st.integers(1, self.consumed[rid]))
        self.consumed[rid] -= n
        self.granted[rid] += n
        self.client.add_credit(rid, n)

    @precondition(lambda self: bool(self.reads))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.reads)))
        self.client.cancel_read(rid)
        self._forget_read(rid)

    @rule(chunks=st.lists(st.binary(min_size=1, max_size=40), max_size=4))
    def open_push(self, chunks: list[bytes]) -> None:
        wid = self.client.streams.new_id()
        out: OutboundStream[Any] = OutboundStream(wid, 0)
        self.client.open_push(OpenMapOutput(wid, "app", 1, 0, wid, 2), out)
        for chunk in chunks:
            out.push_data(chunk)
        self.pushes[wid] = out
        self.pushed[wid] = chunks

    @precondition(lambda self: any(not o._items or not o._items[-1][0] for o in self.pushes.values()))
    @rule(data=st.data(), commit=st.booleans())
    def finish_push(self, data: st.DataObject, commit: bool) -> None:
        open_ = sorted(w for w, o in self.pushes.items() if not o._items or not o._items[-1][0])
        wid = data.draw(st.sampled_from(open_))
        self.pushes[wid].push_event(COMMIT if commit else ABORT)

    @rule()
    def admin(self) -> None:
        self.client.request_admin("stats", {})

    # -- bytes move

    @rule()
    def client_sends(self) -> None:
        for wid, out in list(self.pushes.items()):
            send_pushes(self.client, out, wid)
        self.pair.deliver(DIALER, self._daemon_handles)

    @rule()
    def daemon_sends(self) -> None:
        self.pair.deliver(ACCEPTOR, self._client_handles)

    def _daemon_handles(self, event: Event) -> None:
        daemon = self.daemon
        match event:
            case ReadRequested(req):
                out: OutboundStream[Any] = OutboundStream(req.receiver, req.credit)
                daemon.accept_read(req.receiver, out)
                payloads = [bytes([req.receiver % 251, i]) * (i + 1) for i in range(req.end)]
                for p in payloads:
                    out.push_data(p)
                out.push_event(None)
                self.served[req.receiver] = out
                self.serving[req.receiver] = payloads
                self._serve(req.receiver)
            case CreditAdded(rid):
                self._serve(rid)
            case ReadCancelled(rid):
                self.served.pop(rid).close()
            case PushOpened(req):
                daemon.accept_push(req.writer, landing)
                daemon.grant_push_credit(req.writer, 2)
                self.stored[req.writer] = []
            case PushDataArrived(frame):
                self.stored[frame.writer].append(bytes(frame.payload))
                daemon.grant_push_credit(frame.writer, 1)
            case CommitRequested(writer, pushes):
                assert pushes == len(self.stored[writer])
                daemon.ack_commit(writer, [sum(len(b) for b in self.stored.pop(writer))])
            case AbortRequested(writer):
                self.stored.pop(writer)
                daemon.ack_abort(writer)
            case AdminRequested(req):
                daemon.answer_admin(req.request, {"node": NODE})
            case StreamRefused():
                pass
            case _:
                raise AssertionError(f"the daemon did not expect {event}")

    def _serve(self, rid: int) -> None:
        out = self.served.get(rid)
        if out is not None and send_buffers(self.daemon, out, rid):
            del self.served[rid]

    def _client_handles(self, event: Event) -> None:
        match event:
            case BufferArrived(frame) if frame.kind is BufferKind.DATA:
                self.reads[frame.receiver].append(bytes(frame.payload))
                self.consumed[frame.receiver] += 1
                self.arrived[frame.receiver] += 1
            case BufferArrived(frame):
                rid = frame.receiver
                assert self.reads[rid] == self.serving.pop(rid), "a read delivered other bytes than were served"
                self.finished += 1
                self._forget_read(rid)
            case PushCredited():
                pass
            case Committed(writer, lengths):
                assert lengths == [sum(len(b) for b in self.pushed.pop(writer))]
                del self.pushes[writer]
            case Aborted(writer):
                del self.pushes[writer], self.pushed[writer]
            case AdminAnswered(_, result):
                assert result == {"node": NODE}
            case StreamFailed(stream, error):
                assert error.code == ErrorCode.LIMIT_EXCEEDED
                if stream in self.reads:
                    self._forget_read(stream)
                else:
                    self.pushes.pop(stream, None)
                    self.pushed.pop(stream, None)
            case _:
                raise AssertionError(f"the client did not expect {event}")

    def _forget_read(self, rid: int) -> None:
        for table in (self.reads, self.consumed, self.granted, self.arrived):
            table.pop(rid, None)

    # -- what always holds

    @invariant()
    def credit_is_never_negative(self) -> None:
        assert all(out.credit >= 0 for out in self.served.values())
        assert all(out.credit >= 0 for out in self.pushes.values())

    @invariant()
    def a_sender_holds_what_its_reader_granted_minus_what_arrived(self) -> None:
        if self.pair.dialer.outbox or self.pair.acceptor.outbox:
            return  # credit or buffers still on their way
        for rid, out in self.served.items():
            if rid in self.granted:
                assert out.credit == self.granted[rid] - self.arrived[rid]

    @invariant()
    def every_stream_is_in_a_state_its_table_reaches(self) -> None:
        for conn in (self.client, self.daemon):
            for table, theirs in ((conn.streams.own, False), (conn.streams.theirs, True)):
                for stream in table.values():
                    assert stream.state in {State.OPEN, *TRANSITIONS[stream.kind, theirs].values()}

    @invariant()
    def when_quiet_both_tables_agree(self) -> None:
        if self.pair.dialer.outbox or self.pair.acceptor.outbox:
            return
        own = {sid for sid, s in self.client.streams.own.items() if s.kind is not Kind.ADMIN}
        assert own == set(self.daemon.streams.theirs)
        for sid, stream in self.daemon.streams.theirs.items():
            if stream.kind is Kind.PUSH:  # the writer knows it has credit exactly when the daemon granted it
                assert (stream.state is State.CREDITED) == (self.client.streams.own[sid].state is State.CREDITED)
        admin = sum(1 for s in self.client.streams.own.values() if s.kind is Kind.ADMIN)
        assert admin == self.daemon.streams.admin_running == 0

    def teardown(self) -> None:
        """Everything ends once bytes stop: reads with their credit, pushes with theirs."""
        for _ in range(50):
            for rid in list(self.consumed):
                if self.consumed[rid]:
                    self.granted[rid] += self.consumed[rid]
                    self.client.add_credit(rid, self.consumed[rid])
                    self.consumed[rid] = 0
            for out in self.pushes.values():
                if not out._items or not out._items[-1][0]:
                    out.push_event(COMMIT)
            self.client_sends()
            self.daemon_sends()
            if not (self.reads or self.pushes or self.client.streams.own):
                break
        assert not self.reads and not self.pushes and not self.client.streams.own and not self.daemon.streams.theirs


TwoParties.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_two_parties = TwoParties.TestCase


def test_an_abandoned_replica_push_is_aborted_and_its_late_answers_are_dropped() -> None:
    """`abort_push` (a primary giving up a replica push, §12.4): the replica is told at once, and the
    answers still on their way for the forgotten push raise no event."""
    peers = _pair(dialer_role=Role.DAEMON)
    peers.dialer.start({"node": "198.18.0.2:7337", "features": [REPLICA]})
    peers.deliver(DIALER)
    peers.acceptor.accept({"node": NODE, "features": [REPLICA]})
    peers.deliver(ACCEPTOR)
    assert peers.dialer.features == peers.acceptor.features == {REPLICA}
    peers.dialer.open_push(OpenMapOutput(1, "app", 1, 0, 1, 1, replica_of="198.18.0.2:7337"), OutboundStream(1, 0))
    (opened,) = peers.deliver(DIALER)
    assert isinstance(opened, PushOpened) and opened.request.replica_of == "198.18.0.2:7337"
    peers.acceptor.accept_push(1, landing)
    peers.acceptor.grant_push_credit(1, 2)
    assert peers.deliver(ACCEPTOR) == [PushCredited(1, 2)]
    peers.dialer.abort_push(1)
    assert peers.deliver(DIALER) == [AbortRequested(1)] and peers.dialer.streams.own == {}
    peers.acceptor.grant_push_credit(1, 1)
    peers.acceptor.ack_abort(1)
    assert peers.deliver(ACCEPTOR) == []
