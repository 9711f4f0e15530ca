"""A bug in one hand-over worker ends the hand-over: the other workers are cancelled, the bug is logged
with its traceback, and the drain goes on to stop the daemon (HandOver.run returns instead of raising)."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest

from shuffled.ops.stats import DrainStats
from shuffled.server.cluster.handover import PARALLEL, HandOver
from shuffled.server.cluster.survey import Copies
from shuffled.server.storage.holdings import HeldAttempt
from tests.aio import within


@within(10)
async def test_a_bug_in_one_worker_cancels_the_others_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    parts: Any = SimpleNamespace()
    drainer = HandOver(parts, parts, parts, parts, DrainStats())
    todo = [Copies(HeldAttempt("app", 0, 1, a, a, None, 2, 1), "p:1", 2, ["q:1"]) for a in range(PARALLEL)]
    waiting: list[asyncio.Future[None]] = []

    async def survey(deadline: float) -> list[Copies]:
        return todo

    async def hand_over(h: Copies) -> None:
        if h.attempt == PARALLEL - 1:  # the others are already waiting
            raise KeyError("a bug")
        waiting.append(asyncio.get_running_loop().create_future())
        await waiting[-1]

    drainer.survey.run = survey  # type: ignore[method-assign]
    drainer.hand_over = hand_over  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="shuffled.server.cluster.handover"):
        assert await drainer.run(time.monotonic() + 60) is False
    assert len(waiting) == PARALLEL - 1 and all(f.cancelled() for f in waiting)
    (record,) = [r for r in caplog.records if r.getMessage() == "hand-over failed"]
    assert record.exc_info is not None and "a bug" in str(record.exc_info[1].exceptions[0])  # type: ignore[union-attr]
