"""The handshake of one end of a connection (connection.py), both halves: Hello with the dialer's nonce,
the acceptor's challenge and proof, the dialer's proof, HelloAck; the small size limit on frames until it
is done, and the features both ends agreed on (§6).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from .auth import AcceptorAuth, DialerAuth
from .codec import FrameReader, encode, encode_auth_challenge, encode_auth_response
from .errors import ProtocolError, error_from_code
from .events import Authenticated, ConnectionFailed, Event, HandshakeDone, HelloReceived
from .frames import MAX_CONTROL_BODY, AuthChallenge, AuthResponse, ErrorResponse, Frame, Hello, HelloAck, Role
from .streams import release_payload


class Side(Enum):
    DIALER = "dialer"
    ACCEPTOR = "acceptor"


class Phase(Enum):
    HELLO = "hello"  # dialer: Hello sent, waiting for HelloAck; acceptor: waiting for Hello
    ANSWER = "answer"  # acceptor: Hello arrived, the shell decides (challenge or accept)
    AUTH = "auth"  # acceptor: AuthChallenge sent, waiting for AuthResponse
    OPEN = "open"
    CLOSED = "closed"


class Handshake:
    """Where one end of a connection is in its life (`phase`), and the handshake that opens it."""

    def __init__(
        self, side: Side, role: Role, secret: bytes | None, reader: FrameReader, send: Callable[[bytes], None]
    ) -> None:
        self.side = side
        self.role = role
        self.phase = Phase.HELLO
        #: the other side's role, once its Hello (acceptor) or our dialing (dialer) says it
        self.peer_role: Role | None = None
        self.reader = reader
        self.send = send
        self._dialer = DialerAuth(secret) if side is Side.DIALER else None
        self._acceptor: AcceptorAuth | None = None
        self._hello: Hello | None = None
        #: what both ends said they support in Hello/HelloAck `features` (§6): known once the handshake is done
        self.features: frozenset[str] = frozenset()
        self._offered: frozenset[str] = frozenset()

    def start(self, info: dict[str, Any]) -> None:
        """Dialer: say Hello (with our nonce, so the acceptor can prove its secret)."""
        assert self._dialer is not None, "only a dialer says Hello first"
        self._offered = _features(info)
        self.send(encode(Hello(self.role, info=self._dialer.hello_info(info))))

    def challenge(self, secret: bytes, who: str) -> None:
        """Acceptor: the dialer must prove it knows `secret` before anything is created for it."""
        assert self.phase is Phase.ANSWER and self._hello is not None
        self._acceptor = AcceptorAuth(secret, self._hello.info.get("nonce"), who)
        self.phase = Phase.AUTH
        self.send(encode_auth_challenge(*self._acceptor.challenge()))

    def accept(self, info: dict[str, Any]) -> None:
        """Acceptor: take the dialer (HelloAck); its streams may open from now on."""
        assert self.phase in (Phase.ANSWER, Phase.AUTH) and self._hello is not None
        self.features = _features(info) & _features(self._hello.info)
        self._acceptor = self._hello = None
        self.open()
        self.send(encode(HelloAck(self.role, info=info)))

    def open(self) -> None:
        """The handshake is done: streams may open, and control frames may be as large as any."""
        self.phase = Phase.OPEN
        self.reader.set_max_control(MAX_CONTROL_BODY)

    @property
    def is_open(self) -> bool:
        return self.phase is Phase.OPEN

    def on_frame(self, frame: Frame, who: str) -> Event | None:
        """A frame before the connection is open (or after it closed: dropped)."""
        if self.phase is Phase.CLOSED:
            release_payload(frame)
            return None
        if isinstance(frame, ErrorResponse):  # the other side refused the handshake, or gave up on it
            self.phase = Phase.CLOSED
            return ConnectionFailed(error_from_code(frame.code, frame.message))
        if self.side is Side.DIALER:
            return self._dialer_frame(frame, who)
        if self.phase is Phase.HELLO:
            if not isinstance(frame, Hello):
                raise ProtocolError(f"the first frame must be Hello, got {type(frame).__name__}")
            self.phase = Phase.ANSWER
            self._hello = frame
            self.peer_role = frame.role
            return HelloReceived(frame.role, frame.info)
        if self.phase is Phase.AUTH:
            assert self._acceptor is not None and self._hello is not None
            self._acceptor.check(frame.proof if isinstance(frame, AuthResponse) else None)
            return Authenticated(self._hello.role, self._hello.info)
        raise ProtocolError(f"{type(frame).__name__} arrived before the handshake was answered")

    def _dialer_frame(self, frame: Frame, who: str) -> Event | None:
        dialer = self._dialer
        assert dialer is not None
        match frame:
            case AuthChallenge(nonce, proof):
                self.send(encode_auth_response(dialer.answer(nonce, proof, who)))
                return None
            case HelloAck(role, _, info):
                dialer.accepted(who)
                self.peer_role = role
                self.features = self._offered & _features(info)
                self.open()
                return HandshakeDone(info)
        raise ProtocolError(f"expected HelloAck, got {type(frame).__name__}")


def _features(info: dict[str, Any]) -> frozenset[str]:
    """The `features` of a Hello or HelloAck info map; anything but a list of strings offers none."""
    value = info.get("features")
    return frozenset(f for f in value if isinstance(f, str)) if isinstance(value, list) else frozenset()
