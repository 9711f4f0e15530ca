"""The one peer list: `peers` plus what `peers-dns` resolves to, this daemon once, and a failing lookup that
keeps the last good list and is logged once per change."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator

import pytest

from shuffled.config import ConfigError, DaemonConfig
from shuffled.server.cluster import membership
from shuffled.server.cluster.membership import Membership, resolve
from shuffled.server.cluster.replica_ring import candidates
from tests.aio import within

PORT = 7337


@within(10)
async def test_localhost_resolves_to_its_loopback_addresses_with_the_port() -> None:
    found = await resolve("localhost", PORT)
    assert f"127.0.0.1:{PORT}" in found, found
    assert all(re.fullmatch(rf"(127\.\d+\.\d+\.\d+|\[::1\]):{PORT}", a) for a in found), found
    assert found == sorted(set(found))


@within(10)
async def test_an_ipv6_address_is_named_in_brackets_as_a_daemon_advertises_it() -> None:
    assert (await resolve("::1", PORT), await resolve("127.0.0.3", PORT)) == ([f"[::1]:{PORT}"], [f"127.0.0.3:{PORT}"])


def test_the_ring_is_peers_and_resolved_addresses_with_this_daemon_once() -> None:
    cfg = DaemonConfig(peers=["a:1@z1", "b:1"], zone="z2", peers_dns="shuffled-peers:1", replica_search=2)
    m = Membership(cfg, "c:1")
    assert m.others() == ["a:1", "b:1"]
    m.resolved = ["b:1", "c:1", "d:1"]  # DNS lists this daemon too, and one peers names already
    assert m.others() == ["a:1", "b:1", "d:1"]
    assert sorted(m.ring()) == ["a:1", "b:1", "c:1", "d:1"]
    assert m.knows("d:1") and not m.knows("c:1") and not m.knows("e:1")
    for primary in m.ring():
        expected = candidates(["a:1", "b:1", "c:1", "d:1"], {"a:1": "z1", "c:1": "z2"}, primary, "app", 4)
        assert m.candidates(primary, "app", 4) == expected[:2]


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str] | OSError]]:
    """What the next lookups answer, in order (a list of addresses, or the error they raise)."""
    script: list[list[str] | OSError] = []

    async def fake(name: str, port: int) -> list[str]:
        answer = script.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    monkeypatch.setattr(membership, "resolve", fake)
    yield script
    assert not script, "every scripted answer was used"


@within(10)
async def test_a_failed_lookup_keeps_the_last_list_and_is_logged_once_per_change(
    answers: list[list[str] | OSError], caplog: pytest.LogCaptureFixture
) -> None:
    m = Membership(DaemonConfig(peers_dns="shuffled-peers:1"), "a:1")
    answers += [["a:1", "b:1"], OSError("no such name"), OSError("no such name"), OSError("timed out")]
    answers += [["a:1", "b:1", "c:1"]]
    seen = []
    with caplog.at_level(logging.INFO, logger=membership.__name__):
        for _ in range(5):
            await m.refresh()
            seen.append(m.others())
    assert seen == [["b:1"], ["b:1"], ["b:1"], ["b:1"], ["b:1", "c:1"]]
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("peers-dns lookup failed") == 2, messages  # two different errors, three failures
    assert messages.count("peers-dns lookup works again") == 1
    assert messages.count("peers changed") == 2
    assert "peers-dns does not list this daemon" not in messages


@within(10)
async def test_one_lookup_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow DNS server delays the next answer; ticks meanwhile start no second lookup."""
    calls = []
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(name: str, port: int) -> list[str]:
        calls.append(name)
        started.set()
        await release.wait()
        return [f"10.0.0.9:{port}"]

    monkeypatch.setattr(membership, "resolve", slow)
    m = Membership(DaemonConfig(peers_dns="shuffled-peers:1"), "a:1")
    m.refresh_soon()
    await started.wait()
    m.refresh_soon()  # the next ticks find it running
    m.refresh_soon()
    release.set()
    assert m._lookup is not None
    await m._lookup
    assert calls == ["shuffled-peers"] and m.others() == ["10.0.0.9:1"]


@pytest.mark.parametrize("value", ["shuffled-peers", "shuffled-peers:", ":7337", "name:0", "name:70000", "name:x"])
def test_peers_dns_must_be_name_and_port(value: str) -> None:
    with pytest.raises(ConfigError, match="peers-dns"):
        DaemonConfig(peers_dns=value).validate()
