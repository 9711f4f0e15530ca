"""Objects in the object store: where they are (keys) and what they hold (footers). PROTOCOL.md §12.5.

An object holds pieces exactly as a spill file does, back to back from offset 0, and ends with its own
index: a msgpack *footer* and a 16-byte trailer (the footer's length, its CRC32C, the magic
`shuffled`). So a daemon reads any object with one suffix GET of its footer and then ranged GETs of
the pieces a read needs; no other file describes it.

The footer names the shuffle (application, shuffle, partitions), the node that wrote it and the digest
of the token its application is bound to, lists per attempt the pieces it holds (an *entry*: attempt,
serial, the index of the first of them among the attempt's pieces, its offset, then 16 bytes a piece
as in a journal record: length, CRC32C, first and last partition) and carries the commit records of
the attempts it makes durable. An attempt is proved by a node's objects of a shuffle (`prove`) when a
commit record names it and their entries hold exactly its pieces, as a journal proves one.

Keys: `<app dir>/<shuffle>/<node>/<sequence>` under the store's prefix, so a shuffle, an application
and one node's objects of one shuffle are each one prefix. No I/O here.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import msgpack

from ...protocol.integrity import checksum
from .disk import PIECE_ROW, LoadedAttempt, app_dir_name

#: footer length, CRC32C of the footer, magic
TRAILER = struct.Struct(">II8s")
MAGIC = b"shuffled"
VERSION = 1
#: bytes a first suffix GET asks for: the footer of an object of 32 MiB of full 32 KiB pieces and the
#: trailer fit (about 24 bytes a piece, 1,024 pieces)
FOOTER_GUESS = 64 << 10
#: the widest sequence number, so keys sort by it
_SEQUENCE_DIGITS = 20


def node_dir(node: str) -> str:
    """A key component for a node name (`10.0.0.5:7337`, `[::1]:7337`): quoted as application ids are."""
    return quote(node, safe="")


def app_prefix(app: str) -> str:
    return f"{app_dir_name(app)}/"


def shuffle_prefix(app: str, shuffle: int) -> str:
    return f"{app_dir_name(app)}/{shuffle}/"


def node_prefix(app: str, shuffle: int, node: str) -> str:
    return f"{shuffle_prefix(app, shuffle)}{node_dir(node)}/"


def object_key(app: str, shuffle: int, node: str, sequence: int) -> str:
    return f"{node_prefix(app, shuffle, node)}{sequence:0{_SEQUENCE_DIGITS}d}"


@dataclass(frozen=True, slots=True)
class KeyParts:
    app_dir: str
    shuffle: int
    node_dir: str


def parse_key(key: str) -> KeyParts | None:
    """The parts of an object key this layout made; None for anything else under the prefix."""
    parts = key.split("/")
    if len(parts) != 4 or not parts[0].startswith("app-") or not parts[1].isdigit() or not parts[3].isdigit():
        return None
    return KeyParts(parts[0], int(parts[1]), parts[2])


@dataclass(slots=True)
class Entry:
    """Pieces of one attempt in an object: pieces `start`.. of its push order, back to back from `offset`."""

    attempt: int
    serial: int
    start: int
    offset: int
    #: PIECE_ROW per piece
    rows: bytes
    #: with encryption at rest, the pieces' seals back to back (at_rest.py)
    seals: bytes | None = None

    def encoded(self) -> list[object]:
        """As footers and journal records keep it (the seals last, when there are some)."""
        fields: list[object] = [self.attempt, self.serial, self.start, self.offset, self.rows]
        return fields if self.seals is None else [*fields, self.seals]

    @property
    def pieces(self) -> int:
        return len(self.rows) // PIECE_ROW.size

    def length(self) -> int:
        return sum(PIECE_ROW.unpack_from(self.rows, i)[0] for i in range(0, len(self.rows), PIECE_ROW.size))


@dataclass(slots=True)
class Footer:
    """What an object holds (see the module)."""

    app: str
    shuffle: int
    partitions: int
    node: str
    #: the digest of the token the application is bound to (b"": bound to requests without one; None: the
    #: writer did not know, and no other daemon adopts what it holds)
    key: bytes | None
    entries: list[Entry] = field(default_factory=list)
    #: commit records (store.commit_fields) of the attempts this object makes durable
    commits: list[dict[str, Any]] = field(default_factory=list)
    #: where the pieces end: the footer starts here (set when decoded)
    data_end: int = 0
    #: the at-rest key its pieces are sealed with (None: not sealed)
    kid: str | None = None

    def encode(self) -> bytes:
        body: bytes = msgpack.packb(
            {
                "v": VERSION,
                "app": self.app,
                "shuffle": self.shuffle,
                "partitions": self.partitions,
                "node": self.node,
                "key": self.key,
                "a": [e.encoded() for e in self.entries],
                "c": self.commits,
                "kid": self.kid,
            },
            use_bin_type=True,
        )
        return body + TRAILER.pack(len(body), checksum(body), MAGIC)


def footer_span(tail: bytes | bytearray | memoryview, size: int) -> int:
    """How many bytes from the end of an object of `size` bytes hold its footer and trailer, read from the
    trailer at the end of `tail` (the object's last bytes). Raises ValueError for no object of ours."""
    if len(tail) < TRAILER.size or size < TRAILER.size:
        raise ValueError("shorter than a trailer")
    length, _, magic = TRAILER.unpack_from(tail, len(tail) - TRAILER.size)
    if magic != MAGIC:
        raise ValueError("no shuffled trailer")
    if length + TRAILER.size > size:
        raise ValueError(f"footer of {length} bytes in an object of {size}")
    return int(length) + TRAILER.size


def decode_footer(tail: bytes | bytearray | memoryview, size: int) -> Footer:
    """The footer of an object of `size` bytes from its last bytes (at least `footer_span` of them).
    Raises ValueError when it is not one, or names pieces outside the object."""
    span = footer_span(tail, size)
    if len(tail) < span:
        raise ValueError(f"{span} bytes needed, {len(tail)} read")
    raw = bytes(tail[len(tail) - span :])
    body = raw[: -TRAILER.size]
    if checksum(body) != TRAILER.unpack_from(raw, len(body))[1]:
        raise ValueError("footer fails its CRC32C check")
    try:
        m = msgpack.unpackb(body, raw=False, strict_map_key=False)
        if not isinstance(m, dict) or m.get("v") != VERSION:
            raise ValueError(f"footer version {m.get('v') if isinstance(m, dict) else '?'}")
        key = m["key"]
        footer = Footer(
            str(m["app"]), int(m["shuffle"]), int(m["partitions"]), str(m["node"]), None if key is None else bytes(key)
        )
        footer.entries = [
            Entry(int(a), int(s), int(i), int(o), bytes(r), bytes(sealed[0]) if sealed else None)
            for a, s, i, o, r, *sealed in m["a"]
        ]
        footer.commits = [dict(c) for c in m["c"]]
        footer.kid = None if m.get("kid") is None else str(m["kid"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"footer malformed: {exc}") from None
    footer.data_end = size - span
    for e in footer.entries:
        if len(e.rows) % PIECE_ROW.size or e.offset < 0 or e.offset + e.length() > footer.data_end:
            raise ValueError(f"attempt {e.attempt}'s pieces lie outside the object")
    return footer


@dataclass
class Proved:
    """What a node's objects of one shuffle prove: the attempts and the commit records that name them."""

    #: attempt -> its pieces (places are indices into the objects given to `prove`, plus one)
    attempts: dict[int, LoadedAttempt] = field(default_factory=dict)
    commits: dict[int, dict[str, Any]] = field(default_factory=dict)


def prove(footers: Iterable[Footer]) -> Proved:
    """The attempts these footers prove, in the order given (a node writes its objects in key order, and
    an attempt's pieces in push order). Piece places are 1 + the footer's position."""
    pieces: dict[tuple[int, int], LoadedAttempt] = {}
    commits: dict[tuple[int, int], dict[str, Any]] = {}
    for place, footer in enumerate(footers, start=1):
        for e in footer.entries:
            found = pieces.setdefault((e.attempt, e.serial), LoadedAttempt(0, e.serial, 0))
            found.put(e.start, place, e.offset, e.rows, e.seals)
        for c in footer.commits:
            commits[int(c["attempt"]), int(c["serial"])] = c
    proved = Proved()
    for (attempt, serial), record in commits.items():
        found = pieces.get((attempt, serial), LoadedAttempt(0, serial, 0))
        if found.matches(record):
            proved.attempts[attempt] = found
            proved.commits[attempt] = record
    return proved
