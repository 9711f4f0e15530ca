"""Records proto/vectors/conversations.json: whole conversations between two protocol connections.

Where frames.json pins single frames, a conversation pins what the two ends of a
connection say to each other and in which order: the handshake with and without
a secret, a read under credit, a push committed and one aborted, admin calls,
a cancelled read, refusals, and a peer link where both daemons read. Each is
scripted against two `shuffled.protocol.connection.ProtocolConnection`s wired
together in memory (tests/protocol_pair.py), with fixed nonces so the bytes are
stable. Every step is the bytes one side sent plus the events the other side
made of them.

tests/unit/test_conversations.py checks this file against the script, and the
JVM client's `ConversationCheck` replays it through its own decoder, encoder and
authentication (the stream rules included).

    python proto/vectors/record.py           # rewrite conversations.json
    python proto/vectors/record.py --check   # exit 1 if conversations.json is not what this builds
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[2]))

from shuffled.protocol import auth
from shuffled.protocol.codec import encode, encode_abort, encode_push_data
from shuffled.protocol.connection import Limits, Side
from shuffled.protocol.credit import OutboundStream
from shuffled.protocol.errors import AuthFailed, PartitionNotFound, ProtocolError, ShuffledError
from shuffled.protocol.events import Event, PushOutOfTurn
from shuffled.protocol.frames import OpenMapOutput, PartitionRequest, Role
from shuffled.protocol.packed import group_bytes
from tests.protocol_pair import ACCEPTOR, COMMIT, DIALER, MemoryConnection, Pair, landing, send_buffers, send_pushes

OUT = Path(__file__).with_name("conversations.json")
SECRET = b"cluster-secret-for-the-vectors"
NODE = "198.18.0.1:7337"
PEER = "198.18.0.2:7337"
ACK = {"node": NODE, "segment_size": 32768}


@contextmanager
def fixed_nonces() -> Iterator[None]:
    """Nonces 000…01, 000…02, … instead of random ones, so the proofs and the bytes are stable."""
    counter = itertools.count(1)
    real = auth.new_nonce
    auth.new_nonce = lambda: f"{next(counter):032x}"
    try:
        yield
    finally:
        auth.new_nonce = real


class Recorder:
    def __init__(self, pair: Pair) -> None:
        self.pair = pair
        self.log: list[dict[str, Any]] = []

    def deliver(self, frm: str) -> list[Event]:
        """One step; when the receiver finds it fatal, the step says with which error code."""
        before = len(self.pair.steps)
        try:
            events = self.pair.deliver(frm)
        except ShuffledError as exc:
            self._log(frm, before, [], exc.code.name)
            raise
        self._log(frm, before, events)
        return events

    def _log(self, frm: str, before: int, events: list[Event], fatal: str | None = None) -> None:
        if len(self.pair.steps) > before:
            step = {"from": frm, "hex": self.pair.steps[-1][1].hex(), "events": [_describe(e) for e in events]}
            self.log.append(step if fatal is None else {**step, "fatal": fatal})

    def deliver_fatal(self, frm: str, error: type[ShuffledError]) -> None:
        """A step the receiver must find fatal with `error`: it answers with its ErrorResponse on stream 0."""
        try:
            self.deliver(frm)
        except error as exc:
            self.fatal(ACCEPTOR if frm == DIALER else DIALER, exc)
        else:
            raise AssertionError(f"{error.__name__} expected")

    def fatal(self, frm: str, exc: ShuffledError) -> None:
        """`frm` failed the connection: its ErrorResponse on stream 0 goes out, nothing after it."""
        data = self.pair.side(frm).fail(exc)
        other = self.pair.side(ACCEPTOR if frm == DIALER else DIALER)
        events = other.receive_data(data)
        self.log.append({"from": frm, "hex": data.hex(), "events": [_describe(e) for e in events]})


def _describe(event: Event) -> str:
    """An event as the vectors name it: its class, and the stream it is about when it has one."""
    name = type(event).__name__
    for holder in (event, getattr(event, "request", None), getattr(event, "frame", None)):
        for attr in ("stream", "writer", "request", "receiver"):
            value = getattr(holder, attr, None)
            if isinstance(value, int):
                return f"{name}({value})"
    return name


def _pair(dialer_role: Role = Role.CLIENT, secret: tuple[bytes | None, bytes | None] = (None, None), **kw: Any) -> Pair:
    dialer = MemoryConnection(Side.DIALER, dialer_role, secret=secret[0], who="the acceptor")
    acceptor = MemoryConnection(Side.ACCEPTOR, Role.DAEMON, who="the dialer", **kw)
    return Pair(dialer, acceptor)


def _handshake(rec: Recorder, secret: bytes | None = None) -> None:
    pair = rec.pair
    daemon = pair.dialer.role is Role.DAEMON  # a daemon names itself, and its segment size must match ours
    pair.dialer.start({"node": PEER, "segment_size": 32768} if daemon else {"name": "recorder"})
    rec.deliver(DIALER)
    if secret is not None:
        pair.acceptor.challenge(secret)
        rec.deliver(ACCEPTOR)
        rec.deliver(DIALER)
    pair.acceptor.accept(ACK)
    rec.deliver(ACCEPTOR)


def _request(receiver: int, credit: int) -> PartitionRequest:
    return PartitionRequest(receiver, credit, "app-1", 3, 0, 2, {"": [11]})


def handshake_plain(rec: Recorder) -> None:
    """No secret: Hello, HelloAck."""
    _handshake(rec)


def handshake_secret(rec: Recorder) -> None:
    """Both sides know the secret: Hello with the dialer's nonce, AuthChallenge, AuthResponse, HelloAck."""
    _handshake(rec, SECRET)


def handshake_wrong_secret(rec: Recorder) -> None:
    """The secrets differ: the dialer finds the acceptor's proof wrong and fails the connection."""
    pair = rec.pair
    pair.dialer.start({"name": "recorder"})
    rec.deliver(DIALER)
    pair.acceptor.challenge(b"another secret")
    rec.deliver_fatal(ACCEPTOR, AuthFailed)


def read_under_credit(rec: Recorder) -> None:
    """A read with 2 credits and 3 buffers: the third waits for AddCredit; the end needs none."""
    pair = rec.pair
    _handshake(rec)
    pair.dialer.request_read(_request(1, 2), landing)
    rec.deliver(DIALER)
    out: OutboundStream[Any] = OutboundStream(1, 2)
    pair.acceptor.accept_read(1, out)
    for i in range(3):
        out.push_data(group_bytes(11, [(i % 2, bytes([65 + i]) * (5 + i))]))
    out.push_event(None)
    send_buffers(pair.acceptor, out, 1)
    rec.deliver(ACCEPTOR)
    pair.dialer.add_credit(1, 2)
    rec.deliver(DIALER)
    send_buffers(pair.acceptor, out, 1)
    rec.deliver(ACCEPTOR)


def read_cancelled(rec: Recorder) -> None:
    """The reader cancels; a buffer already on its way is dropped, and credit for the read is no more."""
    pair = rec.pair
    _handshake(rec)
    pair.dialer.request_read(_request(1, 1), landing)
    rec.deliver(DIALER)
    out: OutboundStream[Any] = OutboundStream(1, 1)
    pair.acceptor.accept_read(1, out)
    out.push_data(group_bytes(11, [(0, b"late")]))
    send_buffers(pair.acceptor, out, 1)
    pair.dialer.cancel_read(1)
    rec.deliver(DIALER)
    rec.deliver(ACCEPTOR)


def push_committed(rec: Recorder) -> None:
    """Open, two push credits, two PushData (the second continues partition 1), commit after two pushes, CommitAck
    with the lengths."""
    pair = rec.pair
    _handshake(rec)
    out: OutboundStream[Any] = OutboundStream(1, 0)
    pair.dialer.open_push(OpenMapOutput(1, "app-1", 3, 0, 11, 2), out)
    rec.deliver(DIALER)
    pair.acceptor.accept_push(1, landing)
    pair.acceptor.grant_push_credit(1, 2)
    rec.deliver(ACCEPTOR)
    out.push_data(group_bytes(11, [(0, b"k1v1"), (1, b"k2v2")]))
    out.push_data(group_bytes(11, [(1, b"k3v3")]))
    out.push_event(COMMIT)
    send_pushes(pair.dialer, out, 1)
    rec.deliver(DIALER)
    pair.acceptor.ack_commit(1, [4, 8])
    rec.deliver(ACCEPTOR)


def push_aborted(rec: Recorder) -> None:
    """The writer gets its first credit, then aborts before pushing anything; the daemon acknowledges."""
    pair = rec.pair
    _handshake(rec)
    pair.dialer.open_push(OpenMapOutput(1, "app-1", 3, 1, 12, 2), OutboundStream(1, 0))
    rec.deliver(DIALER)
    pair.acceptor.accept_push(1, landing)
    pair.acceptor.grant_push_credit(1, 1)
    rec.deliver(ACCEPTOR)
    pair.dialer.send(encode_abort(1))
    rec.deliver(DIALER)
    pair.acceptor.ack_abort(1)
    rec.deliver(ACCEPTOR)


def push_out_of_turn(rec: Recorder) -> None:
    """The writer aborts before the daemon granted it credit (§12.2): the daemon fails the push on its stream
    with MAP_OUTPUT_STATE, and the connection lives on."""
    pair = rec.pair
    _handshake(rec)
    pair.dialer.open_push(OpenMapOutput(1, "app-1", 3, 1, 13, 2), OutboundStream(1, 0))
    rec.deliver(DIALER)
    pair.dialer.send(encode_abort(1))
    (refused,) = rec.deliver(DIALER)
    assert isinstance(refused, PushOutOfTurn)
    pair.acceptor.send_error(1, refused.error)
    rec.deliver(ACCEPTOR)


def admin_calls(rec: Recorder) -> None:
    """Two admin calls, one after the other: one answered, one failed with an error on its own stream."""
    pair = rec.pair
    _handshake(rec)
    first = pair.dialer.request_admin("stats", {})
    rec.deliver(DIALER)
    pair.acceptor.answer_admin(first, {"node": NODE})
    rec.deliver(ACCEPTOR)
    second = pair.dialer.request_admin("flush", {"app": "app-9"})
    rec.deliver(DIALER)
    pair.acceptor.fail_admin(second, PartitionNotFound("no shuffle of application app-9"))
    rec.deliver(ACCEPTOR)


def refusals(rec: Recorder) -> None:
    """With room for one stream: a second read is refused on its stream, as is a push to an unknown writer."""
    pair = rec.pair
    _handshake(rec)
    pair.dialer.request_read(_request(1, 1), landing)
    pair.dialer.request_read(_request(2, 1), landing)
    pair.dialer.send(encode_push_data(9, 0, group_bytes(12, [(0, b"stray")])))
    rec.deliver(DIALER)
    rec.deliver(ACCEPTOR)


def stream_zero(rec: Recorder) -> None:
    """A request on stream 0 breaks the protocol: the acceptor fails the connection on stream 0."""
    pair = rec.pair
    _handshake(rec)
    pair.dialer.send(encode(_request(0, 1)))
    rec.deliver_fatal(DIALER, ProtocolError)


def peer_link(rec: Recorder) -> None:
    """Two daemons: each reads from the other with receiver id 1; the two streams stay apart."""
    pair = rec.pair
    _handshake(rec, SECRET)
    pair.dialer.request_read(_request(1, 1), landing)
    rec.deliver(DIALER)
    pair.acceptor.request_read(_request(1, 1), landing)
    out_a: OutboundStream[Any] = OutboundStream(1, 1)
    pair.acceptor.accept_read(1, out_a)
    out_a.push_data(group_bytes(11, [(0, b"from the acceptor")]))
    out_a.push_event(None)
    send_buffers(pair.acceptor, out_a, 1)
    rec.deliver(ACCEPTOR)
    out_d: OutboundStream[Any] = OutboundStream(1, 1)
    pair.dialer.accept_read(1, out_d)
    out_d.push_data(group_bytes(11, [(1, b"from the dialer")]))
    out_d.push_event(None)
    send_buffers(pair.dialer, out_d, 1)
    rec.deliver(DIALER)


CONVERSATIONS: list[tuple[Callable[[Recorder], None], Callable[[], Pair], str | None]] = [
    (handshake_plain, _pair, None),
    (handshake_secret, lambda: _pair(secret=(SECRET, SECRET)), SECRET.decode()),
    (handshake_wrong_secret, lambda: _pair(secret=(SECRET, SECRET)), SECRET.decode()),
    (read_under_credit, _pair, None),
    (read_cancelled, _pair, None),
    (push_committed, _pair, None),
    (push_aborted, _pair, None),
    (push_out_of_turn, _pair, None),
    (admin_calls, _pair, None),
    (refusals, lambda: _pair(limits=Limits(streams=1)), None),
    (stream_zero, _pair, None),
    (peer_link, lambda: _pair(Role.DAEMON, (SECRET, SECRET)), SECRET.decode()),
]


def build() -> dict[str, Any]:
    out = []
    for script, make, secret in CONVERSATIONS:
        with fixed_nonces():
            rec = Recorder(make())
            script(rec)
        out.append(
            {
                "name": script.__name__.replace("_", "-"),
                "description": " ".join((script.__doc__ or "").split()),
                "dialer_role": rec.pair.dialer.role.name,
                "secret": secret,
                "steps": rec.log,
            }
        )
    return {
        "description": "Conversations between the two ends of a connection; see proto/vectors/record.py.",
        "conversations": out,
    }


def render() -> str:
    return json.dumps(build(), indent=1) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is out of date: run python proto/vectors/record.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
