"""The sweep's verdict: objects go only when positively dead (three answers: holds, does not hold, no answer;
a silent daemon counts as gone only once its leases and its objects are older than its own lease period and
the sweeping daemon's)."""

from __future__ import annotations

import pytest

from shuffled.server.cluster.sweep import verdict
from shuffled.server.storage.lease import Silence, lease_node, silences
from shuffled.server.storage.objects import ObjectInfo

LEASE = 600.0
APP = "app-a"


def leased(seconds: float, period: float = LEASE) -> Silence:
    return Silence(seconds, period)


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
        ("x", {"x": None}, {"x": leased(40.0)}, None),
        ("x", {"x": frozenset(), "y": None}, {"y": leased(599.0)}, None),
        ("x", {"x": None}, {}, None),  # silent, and no lease or object of it seen: unknown, kept
        ("x", {"x": None}, {"x": Silence(5000.0)}, None),  # old objects but no lease seen: not gone either
        # a silent daemon gone by its lease: its objects go, with that reason
        ("x", {"x": None}, {"x": leased(601.0)}, "expired"),
        ("x", {"x": frozenset(), "y": None}, {"y": leased(3600.0)}, "released"),
        # a writer no daemon here knows: only its lease decides
        ("z", {"x": frozenset()}, {"z": leased(10.0)}, None),
        ("z", {"x": frozenset()}, {"z": leased(700.0)}, "expired"),
        # a writer with a longer lease than this daemon's is judged by its own
        ("x", {"x": None}, {"x": leased(700.0, period=3600.0)}, None),
        ("x", {"x": None}, {"x": leased(3700.0, period=3600.0)}, "expired"),
        # ... and one with a shorter one by this daemon's
        ("x", {"x": None}, {"x": leased(100.0, period=4.0)}, None),
    ],
)
def test_only_positively_dead_objects_go(
    writer: str, answers: dict[str, frozenset[str] | None], silent: dict[str, Silence], kind: str | None
) -> None:
    found = verdict(APP, writer, "me", answers, silent, LEASE)
    assert found.kind == kind, found.reason
    assert found.reason


def test_a_nodes_silence_is_its_youngest_lease_or_object_and_its_lease_says_its_period() -> None:
    listed = [
        ObjectInfo(".leases/x/00000000000000000001-600", 10, 900.0),
        ObjectInfo(".leases/x/00000000000000000002-600", 10, 700.0),
        ObjectInfo("app-a/1/x/00000000000000000003", 10, 50.0),
        ObjectInfo("app-a/1/y/00000000000000000004", 10, 5000.0),
        ObjectInfo(".probe/abc", 10, 1.0),
    ]
    writers = {"app-a/1/x/00000000000000000003": "x", "app-a/1/y/00000000000000000004": "y"}
    assert silences(listed, writers) == {"x": Silence(50.0, 600.0), "y": Silence(5000.0, 0.0)}
    assert lease_node(".leases/x/00000000000000000001-600") == "x"
    assert lease_node(".leases/x/00000000000000000001") is None
    assert lease_node(".leases/x") is None and lease_node("app-a/1/x/00000000000000000003") is None
