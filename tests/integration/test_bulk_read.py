"""The bulk read (`PartitionReader.groups()`, `Reader.groups()`) against real daemons: one view per packed
group, whose directory and data hold exactly the runs the per-run iteration hands out.

Two peered daemons. Map outputs of many shapes (empty partitions, tiny ones that the serving daemon combines
several to a BufferResponse, partitions spanning several groups) are pushed into one and read back in
ranges from it and relayed through the other, with the asyncio and the blocking client. The runs a group
describes must be exactly the bytes written per (partition, attempt), in the order the per-run read gives;
a group is gone once iteration moves on; a compressed read refuses groups (its runs decompress one by one);
every buffer goes back to the client's pool and the daemons'.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from shuffled_client import AsyncClient, Client, ReadGroup
from tests.aio import within
from tests.cluster import Cluster, cluster_fixture, payload, pool_settled
from tests.pieces import check, group_runs

APP = "bulk-app"
PARTITIONS = 9
TIMEOUT = 60

pair = cluster_fixture(2)


def size(attempt: int, partition: int) -> int:
    """Bytes `attempt` writes to `partition`: nothing to every third, a few bytes, or up to three segments."""
    if partition % 3 == attempt % 3:
        return 0
    if attempt % 2:
        return 7 + partition
    return [40_000, 1, 100_000, 3_000][partition % 4] + attempt


ATTEMPTS = list(range(1, 13))


def runs(groups: Iterable[tuple[int, tuple[int, ...], tuple[int, ...], bytes]]) -> list[tuple[int, int, bytes]]:
    """The (attempt, partition, bytes) runs that groups (attempt, partitions, lengths, data) describe."""
    return [run for group in groups for run in group_runs(*group)]


def flat(group: ReadGroup) -> tuple[int, tuple[int, ...], tuple[int, ...], bytes]:
    return group.attempt, tuple(group.partitions), tuple(group.lengths), bytes(group.data)


def want(lo: int, hi: int) -> dict[tuple[int, int], bytes]:
    return {(p, a): payload(a, p, size(a, p)) for a in ATTEMPTS for p in range(lo, hi) if size(a, p)}


async def push_all(client: AsyncClient, shuffle: int) -> None:
    for a in ATTEMPTS:
        writer = await client.open_writer(APP, shuffle, a, a, PARTITIONS)
        for p in range(PARTITIONS):
            if size(a, p):
                await writer.write(p, payload(a, p, size(a, p)))
        assert await writer.commit() == [size(a, p) for p in range(PARTITIONS)]


@within(TIMEOUT)
async def test_groups_hold_exactly_the_runs_read_locally_and_relayed(pair: Cluster) -> None:
    a, b = pair.daemons
    async with await AsyncClient.connect(a.addr) as near, await AsyncClient.connect(b.addr) as far:
        await push_all(far, 1)
        groups = served = 0
        for client, where in ((far, ""), (near, b.addr)):  # from the daemon holding it, and relayed
            for lo, hi in ((0, PARTITIONS), (0, 1), (2, 7), (8, 9)):
                before = (await far.stats())["traffic"]["served_local_buffers"]
                async with client.read(APP, 1, lo, hi, {where: ATTEMPTS}) as reader:
                    got = [flat(g) async for g in reader.groups()]
                served += (await far.stats())["traffic"]["served_local_buffers"] - before
                groups += len(got)
                async with client.read(APP, 1, lo, hi, {where: ATTEMPTS}) as reader:
                    per_run = [(c.attempt, c.partition, bytes(c.data)) async for c in reader]
                check(runs(got), want(lo, hi))
                # the same bytes in the same order as the per-run read (whose runs may be cut elsewhere)
                assert b"".join(g[3] for g in got) == b"".join(r[2] for r in per_run)
        assert groups > served, f"{groups} groups in {served} buffers: no buffer carried several groups"
        await far.unregister_shuffle(APP, 1)
        for c in (near, far):
            assert c.session.pool is not None and c.session.pool.used == 0
            assert (await pool_settled(c))["pool"]["used"] == 0


@within(TIMEOUT)
async def test_a_group_is_gone_once_iteration_moves_on_and_an_early_close_gives_every_buffer_back(
    pair: Cluster,
) -> None:
    async with await AsyncClient.connect(pair.daemons[0].addr) as client:
        await push_all(client, 2)
        assert client.session.pool is not None
        async with client.read(APP, 2, 0, PARTITIONS, {"": ATTEMPTS}) as reader:
            first = await reader.next_group()
            assert first is not None and len(first.data) == sum(first.lengths)
            second = await reader.next_group()
            assert second is not None
            with pytest.raises(ValueError, match="released"):
                first.data  # noqa: B018 (the access is what is tested)
            with pytest.raises(ValueError, match="released"):  # read from the buffer, which may hold another's
                first.partitions  # noqa: B018
            with pytest.raises(ValueError, match="one kind of iteration"):
                await reader.next_chunk()
            assert client.session.pool.used > 0  # stops with buffers queued and one handed out
        assert client.session.pool.used == 0
        with pytest.raises(ValueError, match="released"):
            second.data  # noqa: B018
        await client.unregister_shuffle(APP, 2)
        assert (await pool_settled(client))["pool"]["used"] == 0


@within(TIMEOUT)
async def test_a_compressed_read_refuses_groups_and_its_chunks_still_decompress(pair: Cluster) -> None:
    async with await AsyncClient.connect(pair.daemons[0].addr) as client:
        text = b"".join(b"row %d, some repeated text\n" % i for i in range(5_000))
        writer = await client.open_writer(APP, 3, 0, 31, 2, compression="lz4")
        await writer.write(1, text)
        await writer.commit()
        async with client.read(APP, 3, 0, 2, {"": [31]}, compression="lz4") as reader:
            with pytest.raises(ValueError, match="compressed read"):
                await reader.next_group()
        reader = client.read(APP, 3, 0, 2, {"": [31]}, compression="lz4")
        assert await reader.read_all() == text  # read_all decompresses a run at a time
        await client.unregister_shuffle(APP, 3)
        assert (await pool_settled(client))["pool"]["used"] == 0


def test_the_blocking_client_reads_groups_and_read_all_joins_them(pair: Cluster) -> None:
    a, b = pair.daemons
    with Client(b.addr, timeout=10) as far, Client(a.addr, timeout=10) as near:
        for attempt in ATTEMPTS[:4]:
            writer = far.open_writer(APP, 4, attempt, attempt, PARTITIONS)
            writer.write_sorted(
                [size(attempt, p) for p in range(PARTITIONS)],
                b"".join(payload(attempt, p, size(attempt, p)) for p in range(PARTITIONS)),
            )
            writer.commit()
        expected = {k: v for k, v in want(1, 6).items() if k[1] in ATTEMPTS[:4]}
        with near.read(APP, 4, 1, 6, {b.addr: ATTEMPTS[:4]}) as reader:
            check(runs(flat(g) for g in reader.groups()), expected)
        joined = near.read(APP, 4, 1, 6, {b.addr: ATTEMPTS[:4]}).read_all()
        with near.read(APP, 4, 1, 6, {b.addr: ATTEMPTS[:4]}) as reader:
            assert joined == b"".join(bytes(c.data) for c in reader)
        far.unregister_shuffle(APP, 4)
