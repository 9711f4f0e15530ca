"""The record of dropped shuffles: told to the owner only, ended by a new push, bounded."""

from __future__ import annotations

from shuffled.protocol.auth import token_digest
from shuffled.server.storage.departures import Departures

OWNER, OTHER = token_digest("owner"), token_digest("other")


def test_the_owner_is_told_why_and_nobody_else() -> None:
    gone = Departures()
    gone.left("app", 1, "unregistered", OWNER)
    gone.left("tokenless", None, "removed with its application", None)
    assert gone.why("app", 1, OWNER) == "unregistered"
    assert gone.why("app", 1, OTHER) is None and gone.why("app", 1, b"") is None
    assert gone.why("app", 2, OWNER) is None  # never dropped here
    assert gone.why("tokenless", 5, b"") == "removed with its application"  # all of it


def test_a_new_push_ends_the_record_of_its_shuffle_and_of_its_application() -> None:
    gone = Departures()
    gone.left("app", 1, "unregistered", OWNER)
    gone.left("app", None, "removed with its application", OWNER)
    gone.returned("app", 1)
    assert gone.why("app", 1, OWNER) is None and gone.why("app", 2, OWNER) is None


def test_the_oldest_records_go_past_the_limit() -> None:
    gone = Departures(limit=3)
    for shuffle in range(5):
        gone.left("app", shuffle, "unregistered", None)
    assert [gone.why("app", s, b"") for s in range(5)] == [None, None, "unregistered", "unregistered", "unregistered"]
    gone.left("app", 2, "unregistered", None)  # dropped again: the newest now
    gone.left("app", 9, "unregistered", None)
    assert gone.why("app", 2, b"") == "unregistered" and gone.why("app", 3, b"") is None
