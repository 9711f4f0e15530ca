"""Children cannot outlive their starter (shuffled/children.py): one forked by the main thread gets SIGTERM
when its starter is killed with SIGKILL, as do the daemons of a killed `shuffled demo`; one forked by another
thread is not killed when that thread ends (the kernel would, were the death signal armed there); `stop`
reaches the whole process group, a grandchild included.

And the run's share of what is scarce (tests/reaper.py): a subnet is never one the host routes or another
live run holds, and when none is left the error says where they went.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuffled import children
from tests import reaper
from tests.cluster import poll_until

#: a starter that forks a child (from its main thread) which would run for ever, says the child's pid, waits
STARTER = """
import sys, threading
from shuffled import children
child = children.spawn([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
threading.Event().wait()
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_a_child_gets_sigterm_when_its_starter_is_killed() -> None:
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout is not None
        child = int(starter.stdout.readline())
        assert not _gone(child)
        starter.kill()
        starter.wait(10)
        poll_until(lambda: _gone(child), 10, f"child {child} ended after its starter's SIGKILL")
    finally:
        starter.kill()


def test_the_daemons_of_a_killed_demo_stop() -> None:
    """`shuffled demo` killed once both its daemons are ready (it echoes their ready lines): both end."""
    demo = children.spawn(
        [sys.executable, "-m", "shuffled", "demo", "--megabytes", "4096"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert demo.stdout is not None
        ready = list(itertools.islice((line for line in demo.stdout if " msg=ready " in line), 2))
        daemons = _daemons_of(demo.pid)
        assert len(ready) == 2 and len(daemons) == 2, (ready, daemons)
        demo.kill()
        demo.wait(10)
        poll_until(lambda: all(_gone(pid) for pid in daemons), 10, f"daemons {daemons} ended after the demo's SIGKILL")
    finally:
        children.stop(demo, 5)


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _daemons_of(parent: int) -> list[int]:
    """The `shuffled serve` children of a process."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
            except OSError:
                continue
            if ppid == parent and "shuffled serve" in _cmd(int(entry)):
                found.append(int(entry))
    return found


def test_a_child_forked_by_a_thread_outlives_the_thread_and_stop_reaches_its_group() -> None:
    """No death signal is armed from another thread: it would fire when that thread ends. Once the thread is
    gone the child still answers (a pending signal would be delivered before it runs again); then `stop`
    ends the child and the grandchild it started, its process group."""
    made: list[tuple[subprocess.Popen[str], int]] = []
    shell = "sleep 600 & echo $!; exec cat"  # says its grandchild's pid, then echoes what it is sent

    def fork() -> None:
        child = children.spawn(["sh", "-c", shell], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        made.append((child, threading.get_native_id()))

    thread = threading.Thread(target=fork)
    thread.start()
    thread.join()
    ((child, tid),) = made
    try:
        assert child.stdin is not None and child.stdout is not None
        grandchild = int(child.stdout.readline())
        poll_until(lambda: not Path(f"/proc/self/task/{tid}").exists(), 10, f"thread {tid} gone")
        child.stdin.write("still here\n")
        child.stdin.flush()
        assert child.stdout.readline() == "still here\n", f"the child ended with its thread (code {child.poll()})"
        children.stop(child, 5)
        poll_until(lambda: _gone(grandchild), 10, f"grandchild {grandchild} ended with its group")
    finally:
        children.stop(child, 5)


# -- subnets


@pytest.fixture
def crowded() -> Iterator[tuple[reaper.Run, ipaddress.IPv4Network]]:
    """The host has an address in 198.18.0.0/16 (on a bridge of the test's own, down) and another live run
    holds every /24 of 198.19.0.0/16 but one that neither the host nor a real run has: that one is left. Only
    this process sees the other run (as if its file were there): it must not leave runs at once (the other
    test worker) without subnets."""
    if os.geteuid() != 0:
        pytest.skip("a bridge needs root")
    run = reaper.current()
    link = f"shbr{run.tag()}"
    run.add("link", link)
    other = subprocess.Popen(["sleep", "600"])
    try:
        subprocess.run(["ip", "link", "add", link, "type", "bridge"], check=True, timeout=30)
        subprocess.run(["ip", "addr", "add", "198.18.0.1/16", "dev", link], check=True, timeout=30)
        real = reaper._runs
        taken = reaper._host_networks() | {
            ipaddress.IPv4Network(t[1]) for things in real().values() for t in things if t[0] == "subnet"
        }
        nets = list(ipaddress.IPv4Network("198.19.0.0/16").subnets(new_prefix=24))
        left = next(n for n in nets if not any(n.overlaps(t) for t in taken))
        held = [["subnet", str(n)] for n in nets if n != left]
        with pytest.MonkeyPatch.context() as private:
            private.setattr(reaper, "_runs", lambda: {**real(), reaper.owner_of(other.pid): held})
            yield run, left
    finally:
        other.kill()
        other.wait(10)
        subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
        run.remove("link", link)


def test_a_subnet_is_never_one_the_host_routes_or_another_run_holds(
    crowded: tuple[reaper.Run, ipaddress.IPv4Network],
) -> None:
    run, left = crowded
    net = run.subnet()
    try:
        assert net == left
        with pytest.raises(RuntimeError, match=r"no free /24 left in 198\.18\.0\.0/15: runs' files in"):
            run.subnet()
    finally:
        run.remove("subnet", str(net))
