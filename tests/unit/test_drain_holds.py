"""A draining daemon takes a peer's `holds` answer only as far as it checks out: attempts it
was asked about, each with the bytes stored here. An answer with unhashable entries no longer ends the
whole hand-over with a TypeError, and a peer claiming to hold everything no longer keeps anything from
being copied; the answering daemon then counts as holding nothing, and the refusal is logged."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from shuffled.buffers import GlobalPool
from shuffled.config import DaemonConfig
from shuffled.ops.stats import DrainStats
from shuffled.server.cluster.handover import HandOver
from shuffled.server.cluster.membership import Membership
from shuffled.server.cluster.survey import Copies
from shuffled.server.storage.manager import open_storage
from tests.aio import within
from tests.pieces import pack, push

SEGMENT = 4096
ME, LIAR, HONEST = "n1:1", "n2:1", "n3:1"
#: bytes of attempt 1 and attempt 2 stored here
SIZES = {1: 300, 2: 700}


class Peer:
    """A peer daemon's connection as the hand-over uses it: `admin_call` answers `holds` with `answer`."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer

    async def admin_call(self, op: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert op == "holds"
        return self.answer


def _hand_over(answers: dict[str, dict[str, Any]]) -> HandOver:
    cfg = DaemonConfig(peers=[ME, LIAR, HONEST], replicas=1)
    pool = GlobalPool(16 * SEGMENT, SEGMENT)
    storage = open_storage(cfg, pool, None)
    store = storage.store
    for attempt, size in SIZES.items():
        out = store.open_map_output("app", 1, 0, attempt, 1)
        push(pool, store, out, pack(attempt, [(0, b"x" * size)]))
        store.commit(out)

    async def get(addr: str) -> Any:
        return Peer(answers[addr])

    return HandOver(cfg, storage, Membership(cfg, ME), get, DrainStats())


@within(10)
@pytest.mark.parametrize(
    "lie",
    [
        {"attempts": [[1], [2]], "bytes": [300, 700]},  # unhashable: a TypeError ended the hand-over
        {"attempts": [1, 2], "bytes": [0, 0]},  # everything, with sizes it cannot know
        {"attempts": [1, 2, 3]},  # everything, without sizes
        {"attempts": [1, 2, 9], "bytes": [300, 700, 1]},  # an attempt it was not asked about
        {"attempts": [True], "bytes": [300]},
        {"attempts": "1,2", "bytes": [300, 700]},
    ],
)
async def test_a_holds_answer_counts_only_as_far_as_it_checks_out(
    lie: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    honest = {"attempts": [1], "bytes": [SIZES[1]]}
    drainer = _hand_over({LIAR: lie, HONEST: honest})
    copied: list[tuple[int, set[str]]] = []

    async def hand_over(h: Copies) -> None:
        copied.append((h.attempt, set(h.holders)))
        drainer.settle(h)

    drainer.hand_over = hand_over  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="shuffled.server.cluster.handover"):
        assert await drainer.run(time.monotonic() + 10) is True
    # attempt 1 has its copy on the honest daemon; attempt 2 is copied: the liar holds neither
    assert copied == [(2, set())]
    assert [r.getMessage() for r in caplog.records].count("holds answer refused") == 1
    progress = drainer.progress
    assert (progress.to_copy, progress.failed, progress.short) == (1, 1, 0)
