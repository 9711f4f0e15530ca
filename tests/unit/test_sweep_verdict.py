"""The sweep's verdict: objects go only when positively dead (three answers: holds, does not hold, no answer;
a silent daemon counts as gone only once its lease and its objects are older than the lease period)."""

from __future__ import annotations

import pytest

from shuffled.server.cluster.sweep import verdict
from shuffled.server.storage.lease import last_signs, lease_node
from shuffled.server.storage.objects import ObjectInfo

LEASE = 600.0
APP = "app-a"


@pytest.mark.parametrize(
    ("writer", "answers", "silent", "kind"),
    [
        # someone holds it: kept, whoever wrote it
        ("x", {"x": frozenset({APP})}, {}, None),
        ("x", {"x": frozenset(), "y": frozenset({APP})}, {}, None),
        # its writer answered it does not: released
        ("x", {"x": frozenset()}, {}, "released"),
        # written by this daemon's earlier life, nobody else holds it
        ("me", {"x": frozenset()}, {}, "released"),
        # a silent daemon whose lease is good may hold it: kept (a stopped, slow, cut-off daemon)
        ("x", {"x": None}, {"x": 40.0}, None),
        ("x", {"x": frozenset(), "y": None}, {"y": 599.0}, None),
        ("x", {"x": None}, {}, None),  # silent, and no lease or object of it seen: unknown, kept
        # a silent daemon gone by its lease: its objects go, with that reason
        ("x", {"x": None}, {"x": 601.0}, "expired"),
        ("x", {"x": frozenset(), "y": None}, {"y": 3600.0}, "released"),
        # a writer no daemon here knows: only its lease decides
        ("z", {"x": frozenset()}, {"z": 10.0}, None),
        ("z", {"x": frozenset()}, {"z": 700.0}, "expired"),
    ],
)
def test_only_positively_dead_objects_go(
    writer: str, answers: dict[str, frozenset[str] | None], silent: dict[str, float], kind: str | None
) -> None:
    found = verdict(APP, writer, "me", answers, silent, LEASE)
    assert found.kind == kind, found.reason
    assert found.reason


def test_a_nodes_last_sign_of_life_is_its_youngest_lease_or_object() -> None:
    listed = [
        ObjectInfo(".leases/x/00000000000000000001", 10, 900.0),
        ObjectInfo(".leases/x/00000000000000000002", 10, 700.0),
        ObjectInfo("app-a/1/x/00000000000000000003", 10, 50.0),
        ObjectInfo("app-a/1/y/00000000000000000004", 10, 5000.0),
        ObjectInfo(".probe/abc", 10, 1.0),
    ]
    writers = {"app-a/1/x/00000000000000000003": "x", "app-a/1/y/00000000000000000004": "y"}
    assert last_signs(listed, writers) == {"x": 50.0, "y": 5000.0}
    assert lease_node(".leases/x/00000000000000000001") == "x"
    assert lease_node(".leases/x") is None and lease_node("app-a/1/x/00000000000000000003") is None
