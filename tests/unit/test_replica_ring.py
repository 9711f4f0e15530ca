"""Replica placement: every daemon computes the same candidates from the peer list alone."""

from __future__ import annotations

import pytest

from shuffled.config import DaemonConfig
from shuffled.server.cluster.replica_ring import candidates


def ring(n: int) -> list[str]:
    return [f"10.0.0.{i}:7337" for i in range(n)]


@pytest.mark.parametrize("n", range(2, 13))
def test_first_candidates_are_a_permutation_so_replica_load_spreads_evenly(n: int) -> None:
    peers = ring(n)
    for shuffle in range(5):
        firsts = [candidates(peers, {}, p, "app-1", shuffle)[0] for p in peers]
        assert sorted(firsts) == sorted(peers), (shuffle, firsts)


@pytest.mark.parametrize("n", range(1, 9))
def test_every_other_daemon_is_a_candidate_once_and_never_the_primary(n: int) -> None:
    peers = ring(n)
    for p in peers:
        got = candidates(peers, {}, p, "app-1", 7)
        assert sorted(got) == sorted(set(peers) - {p})


def test_a_primary_missing_from_the_list_gets_the_same_candidates() -> None:
    peers = ring(5)
    primary = peers[2]
    without = [x for x in peers if x != primary]
    assert candidates(without, {}, primary, "a", 1) == candidates(peers, {}, primary, "a", 1)


def test_other_zones_come_first_and_the_ring_order_is_kept_within_a_zone() -> None:
    peers = ring(6)
    zones = {p: ("east" if i % 2 else "west") for i, p in enumerate(peers)}
    primary = peers[0]  # west
    plain = candidates(peers, {}, primary, "a", 4)
    got = candidates(peers, zones, primary, "a", 4)
    east = [p for p in plain if zones[p] == "east"]
    west = [p for p in plain if zones[p] == "west"]
    assert got == east + west


def test_golden_placement_that_other_implementations_must_match() -> None:
    """The example in proto/PROTOCOL.md §12.4."""
    peers = ["h0:1", "h1:1", "h2:1", "h3:1", "h4:1"]
    assert candidates(peers, {}, "h0:1", "app", 3) == ["h3:1", "h4:1", "h1:1", "h2:1"]
    assert candidates(peers, {}, "h2:1", "app", 3) == ["h0:1", "h1:1", "h3:1", "h4:1"]


def test_peer_entries_name_zones_and_the_own_zone_setting_wins() -> None:
    cfg = DaemonConfig(peers=["a:1@z1", "b:2", "c:3@z2"], zone="z9")
    assert cfg.peer_addresses() == ["a:1", "b:2", "c:3"]
    assert cfg.zones("c:3") == {"a:1": "z1", "c:3": "z9"}
