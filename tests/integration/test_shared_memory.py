"""Pushes through shared memory (PROTOCOL.md §6.3) against a live daemon on its Unix socket: the data is the
data pushed, every segment and slot comes back, the region's name is gone from the host as soon as the
client speaks, a client or daemon killed leaves nothing behind, and a writer that names a slot it was not
given (or lies about a slot's bytes) loses only its own push."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuffled import children
from shuffled.buffers.shm import DIR_PREFIX, MAKING, MAKING_SECONDS, MappedRegion
from shuffled.protocol import codec
from shuffled.protocol.credit import DEFAULT_EXCLUSIVE, DEFAULT_FLOATING
from shuffled.protocol.errors import ErrorCode
from shuffled.protocol.frames import (
    SHM,
    SHM_READ,
    CommitAck,
    CommitMapOutput,
    ErrorResponse,
    Hello,
    HelloAck,
    OpenMapOutput,
    PushData,
    PushPlaced,
    PushSlots,
    Role,
)
from shuffled.protocol.integrity import checksum
from shuffled.protocol.packed import RunPacker
from shuffled_client import AsyncClient
from tests import reaper, small_tmpfs
from tests.aio import within
from tests.cluster import DaemonProcess, free_port, payload, pool_settled, start_daemon, wait_until
from tests.integration.test_bad_input import Raw

SHM_ROOT = "/dev/shm"
#: the daemons here say where their regions go, whatever the default
SHM_ON = ["--shm-dir", SHM_ROOT]
APP = "shm-app"
SEGMENT_KIB = 32


def _own_dir(d: DaemonProcess, root: str = SHM_ROOT) -> str:
    (name,) = (n for n in os.listdir(root) if n.startswith(f"{DIR_PREFIX}{d.pid}-"))
    return os.path.join(root, name)


@pytest.fixture
def shm_root() -> Iterator[str]:
    """A directory of /dev/shm of the test's own, for daemons' directories that no daemon of another test
    (which removes what it takes for abandoned) may see; its name is none a daemon's could be."""
    if not os.path.isdir(SHM_ROOT):
        pytest.skip(f"no {SHM_ROOT} on this host")
    root = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}test-", dir=SHM_ROOT)
    run = reaper.current()
    run.add("dir", root)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
        run.remove("dir", root)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[tuple[DaemonProcess, str]]:
    """A daemon with a Unix socket (so it offers shared memory), and that socket's address."""
    if not os.path.isdir(SHM_ROOT):
        pytest.skip(f"no {SHM_ROOT} on this host")
    sock = tmp_path / "d.sock"
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "64M", ["--unix-socket", str(sock), *SHM_ON])
    try:
        yield d, f"unix:{sock}"
    finally:
        d.stop()


async def _push_and_read(c: AsyncClient, shuffle: int, partitions: int, sizes: list[int]) -> None:
    """One map output per size (attempt = its index), each partition's bytes distinct; every partition read
    back whole from all of them and compared."""
    for attempt, size in enumerate(sizes):
        w = await c.open_writer(APP, shuffle, attempt, attempt, partitions)
        for p in range(partitions):
            await w.write(p, payload(attempt, p, size))
        await w.commit()
    attempts = list(range(len(sizes)))
    async with c.read(APP, shuffle, 0, partitions, {"": attempts}) as r:
        got: dict[tuple[int, int], bytearray] = {}
        async for chunk in r:
            assert chunk.data.readonly, "read-only however it came (in place or through the socket)"
            got.setdefault((chunk.attempt, chunk.partition), bytearray()).extend(chunk.data)
    want = {(a, p): payload(a, p, size) for a, size in enumerate(sizes) for p in range(partitions) if size}
    assert got == want


@within(120)
async def test_pushes_through_shared_memory_store_what_was_pushed_and_give_everything_back(
    local: tuple[DaemonProcess, str],
) -> None:
    d, address = local
    async with await AsyncClient.connect(address) as c:
        assert c.session.region is not None, "a client of the Unix socket gets a region"
        files = _files(d)  # named until the client speaks: held open to count their pages
        before = (await c.stats())["traffic"]
        # wide map outputs of small blocks (thousands of partitions, AQE's shape) and a large one of few
        await _push_and_read(c, 1, 2000, [37, 0, 211])
        await _push_and_read(c, 2, 3, [3 << 20])
        # several writers at once share the connection's region
        await asyncio.gather(*(_push_and_read(c, 10 + i, 50, [20_000, 7_000]) for i in range(4)))
        after = (await c.stats())["traffic"]
        placed = after["placed_buffers"] - before["placed_buffers"]
        assert placed == after["pushed_buffers"] - before["pushed_buffers"] > 100, after
        await c.remove_application(APP)
        s = await pool_settled(c)
        assert s["pool"]["used"] == 0, s["pool"]
        # the region holds what is in flight only: slots are reused, a few push windows' worth of pages in all,
        # and what the reads' credit let the daemon put in it for them (the four reads at once above)
        read_kib = 4 * (DEFAULT_EXCLUSIVE + DEFAULT_FLOATING) * SEGMENT_KIB
        pushes, reads = _held_kib(files["push"]), _held_kib(files["read"])
        assert 0 < pushes <= 8 * 16 * SEGMENT_KIB and 0 < reads <= read_kib, (pushes, reads)
    assert os.listdir(_own_dir(d)) == []
    # the connection gone, the region's pages go back to the host
    try:
        held = lambda: asyncio.sleep(0, sum(map(_held_kib, files.values())))  # noqa: E731
        await wait_until(held, lambda kib: kib < 512, 10, "pages freed")
    finally:
        for fd in files.values():
            os.close(fd)


def _files(d: DaemonProcess, how: int = os.O_RDONLY) -> dict[str, int]:
    """The region's two files (a client's that reads in place, before it spoke), open: "push", the one the
    client may write, and "read", the one it may only read."""
    files = {}
    for name in os.listdir(_own_dir(d)):
        fd = os.open(os.path.join(_own_dir(d), name), how)
        files["push" if os.fstat(fd).st_mode & stat.S_IWGRP else "read"] = fd
    assert len(files) == 2, files
    return files


def _held_kib(fd: int) -> int:
    """KiB of pages the file open as `fd` holds on its tmpfs."""
    return os.fstat(fd).st_blocks // 2


@within(60)
async def test_the_region_has_no_name_on_the_host_once_the_client_speaks(local: tuple[DaemonProcess, str]) -> None:
    d, address = local
    directory = _own_dir(d)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o711, "others may pass through, not list"
    c = await AsyncClient.connect(address)
    try:
        names = os.listdir(directory)  # named until the client's first frame after the handshake
        modes = sorted(stat.S_IMODE(os.stat(os.path.join(directory, name)).st_mode) for name in names)
        # for whom the Unix socket is (its default mode 0660: owner and group), never for others; the read
        # slots' file only to read
        owners = {os.stat(os.path.join(directory, name)).st_uid for name in names}
        assert modes == [0o440, 0o660] and owners == {os.geteuid()}
        assert {len(name) for name in names} == {32}, "random names nobody can guess"
        await c.stats()
        assert os.listdir(directory) == []
    finally:
        await c.close()
    # a client that never speaks: the name goes with its connection
    silent = await AsyncClient.connect(address)
    assert len(os.listdir(directory)) == 2
    await silent.close()
    await wait_until(lambda: asyncio.sleep(0, os.listdir(directory)), lambda names: names == [], 10, "unlinked")


@within(60)
async def test_without_shared_memory_a_local_client_pushes_through_the_socket(tmp_path: Path) -> None:
    sock = tmp_path / "d.sock"
    flags = ["--unix-socket", str(sock), "--shm-dir", "none"]
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "32M", flags)
    try:
        assert not any(n.startswith(f"{DIR_PREFIX}{d.pid}-") for n in os.listdir(SHM_ROOT))
        async with await AsyncClient.connect(f"unix:{sock}") as c:
            assert c.session.region is None
            await _push_and_read(c, 1, 10, [50_000])
            assert (await c.stats())["traffic"]["placed_buffers"] == 0
        async with await AsyncClient.connect(f"unix:{sock}", shared_memory=False) as c:
            assert c.session.region is None
    finally:
        d.stop()


def _as_user(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


CHILD_PUSH = """
import asyncio, sys
sys.path[:0] = sys.argv[3:]
from shuffled_client import AsyncClient
from tests.cluster import payload

async def main(address):
    async with await AsyncClient.connect(address) as c:
        print("region" if c.session.region is not None else "socket", flush=True)
        w = await c.open_writer("child-app", 1, 0, 0, 4)
        for p in range(4):
            await w.write(p, payload(0, p, 300_000))
        await w._flush()  # its data is in the daemon's slots, the push still open
        print("pushed", flush=True)
        await asyncio.sleep(3600)  # until killed

asyncio.run(main(sys.argv[1]))
"""


def _pusher(address: str) -> subprocess.Popen[str]:
    """A client process that pushes part of a map output through shared memory and holds the push open."""
    root = str(Path(__file__).resolve().parents[2])
    paths = [root, os.path.join(root, "client", "python")]
    return children.spawn([sys.executable, "-c", CHILD_PUSH, address, *paths], stdout=subprocess.PIPE, text=True)


@within(90)
async def test_a_client_killed_mid_push_gives_its_segments_and_slots_back(local: tuple[DaemonProcess, str]) -> None:
    d, address = local
    child = _pusher(address)
    try:
        assert child.stdout is not None
        lines = [await asyncio.to_thread(child.stdout.readline) for _ in range(2)]
        assert lines == ["region\n", "pushed\n"], lines
        async with await AsyncClient.connect(address, shared_memory=False) as watcher:
            held = (await watcher.stats())["pool"]["used"]
            assert held > 0, "the open push holds what it placed"
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            s = await pool_settled(watcher)
            assert s["pool"]["used"] == 0 and s["streams"]["pushing"] == 0, s
    finally:
        child.kill()
        child.wait(10)
    assert os.listdir(_own_dir(d)) == []


#: a client of another user, in the system's Python alone (it need not read this tree): says Hello asking for
#: shared memory, prints the HelloAck's bytes, then tries to open the path it is given on stdin
OTHER_USER = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(bytes.fromhex(sys.argv[2]))
head = s.recv(12, socket.MSG_WAITALL)
body = s.recv(int.from_bytes(head[:4], "big"), socket.MSG_WAITALL)
print((head + body).hex(), flush=True)
for line in sys.stdin:
    path, how = line.split()
    try:
        os.close(os.open(path, os.O_RDWR if how == "rw" else os.O_RDONLY))
        print("opened", flush=True)
    except OSError as exc:
        print(exc.errno, flush=True)
"""


def _other_user(sock: str, uid: int) -> tuple[subprocess.Popen[str], HelloAck]:
    hello = codec.encode(Hello(Role.CLIENT, info={"features": [SHM, SHM_READ]})).hex()
    child = children.spawn(
        ["/usr/bin/python3", "-S", "-c", OTHER_USER, sock, hello],
        preexec=lambda: _as_user(uid),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    assert child.stdout is not None
    (ack,) = codec.decode_all(bytes.fromhex(child.stdout.readline()))
    assert isinstance(ack, HelloAck), ack
    return child, ack


def _try_open(child: subprocess.Popen[str], path: str, how: str = "rw") -> str:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(f"{path} {how}\n")
    child.stdin.flush()
    return child.stdout.readline().strip()


def test_a_region_is_its_clients_alone(tmp_path: Path) -> None:
    """The daemon (root here) gives a client of another user a region that user may open, and no other: the
    push slots' file to read and write, the read slots' file only to read."""
    if os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs root and the system's python3 to run clients as other users")
    nobody = pwd.getpwnam("nobody").pw_uid
    where = Path(tempfile.mkdtemp(prefix="shm-users-"))
    where.chmod(0o755)
    sock = str(where / "d.sock")
    flags = ["--unix-socket", sock, "--unix-socket-mode", "0666", *SHM_ON]
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "32M", flags)
    try:
        owner, ack = _other_user(sock, nobody)
        path, reads = ack.info["shm"]["path"], ack.info["shm"]["reads"]["path"]
        assert os.stat(path).st_uid == nobody and stat.S_IMODE(os.stat(path).st_mode) == 0o660
        assert os.stat(reads).st_uid == nobody and stat.S_IMODE(os.stat(reads).st_mode) == 0o440
        stranger, _ = _other_user(sock, nobody - 1)
        try:
            assert _try_open(stranger, path) == str(errno.EACCES), "another user knowing the name cannot open it"
            assert _try_open(stranger, reads, "r") == str(errno.EACCES)
            assert _try_open(owner, path) == "opened"
            assert _try_open(owner, reads, "r") == "opened"
            assert _try_open(owner, reads) == str(errno.EACCES), "the read slots only to read"
        finally:
            for child in (owner, stranger):
                child.kill()
                child.wait(10)
    finally:
        d.stop()
        shutil.rmtree(where, ignore_errors=True)


def test_a_daemon_killed_leaves_its_directory_to_the_next_one(tmp_path: Path, shm_root: str) -> None:
    """...and only then: a directory whose owner's process id is not running here, but whose lock is held (a
    live daemon in another PID namespace sharing the directory), is kept; so is one being made (not locked
    yet, under its making name) unless it is older than any making takes."""
    sock = tmp_path / "d.sock"
    flags = ["--unix-socket", str(sock), "--shm-dir", shm_root]
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "32M", flags)
    directory = _own_dir(d, shm_root)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    assert os.path.isdir(directory)
    elsewhere = os.path.join(shm_root, f"{DIR_PREFIX}{2**22 + 7}-{os.getpid():x}")  # no such pid here
    young, old = (os.path.join(shm_root, f"{DIR_PREFIX}{MAKING}-{2**22 + 7}-{age}") for age in ("young", "old"))
    for made in (elsewhere, young, old):
        os.mkdir(made)
    stale = time.time() - 2 * MAKING_SECONDS
    os.utime(old, (stale, stale))
    held = os.open(elsewhere, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        again = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "32M", flags)
        try:
            assert not os.path.exists(directory)
            assert os.path.isdir(elsewhere), "a directory whose owner holds its lock stays"
            assert os.path.isdir(young) and not os.path.exists(old)
            mine = _own_dir(again, shm_root)
        finally:
            again.stop()
        assert not os.path.exists(mine), "a daemon stopping removes its directory"
    finally:
        os.close(held)


class _Local(Raw):
    """A hand-driven client of the Unix socket that asks for shared memory."""

    region: MappedRegion

    @classmethod
    async def dial(cls, address: str) -> _Local:
        raw = cls(*await asyncio.open_unix_connection(address.removeprefix("unix:")))
        await raw.send(codec.encode(Hello(Role.CLIENT, info={"features": [SHM]})))
        ack = await raw.frame()
        assert isinstance(ack, HelloAck) and ack.info["features"] == [SHM], ack
        raw.region = MappedRegion(ack.info["shm"]["path"], ack.info["shm"]["size"], ack.info["segment_size"])
        return raw

    async def open_push(self, writer: int, attempt: int) -> list[int]:
        await self.send(codec.encode(OpenMapOutput(writer, APP, 7, attempt, attempt, 2)))
        credit = await self.frame()
        assert isinstance(credit, PushSlots) and credit.writer == writer, credit
        return credit.slots

    def place(self, slot: int, attempt: int, data: bytes) -> tuple[int, int]:
        """A packed group of `data` for partition 1 in `slot`: (its length, its CRC32C)."""
        place = self.region.slot(slot)
        n = RunPacker((1,), (len(data),), data).pack_into(place, attempt)
        return n, checksum(place[:n])


@within(60)
async def test_a_writer_that_names_a_slot_not_its_own_or_lies_about_it_loses_only_its_push(
    local: tuple[DaemonProcess, str],
) -> None:
    _, address = local
    raw = await _Local.dial(address)
    try:
        mine = await raw.open_push(1, 1)
        other = await raw.open_push(2, 2)
        assert not set(mine) & set(other), "each push gets slots of its own"
        # push 1 names a slot granted to push 2: a credit violation on push 1's stream
        await raw.send(codec.encode(PushPlaced(1, [0, 0, other[0], 100])))
        err = await raw.frame()
        assert isinstance(err, ErrorResponse) and err.stream == 1 and err.code == ErrorCode.CREDIT_VIOLATION, err
        # push 2's bytes in its own slot, with a CRC that does not match them
        n, crc = raw.place(other[0], 2, b"x" * 1000)
        await raw.send(codec.encode(PushPlaced(2, [0, crc ^ 1, other[0], n])))
        err = await raw.frame()
        assert isinstance(err, ErrorResponse) and err.stream == 2 and err.code == ErrorCode.CORRUPT_DATA, err
        # a length no slot holds
        third = await raw.open_push(3, 3)
        await raw.send(codec.encode(PushPlaced(3, [0, 0, third[0], raw.region.slot_size + 1])))
        err = await raw.frame()
        assert isinstance(err, ErrorResponse) and err.stream == 3 and err.code == ErrorCode.INVALID_REQUEST, err
        # one frame naming three groups, the second in a slot of another push: the push ends at the second
        # (the first's slot free again), and the third is never looked at
        good = await raw.open_push(4, 4)
        fifth = await raw.open_push(5, 5)
        n, crc = raw.place(fifth[0], 5, b"z" * 700)
        await raw.send(codec.encode(PushPlaced(5, [0, crc, fifth[0], n, 1, 0, good[0], 100, 2, 0, fifth[1], 100])))
        err = await raw.frame()
        assert isinstance(err, ErrorResponse) and err.stream == 5 and err.code == ErrorCode.CREDIT_VIOLATION, err
        # three full groups in slots that follow each other (copied in one call), the second's CRC wrong
        sixth = sorted(await raw.open_push(6, 6))
        assert sixth[:3] == list(range(sixth[0], sixth[0] + 3)), sixth
        head = raw.place(sixth[0], 6, b"-")[0] - 1  # a group's bytes besides its data
        entries = []
        for i in range(3):
            n, crc = raw.place(sixth[i], 6, bytes([i]) * (raw.region.slot_size - head))
            assert n == raw.region.slot_size
            entries += [i, crc ^ (i == 1), sixth[i], n]
        await raw.send(codec.encode(PushPlaced(6, entries)))
        err = await raw.frame()
        assert isinstance(err, ErrorResponse) and err.stream == 6 and err.code == ErrorCode.CORRUPT_DATA, err
        async with await AsyncClient.connect(address) as c:  # only push 4's credit holds slots now
            credit = (await c.stats())["credit"]
        assert credit["push_slots"] == credit["push_outstanding"] == len(good), credit
        # the connection serves on: a push done right, three groups in one frame, commits
        entries = []
        for i, size in enumerate((5000, 1, 3000)):
            n, crc = raw.place(good[i], 4, b"y" * size)
            entries += [i, crc, good[i], n]
        await raw.send(codec.encode(PushPlaced(4, entries)) + codec.encode(CommitMapOutput(4, 3)))
        ack = await raw.frame()
        assert isinstance(ack, CommitAck) and ack.lengths == [0, 8001], ack
    finally:
        raw.writer.close()
    async with await AsyncClient.connect(address) as c:
        await c.remove_application(APP)
        assert (await pool_settled(c))["pool"]["used"] == 0


@within(60)
async def test_slot_credit_spent_on_push_data_frees_its_slots(tmp_path: Path) -> None:
    """A writer may spend slot credit on PushData through the socket (credit is counted, not its kind): the
    slots that credit stood for are free again, so the slots granted never outnumber the credit outstanding
    (else a writer resending duplicates, which cost no memory, piled up granted slots until the region had
    none and the daemon failed its frames). A PushPlaced naming one of them has no credit behind it: its
    push fails, and nothing is lost. The frames go in one write, so the daemon takes them in one turn."""
    if not os.path.isdir(SHM_ROOT):
        pytest.skip(f"no {SHM_ROOT} on this host")
    sock = tmp_path / "d.sock"
    d = start_daemon(
        "127.0.0.1", free_port(["127.0.0.1"]), "64M", ["--unix-socket", str(sock), *SHM_ON, "--push-window", "2"]
    )
    try:
        raw = await _Local.dial(f"unix:{sock}")
        try:
            slots = await raw.open_push(1, 1)
            assert len(slots) == 2, slots
            groups = []
            for slot in slots:
                n, _ = raw.place(slot, 1, b"d" * 100)
                groups.append((n, bytes(raw.region.slot(slot)[:n])))
            spent = b"".join(codec.encode(PushData(1, seq, n, g)) for seq, (n, g) in enumerate(groups))
            # the two groups through the socket, then the same two again and again: duplicates, dropped (they
            # cost no memory), each using a credit the daemon grants again as slots
            for _ in range(4):
                await raw.send(spent)
                slots = []
                while len(slots) < 2:  # the credit the round used, told again
                    credit = await raw.frame()
                    assert isinstance(credit, PushSlots) and credit.writer == 1, credit
                    slots += credit.slots
                async with await AsyncClient.connect(f"unix:{sock}") as c:
                    held = (await c.stats())["credit"]
                assert held["push_slots"] <= held["push_outstanding"] == 2, held
            n, crc = raw.place(slots[0], 1, b"p" * 100)
            await raw.send(spent + codec.encode(PushPlaced(1, [2, crc, slots[0], n])))
            err = await raw.frame()
            assert isinstance(err, ErrorResponse) and err.stream == 1 and err.code == ErrorCode.CREDIT_VIOLATION, err
            async with await AsyncClient.connect(f"unix:{sock}") as c:
                credit = (await c.stats())["credit"]
                assert credit["push_slots"] == credit["push_outstanding"] == 0, credit
                await c.remove_application(APP)
                assert (await pool_settled(c))["pool"]["used"] == 0
        finally:
            raw.writer.close()
    finally:
        d.stop()


@within(60)
async def test_a_client_that_shrinks_its_region_loses_only_its_own_push_and_the_daemon_serves_on(
    local: tuple[DaemonProcess, str],
) -> None:
    """A client holds its region's file open read-write and may shrink it under the daemon (`ftruncate`); a
    daemon that copied through its own mapping died of SIGBUS there, every client's shuffles with it. Now the
    shrinking client's push fails on its stream with the reason (its connection serves on), and a read in
    place into slots used before the region was shrunk is exact (the daemon's write grows the file back)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to open the read slots' file (no write bits) to write, as its owner could after chmod")
    d, address = local
    directory = _own_dir(d)
    raw = await _Local.dial(address)
    (name,) = os.listdir(directory)  # named until the client speaks: open it as the client may
    fd = os.open(os.path.join(directory, name), os.O_RDWR)
    try:
        slots = await raw.open_push(1, 1)
        n, crc = raw.place(slots[0], 1, b"x" * 1000)
        os.ftruncate(fd, 0)
        await raw.send(codec.encode(PushPlaced(1, [0, crc, slots[0], n])))
        err = await raw.frame()
        assert isinstance(err, ErrorResponse) and err.stream == 1, err
        assert err.code == ErrorCode.INVALID_REQUEST and "shrunk" in err.message, err
        await raw.send(codec.encode(OpenMapOutput(2, APP, 7, 2, 2, 2)))
        credit = await raw.frame()
        assert isinstance(credit, PushSlots) and credit.writer == 2, credit  # the connection serves on
        async with await AsyncClient.connect(address) as c:  # the failed push's slots free, once each
            held = (await c.stats())["credit"]
        assert held["push_slots"] == held["push_outstanding"] == len(credit.slots), held
    finally:
        os.close(fd)
        raw.writer.close()
    async with await AsyncClient.connect(address) as writer:
        w = await writer.open_writer(APP, 2, 0, 0, 3)
        await w.write_sorted([300_000, 0, 200_000], payload(0, 0, 500_000))
        await w.commit()
        reader = await AsyncClient.connect(address)
        files = _files(d, os.O_RDWR)  # the read slots' file opened to write, as its owner could after a chmod
        try:
            for shrink in (False, True):  # the second read reuses the first one's slots, which keep their pages
                if shrink:
                    os.ftruncate(files["read"], 0)
                before = (await reader.stats())["traffic"]["read_placed_buffers"]
                async with reader.read(APP, 2, 0, 3, {"": [0]}) as r:
                    got = b"".join([bytes(chunk.data) async for chunk in r])
                assert got == payload(0, 0, 500_000)
                assert (await reader.stats())["traffic"]["read_placed_buffers"] > before, "read in place"
        finally:
            for fd in files.values():
                os.close(fd)
            await reader.close()
        await writer.remove_application(APP)
        assert (await pool_settled(writer))["pool"]["used"] == 0
    assert d.proc.poll() is None, "the daemon lives"


#: in the daemon's mount namespace: connect, then (with "fill") fill the region's tmpfs and push, which must
#: go through the socket; then push again with room, which must go through shared memory again
SMALL_TMPFS = """
import asyncio, os, sys
sys.path[:0] = sys.argv[4:]
from shuffled_client import AsyncClient
from tests.cluster import payload

async def push(c, shuffle):
    before = (await c.stats())["traffic"]
    w = await c.open_writer("tmpfs-app", shuffle, 0, shuffle, 2)
    await w.write(1, payload(shuffle, 1, 2_000_000))
    await w.commit()
    async with c.read("tmpfs-app", shuffle, 1, 2, {"": [shuffle]}) as r:
        assert b"".join([bytes(chunk.data) async for chunk in r]) == payload(shuffle, 1, 2_000_000)
    after = (await c.stats())["traffic"]
    keys = ("pushed_buffers", "placed_buffers", "served_local_buffers", "read_placed_buffers")
    return [after[k] - before[k] for k in keys]

async def main(address, fill, shm):
    async with await AsyncClient.connect(address) as c:
        print("region" if c.session.region is not None else "socket", flush=True)
        filler = os.path.join(shm, "filler")
        if fill == "fill":
            with open(filler, "wb") as f:
                try:
                    while True:
                        f.write(bytes(1 << 20))
                        f.flush()
                except OSError:
                    pass
            print("full", *await push(c, 1), flush=True)
            os.unlink(filler)
        print("room", *await push(c, 2), flush=True)

asyncio.run(main(*sys.argv[1:4]))
"""


@pytest.mark.parametrize(("size", "fill"), [("16m", "as is"), ("48m", "fill")])
def test_a_region_needs_room_for_the_pool_and_a_full_tmpfs_sends_pushes_through_the_socket(
    tmp_path: Path, size: str, fill: str
) -> None:
    """A daemon whose shm-dir has less room than its pool offers no region (its clients push through the
    socket). One whose tmpfs fills up later grants the credit it has no room for as PushCredit: the push goes
    through the socket, exact, instead of failing or the writer dying of SIGBUS on a page that cannot be
    had; once there is room again pushes go through shared memory. Reads meanwhile come through the socket
    (said once in the log too), exact."""
    if (why := small_tmpfs.why_not()) is not None:
        pytest.skip(why)
    with small_tmpfs.tmpfs_daemon(tmp_path, size) as where:
        root = str(Path(__file__).resolve().parents[2])
        client = where.enter(sys.executable, "-c", SMALL_TMPFS)
        argv = [*client, where.unix, fill, str(where.shm), root, os.path.join(root, "client", "python")]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        lines = [line.split() for line in done.stdout.splitlines()]
        log = list(where.daemon.log)
    if fill == "as is":
        assert lines[0] == ["socket"] and lines[1][0] == "room" and lines[1][2] == "0", lines
        assert any("less than the pool" in line for line in log), log[-5:]  # said in the daemon's log
    else:
        assert lines[0] == ["region"] and lines[1][0] == "full" and lines[2][0] == "room", lines
        full, room = ([int(n) for n in line[1:]] for line in lines[1:])
        full_pushed, full_placed, full_served, full_read_placed = full
        assert full_pushed > 50 and full_placed < full_pushed, lines  # through the socket, mostly or all
        assert full_served > 50 and full_read_placed < full_served, lines  # reads too
        assert room[1] == room[0] > 50, lines  # room again: pushes through shared memory
        assert sum("pushes through the socket" in line for line in log) == 1, log[-5:]
        assert sum("reads through the socket" in line for line in log) == 1, log[-5:]
