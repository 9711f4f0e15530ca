"""A wide shuffle at scale, scaled down for the suite: 400 map outputs of 5,000 partitions, 8 bytes a block
(two million blocks, 48 MiB of packed groups through a 16 MiB pool, so most of it is spilled), pushed with
`write_sorted` and read back by ten readers of a range each. Every attempt's bytes in every range must be
what it wrote, the daemon's peak RSS must stay within its pool plus 200 MiB, and its memory must not grow
with the blocks: it keeps no object per block, only the pieces' rows and one record per attempt.
`python -m benchmarks scale_wide` runs the same at full size (10,000 x 10,000 blocks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.scale_wide import scale
from shuffled.launch import DaemonProcess, free_port
from tests.aio import run
from tests.units import MiB

HOST = "127.0.0.2"
MAPS, PARTITIONS, BLOCK = 400, 5_000, 8

pytestmark = pytest.mark.slow


def test_two_million_tiny_blocks_through_a_small_pool(tmp_path: Path) -> None:
    daemon = DaemonProcess(HOST, free_port([HOST]), "16M", ["--data-dir", str(tmp_path)]).wait_ready()
    try:
        r = run(scale(daemon, MAPS, PARTITIONS, BLOCK, 4, 10), 120)
    finally:
        daemon.stop()
    assert r["runs"] >= MAPS * PARTITIONS and r["bytes"] == MAPS * PARTITIONS * BLOCK
    assert r["stats"]["disk"]["spills"] > 0, r["stats"]["disk"]
    assert r["peak_rss"] <= daemon.pool_size + 200 * MiB, f"peak RSS {r['peak_rss'] / MiB:.0f} MiB"
    # No memory per block: two million blocks cost the daemon less than a few KiB per attempt.
    assert r["pushed_rss"] - r["idle_rss"] < MAPS * 8 * 1024, (r["pushed_rss"] - r["idle_rss"]) / MAPS
