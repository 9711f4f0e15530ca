"""Objects' keys and footers (storage/object_format.py, PROTOCOL.md §12.5): keys name the application, shuffle
and node as one prefix each, footers round-trip and refuse damage, and a node's objects prove an attempt
exactly when a commit record names it and their entries hold exactly its pieces."""

from __future__ import annotations

import hashlib

import pytest

from shuffled.server.storage.disk import PIECE_ROW, LoadedAttempt
from shuffled.server.storage.object_format import (
    TRAILER,
    Entry,
    Footer,
    app_prefix,
    decode_footer,
    footer_span,
    node_prefix,
    object_key,
    parse_key,
    prove,
    shuffle_prefix,
)


def _rows(*pieces: tuple[int, int, int, int]) -> bytes:
    return b"".join(PIECE_ROW.pack(*p) for p in pieces)


def _commit(attempt: int, serial: int, pieces: int, size: int) -> dict[str, object]:
    return {
        "attempt": attempt,
        "serial": serial,
        "map": 7,
        "bytes": size - 20 * pieces,
        "pieces": pieces,
        "size": size,
        "r": 1,
    }


def test_keys_are_prefixes_of_application_shuffle_and_node() -> None:
    key = object_key("app/1 ü", 3, "[::1]:7337", 42)
    assert key.startswith(node_prefix("app/1 ü", 3, "[::1]:7337"))
    assert key.startswith(shuffle_prefix("app/1 ü", 3)) and key.startswith(app_prefix("app/1 ü"))
    assert key == "app-app%2F1%20%C3%BC/3/%5B%3A%3A1%5D%3A7337/00000000000000000042"
    parts = parse_key(key)
    assert parts is not None and (parts.app_dir, parts.shuffle, parts.node_dir) == (
        "app-app%2F1%20%C3%BC",
        3,
        "%5B%3A%3A1%5D%3A7337",
    )
    assert not shuffle_prefix("app", 1).startswith(shuffle_prefix("app", 10)[:-1] + "/")
    assert parse_key(".probe/abc") is None and parse_key("app-x/1/n/not-a-number") is None
    long = "a" * 300
    assert app_prefix(long) == f"app-{'a' * 100}+{hashlib.sha256(long.encode()).hexdigest()}/"


def _object(footer: Footer, data: bytes) -> bytes:
    return data + footer.encode()


def test_a_footer_reads_back_from_the_end_of_its_object() -> None:
    data = b"x" * 100 + b"y" * 50
    footer = Footer("app", 1, 200, "10.0.0.1:7337", b"\x01" * 32)
    footer.entries = [Entry(5, 9, 0, 0, _rows((100, 1, 0, 3), (50, 2, 3, 199)))]
    footer.commits = [_commit(5, 9, 2, 150)]
    obj = _object(footer, data)
    span = footer_span(obj[-TRAILER.size :], len(obj))
    assert span == len(obj) - len(data)
    back = decode_footer(obj[-span:], len(obj))
    assert (back.app, back.shuffle, back.partitions, back.node, back.key) == (
        "app",
        1,
        200,
        "10.0.0.1:7337",
        b"\x01" * 32,
    )
    assert back.entries == footer.entries and back.commits == footer.commits and back.data_end == len(data)
    assert decode_footer(obj, len(obj)).entries == footer.entries, "more of the tail than the footer is fine"
    unknown = Footer("app", 1, 200, "n", None)
    assert decode_footer(unknown.encode(), len(unknown.encode())).key is None


@pytest.mark.parametrize(
    "damage",
    ["magic", "crc", "short", "outside"],
)
def test_a_damaged_footer_is_refused(damage: str) -> None:
    footer = Footer("app", 1, 2, "n", b"")
    footer.entries = [Entry(5, 9, 0, 0, _rows((100, 1, 0, 1)))]
    obj = bytearray(_object(footer, b"z" * (50 if damage == "outside" else 100)))
    if damage == "magic":
        obj[-1] ^= 1
    elif damage == "crc":
        obj[-TRAILER.size - 3] ^= 1
    tail = bytes(obj[-20:]) if damage == "short" else bytes(obj)
    with pytest.raises(ValueError):
        decode_footer(tail, len(obj))


def _footer(*entries: Entry, commits: tuple[dict[str, object], ...] = ()) -> Footer:
    f = Footer("app", 1, 4, "n", b"")
    f.entries, f.commits = list(entries), list(commits)
    return f


def test_an_attempt_is_proved_by_its_commit_and_exactly_its_pieces_across_objects() -> None:
    first = _footer(Entry(5, 1, 0, 0, _rows((10, 11, 0, 1), (20, 12, 1, 2))))
    second = _footer(
        Entry(5, 1, 2, 40, _rows((30, 13, 2, 3))),
        Entry(6, 1, 0, 0, _rows((10, 14, 0, 0))),
        commits=(_commit(5, 1, 3, 60), _commit(6, 1, 2, 20)),
    )
    proved = prove([first, second])
    assert set(proved.attempts) == {5}, "attempt 6 commits two pieces, its objects hold one"
    got = proved.attempts[5]
    assert list(got.places) == [1, 1, 2] and list(got.offsets) == [0, 10, 40] and list(got.crcs) == [11, 12, 13]
    assert got.map_index == 7 and got.stored == 0
    assert prove([second]).attempts == {}, "a piece missing at the start"
    other_serial = _footer(Entry(5, 2, 0, 0, _rows((10, 11, 0, 1), (20, 12, 1, 2), (30, 13, 2, 3))))
    assert prove([other_serial, second]).attempts == {}, "pieces of another life of the attempt id"


def test_a_piece_named_again_must_be_the_same_piece() -> None:
    found = LoadedAttempt(0, 1, 0)
    found.add(0, _rows((10, 11, 0, 1), (20, 12, 1, 2)))
    found.put(1, 3, 500, _rows((20, 12, 1, 2), (5, 15, 2, 2)))
    assert list(found.places) == [0, 3, 3] and list(found.offsets) == [0, 500, 520] and not found.broken
    found.put(0, 4, 0, _rows((11, 11, 0, 1)))
    assert found.broken
    gap = LoadedAttempt(0, 1, 0)
    gap.put(2, 1, 0, _rows((10, 11, 0, 1)))
    assert gap.broken
