"""A read resumed on another copy (PROTOCOL.md §10.6) gets exactly what the failed read had
not relayed, however the copy's pieces are split.

Two stores hold the same map outputs packed differently (other group boundaries, a run split elsewhere,
one of them spilled) and committed in another order. Whatever prefix of the primary's payloads was
relayed (`ReadProgress`), the copy's resumed plan completes it: every pair whole, in push order, nothing
twice. A resume point that does not fit the copy fails the read before any data.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shuffled.buffers import GlobalPool
from shuffled.protocol.errors import InvalidRequest
from shuffled.protocol.resume import ReadProgress, Resume
from shuffled.server.serving.view_reader import ViewReader
from shuffled.server.storage.disk import Disk
from shuffled.server.storage.loader import PieceLoader
from shuffled.server.storage.plan import Plan, make_plan
from shuffled.server.storage.spill import Spiller
from shuffled.server.storage.store import Store
from shuffled.server.storage.view import ReadView
from tests.aio import within
from tests.pieces import push, serve, split, unpack

SEG = 4096
PARTITIONS = 5
#: attempt -> partition -> bytes: empty partitions, small ones and one spanning several groups
DATA = {a: {p: bytes([a, p]) * n for p, n in enumerate([700 * a, 0, 5, 3 * SEG // 2, 40]) if n} for a in (1, 2)}


class Copy:
    def __init__(self, root: Path, cuts: list[int], commit_order: tuple[int, ...], spill: bool) -> None:
        self.pool = GlobalPool(64 * SEG, SEG, reserve=24)  # `serve` keeps every payload to the end
        self.store = Store(SEG, can_spill=True)
        self.disk = Disk(str(root))
        self.spiller = Spiller(self.store, self.pool, self.disk, 0.85, 0.7)
        self.outs = {a: self.store.open_map_output("app", 0, a, a, PARTITIONS) for a in (1, 2)}
        for a, out in self.outs.items():
            for group in split(a, sorted(DATA[a].items()), SEG, cuts):
                push(self.pool, self.store, out, group)
        self.spill = spill
        self.order = commit_order

    async def ready(self) -> Copy:
        if self.spill:
            await self.spiller.flush([self.store.apps["app"][0]])
        for a in self.order:
            self.store.commit(self.outs[a])
        return self

    async def serve(self, resume: Resume | None = None) -> list[bytes]:
        return await serve(
            self.pool, self.disk, make_plan(self.store, "app", 0, 0, PARTITIONS, [1, 2], resume, digest=b"")
        )


def pairs(payloads: list[bytes]) -> dict[tuple[int, int], bytes]:
    """Each pair's bytes; a pair must be one run of consecutive runs."""
    got: dict[tuple[int, int], bytearray] = {}
    last: tuple[int, int] | None = None
    for attempt, p, data in (r for payload in payloads for r in unpack(payload)):
        pair = (p, attempt)
        if pair != last:
            assert pair not in got, f"pair {pair} in two runs"
            last = pair
        got.setdefault(pair, bytearray()).extend(data)
    return {k: bytes(v) for k, v in got.items()}


WANT = {(p, a): d for a, parts in DATA.items() for p, d in parts.items()}


@within(30)
@pytest.mark.parametrize(
    ("cuts", "order", "spill"),
    [([], (1, 2), False), ([1, 100, 2000], (2, 1), False), ([3], (2, 1), True), ([50, 51], (1, 2), True)],
    ids=["same", "other-cuts", "spilled", "spilled-other-cuts"],
)
async def test_every_cut_point_resumes_to_exactly_the_rest(
    tmp_path: Path, cuts: list[int], order: tuple[int, ...], spill: bool
) -> None:
    primary = await Copy(tmp_path / "p", [], (1, 2), False).ready()
    full = await primary.serve()
    assert pairs(full) == WANT
    copy = await Copy(tmp_path / "c", cuts, order, spill).ready()
    for n in range(len(full) + 1):
        progress = ReadProgress()
        for payload in full[:n]:
            progress.add(memoryview(payload))
        rest = await copy.serve(progress.resume())
        assert pairs(full[:n] + rest) == WANT, f"cut after {n} payloads"
        assert copy.pool.used == copy.store.memory_segments
    for c in (primary, copy):
        c.disk.close()


async def _feed(copy: Copy, plan: Plan, sent: list[object]) -> None:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    view = ReadView(plan, copy.pool, PieceLoader(copy.disk))
    ViewReader(
        view, lambda chunk, _: sent.append(chunk), lambda: 64, lambda: done.set_result(None), done.set_exception
    ).start()
    await done


@within(30)
async def test_a_resume_point_that_does_not_fit_fails_before_any_data(tmp_path: Path) -> None:
    copy = await Copy(tmp_path, [], (1, 2), False).ready()
    good = Resume((), 2, 3, 100)
    assert pairs(await copy.serve(good))  # fits: the rest of pair (3, 2), then attempt 1
    refused = [
        (Resume((), 2, 3, len(DATA[2][3]) + 1), "does not match this copy"),  # more bytes than the pair
        (Resume((), 2, 1, 1), "does not match this copy"),  # an empty pair
        (Resume((), 2, PARTITIONS, 0), "outside"),  # not in the range
        (Resume((7,), 2, 3, 1), "not named by the request"),  # an attempt not named
    ]
    for resume, why in refused:
        used = copy.pool.used
        sent: list[object] = []
        with pytest.raises(InvalidRequest, match=why):
            await _feed(copy, make_plan(copy.store, "app", 0, 0, PARTITIONS, [1, 2], resume, digest=b""), sent)
        assert not sent, "nothing is served before the error"
        assert copy.pool.used == used
    copy.disk.close()


@within(30)
async def test_resume_wire_form_round_trips() -> None:
    for resume in (Resume((1, 2), 5, 4, 1000), Resume()):
        assert Resume.from_wire(resume.to_wire()) == resume
    assert "attempt" not in Resume().to_wire()
