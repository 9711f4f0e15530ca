"""Everything a test session or a benchmark run starts or makes on the machine, removed when that run ends,
however it ends: also when it is killed with SIGKILL, and no `finally` of its own runs.

A run has an owner, the process that started it (the pytest session, `python -m benchmarks`), named by its
pid and start time (`owner_of`, so that a reused pid is not mistaken for it). What the owner leaves behind is found
two ways:

- processes: the owner puts ``SHUFFLED_OWNER_<owner>=1`` in its own environment, so every process it starts,
  and every process those start (a Spark worker's executors, a daemon inside ``ip netns exec``), carries it;
  reading ``/proc/*/environ`` finds them all, whatever started them and whichever process group they are in;
- things that are not processes (network namespaces, links, tmpfs mounts, podman containers, pods and
  networks, subnets, scratch directories outside pytest's own): written to the run's file in `STATE` as
  they are made, and crossed off when removed.

`current()` makes the run on first use: it first reaps every earlier run whose owner is gone, then starts a
watcher, this file run as a script, whose standard input is a pipe only the owner holds. When the owner ends,
the pipe closes and the watcher reaps the run at once: processes SIGTERM, then SIGKILL after `GRACE`
seconds, then containers, mounts, namespaces, links and directories, then the run's file. A watcher killed
too is covered by the next run's start.

The run's file is also how runs share what is scarce without colliding: `subnet()` hands out a /24 of
198.18.0.0/15 that no run's file holds and that no address or route of the host overlaps, and `tag()` a
short name part that no namespace, link or run uses (under a lock on `STATE`, so two runs starting at once
cannot pick the same). Only the standard library: the watcher runs without the project on its path.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

#: where runs' files live: /run is a tmpfs, emptied (as are namespaces and links) when the machine restarts
STATE = Path("/run/shuffled-runs") if os.geteuid() == 0 else Path(tempfile.gettempdir(), f"shuffled-runs-{os.getuid()}")
MARKER = "SHUFFLED_OWNER_"
T = TypeVar("T")
#: the benchmarking range (RFC 2544): addresses of simulated hosts and pod networks, never routed off the machine
RANGE = ipaddress.IPv4Network("198.18.0.0/15")
#: seconds processes get between SIGTERM (a daemon drains, a JVM runs its shutdown hooks) and SIGKILL
GRACE = 3.0
#: seconds the watcher waits for SIGKILLed processes to be gone before it goes on with the rest
KILL_WAIT = 5.0


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None if it is gone or only a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def owner_of(pid: int) -> str:
    """The owner name of a running process (``<pid>_<start time>``)."""
    start = _start_time(pid)
    if start is None:
        raise ProcessLookupError(pid)
    return f"{pid}_{start}"


def alive(owner: str) -> bool:
    pid, _, start = owner.partition("_")
    return _start_time(int(pid)) == start


def _ip(*argv: str) -> subprocess.CompletedProcess[str]:
    """`ip ARGV`; without iproute2 (no namespaces or links can have been made) an empty answer."""
    try:
        return subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return subprocess.CompletedProcess(["ip", *argv], 127, "", "ip: not installed")


def supported() -> bool:
    """Whether runs can be watched here: Linux's /proc names processes' start times and environments."""
    return Path("/proc/self/environ").exists()


# --------------------------------------------------------------------------- processes


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def marked(owner: str) -> list[int]:
    """Live processes (not zombies) that carry the owner's mark, but not this one."""
    mark = f"{MARKER}{owner}=".encode()
    me = os.getpid()
    return [
        pid
        for pid in _pids()
        if pid != me and any(v.startswith(mark) for v in _environ(pid)) and _start_time(pid) is not None
    ]


def _orphaned_owners() -> set[str]:
    """Owners named in any process's marks that are gone: what their processes belong to is left over."""
    owners: set[str] = set()
    for pid in _pids():
        for var in _environ(pid):
            if var.startswith(MARKER.encode()):
                owners.add(var[len(MARKER) :].partition(b"=")[0].decode(errors="replace"))
    return {o for o in owners if re.fullmatch(r"\d+_\d+", o) and not alive(o)}


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if sig == signal.SIGTERM:
                os.kill(pid, signal.SIGCONT)  # a stopped process (a fault of the tests) cannot act on SIGTERM
            os.kill(pid, sig)


def _gone_within(find: Callable[[], list[T]], seconds: float) -> list[T]:
    """Polls ``find()`` (what is still there) until it is empty or `seconds` passed; what is left."""
    deadline = time.monotonic() + seconds
    left = find()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting for processes to exit: /proc offers nothing to block on
        left = find()
    return left


def stop_processes(owner: str, namespaces: list[str]) -> list[int]:
    """SIGTERM to every process of the run (its marks, and whatever runs in its namespaces), SIGKILL to what is
    left after `GRACE`; returns the pids that even SIGKILL did not remove within `KILL_WAIT`."""

    def find() -> list[int]:
        inside = [int(p) for ns in namespaces for p in _ip("netns", "pids", ns).stdout.split()]
        return sorted({*marked(owner), *(p for p in inside if p != os.getpid() and _start_time(p) is not None)})

    _signal_all(find(), signal.SIGTERM)
    left = _gone_within(find, GRACE)
    _signal_all(left, signal.SIGKILL)
    return _gone_within(find, KILL_WAIT)


# --------------------------------------------------------------------------- the runs' files


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """The lock every run takes to read the others' files and change its own."""
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _read(path: Path) -> list[list[Any]]:
    try:
        return list(json.loads(path.read_text())["things"])
    except (OSError, ValueError, KeyError):
        return []


def things(owner: str) -> list[list[Any]]:
    """What the run's file lists (nothing once the run was reaped)."""
    return _read(STATE / f"{owner}.json")


def _runs() -> dict[str, list[list[Any]]]:
    if not STATE.is_dir():
        return {}
    return {p.stem: _read(p) for p in STATE.glob("*.json")}


def _write(owner: str, things: list[list[Any]]) -> None:
    path = STATE / f"{owner}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"owner": owner, "things": things}))
    tmp.replace(path)


# --------------------------------------------------------------------------- reaping


def _podman(argv: list[str], conf: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": conf} if conf else None
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120, env=env)


def remove_podman(argv: list[str], conf: str, label: str) -> None:
    """Pods, containers and networks carrying ``label``, in the podman storage that ``argv`` uses."""
    for listing, removing in (
        (["pod", "ps", "--quiet"], ["pod", "rm", "--force"]),
        (["ps", "--all", "--quiet"], ["rm", "--force", "--time", "0"]),
        (["network", "ls", "--quiet"], ["network", "rm", "--force"]),
    ):
        found = _podman(argv, conf, *listing, "--filter", f"label={label}").stdout.split()
        if found:
            _podman(argv, conf, *removing, *found)


def _remove(thing: list[Any], owner: str) -> None:
    kind, *args = thing
    if kind == "podman":
        remove_podman(args[0], args[1], f"{LABEL}={owner}")
    elif kind == "mount":
        subprocess.run(["umount", "-l", args[0]], capture_output=True, timeout=30)
    elif kind == "netns":
        _ip("netns", "del", args[0])
    elif kind == "link":
        _ip("link", "del", args[0])
    elif kind == "dir" and _scratch(args[0]):
        shutil.rmtree(args[0], ignore_errors=True)


def _scratch(path: str) -> bool:
    """Whether `path` is a directory a run may have made and so may remove: named as the tests name theirs and
    this user's (without root, `STATE` is in /tmp, where another user could list any path in a run's file)."""
    try:
        return os.path.basename(path).startswith("shuffled-") and os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


#: the label podman objects of a run carry, with the owner's name as its value
LABEL = "shuffled-test"
#: the order things go in: podman first (its containers may sit in the namespaces), directories last (a
#: mount may be in one)
_ORDER = ("podman", "mount", "netns", "link", "dir")


def reap(owner: str) -> list[str]:
    """Removes everything of the run; returns what could not be removed (empty: all gone)."""
    made = things(owner)
    namespaces = [t[1] for t in made if t[0] == "netns"]
    stuck = [f"process {pid}" for pid in stop_processes(owner, namespaces)]
    for kind in _ORDER:
        for thing in made:
            if thing[0] == kind:
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    _remove(thing, owner)
    left = stuck + leftovers(owner, made)
    if not left:
        with _locked():
            (STATE / f"{owner}.json").unlink(missing_ok=True)
    return left


def reap_dead() -> None:
    """Every earlier run whose owner is gone: what its watcher did not remove (it was killed too)."""
    dead = {o for o in _runs() if not alive(o)} | _orphaned_owners()
    for owner in dead:
        reap(owner)


def leftovers(owner: str, made: list[list[Any]] | None = None) -> list[str]:
    """What of the run still exists: its processes, and of what it made (default: what its file lists) the
    namespaces, links and podman objects (the tests assert that none is left)."""
    if made is None:
        made = things(owner)
    left = [f"process {pid}: {_cmdline(pid)}" for pid in marked(owner)]
    namespaces = set(_ip("netns", "list").stdout.split())
    links = {m.group(1) for m in re.finditer(r"^\d+: ([^:@]+)", _ip("-o", "link").stdout, re.MULTILINE)}
    for kind, *args in made:
        if (
            (kind == "netns" and args[0] in namespaces)
            or (kind == "link" and args[0] in links)
            or (kind == "dir" and os.path.lexists(args[0]))
        ):
            left.append(f"{kind} {args[0]}")
        elif kind == "podman":
            for listing in (["pod", "ps", "--quiet"], ["ps", "--all", "--quiet"], ["network", "ls", "--quiet"]):
                found = _podman(args[0], args[1], *listing, "--filter", f"label={LABEL}={owner}").stdout.split()
                left += [f"podman {listing[0]} {name}" for name in found]
    return left


def _cmdline(pid: int, limit: int = 200) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:limit]
    except OSError:
        return "?"


def commands(owner: str) -> list[str]:
    """The whole command lines of the run's processes."""
    return [_cmdline(pid, 1 << 20) for pid in marked(owner)]


# --------------------------------------------------------------------------- the owner's side


class Run:
    """This process's run: its owner name, its file, its watcher."""

    def __init__(self) -> None:
        self.owner = owner_of(os.getpid())
        self._things: list[list[Any]] = []
        self._lock = threading.Lock()
        with _locked():
            _write(self.owner, self._things)
        # The watcher must not carry any run's mark (a reaper of an enclosing run would kill it mid-way).
        env = {k: v for k, v in os.environ.items() if not k.startswith(MARKER)}
        self._watcher = subprocess.Popen(
            [sys.executable, "-S", __file__, "watch", self.owner],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # not in the owner's process group: Ctrl-C or a group kill must not reach it
        )
        #: the pipe's only writing end: it closes when this process ends, however it ends
        self._pipe: IO[bytes] | None = self._watcher.stdin
        os.environ[f"{MARKER}{self.owner}"] = "1"

    @property
    def label(self) -> str:
        """The label value podman objects of this run carry (``--label shuffled-test=<owner>``)."""
        return f"{LABEL}={self.owner}"

    def add(self, *thing: Any) -> None:
        """Records something the run is about to make (once), so that it is removed should the run be killed."""
        with self._lock, _locked():
            if list(thing) not in self._things:
                self._things.append(list(thing))
                _write(self.owner, self._things)

    def remove(self, *thing: Any) -> None:
        """Crosses off something the run removed itself."""
        with self._lock, _locked():
            with contextlib.suppress(ValueError):
                self._things.remove(list(thing))
            _write(self.owner, self._things)

    def left_behind(self, seconds: float) -> list[str]:
        """What of the run still exists `seconds` after all of it should have been stopped (at its end): its
        processes other than this one, its namespaces, links and podman objects. Empty in a run that stops all
        it starts; a run that leaves something is a test harness bug, which the run's reaper would hide."""
        return _gone_within(lambda: leftovers(self.owner, self._things), seconds)

    def subnet(self) -> ipaddress.IPv4Network:
        """A /24 of `RANGE` that no run holds and no address or route of this host overlaps; held until
        `remove("subnet", str(net))`."""
        with self._lock, _locked():
            taken = _host_networks() | {
                ipaddress.IPv4Network(t[1]) for things in _runs().values() for t in things if t[0] == "subnet"
            }
            free = [n for n in RANGE.subnets(new_prefix=24) if not any(n.overlaps(t) for t in taken)]
            if not free:
                raise RuntimeError(
                    f"no free /24 left in {RANGE}: runs' files in {STATE} and the host's addresses and routes "
                    f"(ip -4 addr, ip -4 route) hold all of it; remove what is stale"
                )
            net = random.choice(free)
            self._things.append(["subnet", str(net)])
            _write(self.owner, self._things)
        return net

    def tag(self) -> str:
        """Five hex digits that no namespace, link or run's thing has in its name (names of interfaces may
        have 15 characters: a tag leaves room for a prefix and a host's number)."""
        with self._lock, _locked():
            names = _ip("netns", "list").stdout + _ip("-o", "link").stdout + json.dumps(_runs())
            for _ in range(1000):
                tag = os.urandom(3).hex()[:5]
                if tag not in names:
                    self._things.append(["tag", tag])
                    _write(self.owner, self._things)
                    return tag
        raise RuntimeError("no unused name tag found in 1000 tries")


def _host_networks() -> set[ipaddress.IPv4Network]:
    """The host's IPv4 addresses (as their networks) and routes in every table."""
    text = _ip("-o", "-4", "addr", "show").stdout + _ip("-4", "route", "show", "table", "all").stdout
    found = set()
    for m in re.finditer(r"(?<![\d.])(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", text):
        with contextlib.suppress(ValueError):
            found.add(ipaddress.IPv4Network(m.group(1), strict=False))
    return {n for n in found if n.overlaps(RANGE) and n.prefixlen > 0}


_RUN: Run | None = None
_RUN_LOCK = threading.Lock()


def current() -> Run:
    """This process's run, made (after reaping what dead runs left) on first use."""
    global _RUN
    with _RUN_LOCK:
        if _RUN is None:
            reap_dead()
            _RUN = Run()
        return _RUN


def made() -> Run | None:
    """This process's run if `current` made it."""
    return _RUN


def _watch(owner: str) -> None:
    """The watcher: waits for the owner's pipe to close, then reaps the run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        sys.stdin.buffer.read()  # returns at end of file: the owner is gone
    reap(owner)


if __name__ == "__main__":
    if sys.argv[1:2] == ["watch"]:
        _watch(sys.argv[2])
    elif sys.argv[1:2] == ["reap"]:  # by hand: python tests/reaper.py reap (every dead run)
        reap_dead()
    else:
        sys.exit("usage: python tests/reaper.py watch OWNER | reap")
