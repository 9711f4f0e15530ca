"""Daemons of the wheel whose hot path mypyc compiled (setup.py's COMPILED), as the container image ships them,
on the paths where the daemon hands objects of its own to the compiled streams. Compiled, a type annotation is
a check: an object of another class, duck-typed and fine interpreted, raises TypeError in the send loop, and
what it carried never leaves (a primary forwarding `Chunk`s to its replica sent it nothing, and the replica
committed an empty attempt). The rest of the suite runs the tree interpreted, so these paths run compiled
here: a replicated push (the primary forwards the pieces it stored) and a drain's hand-over (it copies stored
pieces, from memory and from disk, to another daemon); and the Python writer's packer, whose lengths may be
numpy's integers rather than ints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shuffled.server.cluster.replica_ring import candidates
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import Cluster
from tests.image import compiled_modules
from tests.integration.test_durability import expected, read_by_attempt
from tests.shuffles import push
from tests.units import KiB
from tests.wheel import Installed, build_wheel, install_into

APP = "app-compiled"
#: fewer pieces than replica-lag (16), so that a link that sends nothing fails the commit rather than holding it
SIZES = [150 * KiB, 0, 100 * KiB + 5, 20 * KiB]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The compiled wheel of this tree, installed into a directory of its own (built once per module)."""
    work: Path = tmp_path_factory.mktemp("compiled")
    installed = install_into(build_wheel(work, compiled=True), work / "site")
    for module in compiled_modules():
        where = installed.module_file(module)
        assert where.endswith(".so"), f"{module} is not compiled ({where}): setup.py fell back to pure Python"
    return installed


@within(60)
async def test_compiled_daemons_replicate_a_push_and_hand_it_over_on_a_drain(compiled: Installed) -> None:
    """Three compiled daemons with --replicas 2: pushes to d0 are committed on d0 and on its replica x with the
    same bytes; d0 drained, its hand-over copies each attempt (one read back from disk) to the other candidate,
    which serves the same bytes."""

    with Cluster(3, extra=["--replicas", "2"], installed=compiled) as cluster:
        d0 = cluster.daemons[0]
        addrs = [d.addr for d in cluster.daemons]
        x, y = candidates(addrs, {}, d0.addr, APP, 1)
        c0, cx, cy = [await AsyncClient.connect(a) for a in (d0.addr, x, y)]
        await push(c0, APP, 1, 1, SIZES)  # the commit waits for the replica's, of the same lengths
        await c0.flush(APP, 1)  # attempt 1 is copied from disk, attempt 2 from memory
        await push(c0, APP, 1, 2, SIZES)
        s0, sx = await c0.stats(), await cx.stats()
        assert s0["replication"]["forwarded_bytes"] == 2 * sum(SIZES), s0["replication"]
        assert sx["store"]["replica_attempts"] == 2, sx["store"]
        assert await read_by_attempt(cx, 1, 0, len(SIZES), {"": [1, 2]}, app=APP) == expected([1, 2], SIZES)
        drained = await c0.drain(wait=True)
        assert (drained["to_copy"], drained["copied"], drained["failed"]) == (2, 2, 0), drained
        assert drained["copied_bytes"] == 2 * sum(SIZES), drained
        assert await read_by_attempt(cy, 1, 0, len(SIZES), {"": [1, 2]}, app=APP) == expected([1, 2], SIZES)
        for c in (c0, cx, cy):
            await c.close()


#: packs lengths that are not ints (as numpy's are not) into 300-byte groups, plain and compressed; prints
#: whether `packed` is compiled and a digest of the groups
PACK_LENGTHS_OF_ANOTHER_CLASS = """
import hashlib
from shuffled.protocol import packed
from shuffled.protocol.compression import compress_block

class Length:
    def __init__(self, n):
        self.n = n
    def __index__(self):
        return self.n
    __int__ = __index__
    def __add__(self, other):
        return self.n + other
    __radd__ = __add__

lengths = [Length(n) for n in (100, 0, 5000, 3, 3, 3, 0, 70, 1, 900) * 20]
data = bytes(k % 251 for k in range(sum(map(int, lengths))))
digest = hashlib.sha256()
for compressed in (False, True):
    packer = packed.RunPacker.from_lengths(lengths, data)
    while not packer.done:
        into = memoryview(bytearray(300))
        if compressed:
            digest.update(into[: packer.pack_blocks_into(into, 7, compress_block)])
        else:
            digest.update(into[: packer.pack_into(into, 7)])
print(packed.__file__.endswith(".so"), digest.hexdigest())
"""


def test_the_compiled_packer_takes_lengths_that_are_not_ints(compiled: Installed) -> None:
    """Compiled, an annotation is a check: the packer's lengths are read as what `int` takes, so numpy's
    integers (a user's `write_sorted(list(array), data)`) pack into the same groups as interpreted."""
    builds = {"compiled": (compiled.interpreter, compiled.env), "pure": ((sys.executable,), None)}
    out = {}
    for build, (interpreter, env) in builds.items():
        run = subprocess.run(
            [*interpreter, "-c", PACK_LENGTHS_OF_ANOTHER_CLASS], env=env, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, f"{build}: {run.stderr}"
        out[build] = run.stdout.split()
    assert (out["compiled"][0], out["pure"][0]) == ("True", "False")
    assert out["compiled"][1] == out["pure"][1]
