"""Everything the scenarios share: processes, the run context, client operations, timing and output.

Kept in one module so that each scenario file reads as the experiment it is (what
is pushed, what is read, what is compared) and none repeats the plumbing.

Safety rules every scenario gets from here rather than re-implementing:
- traffic stays on loopback: daemons bind 127.0.0.2, 127.0.0.3, ... (distinct
  addresses, so the daemon-to-daemon connection is a real TCP connection between
  two "hosts") or a Unix socket in a private temporary directory;
- every child process is registered the moment it starts and is stopped with
  SIGTERM, then SIGKILL, when its scenario ends, when the run ends, on error and
  at interpreter exit; it leads a process group of its own and gets SIGTERM if
  this process dies (`shuffled.children`), and whatever a run leaves when it is
  killed (processes, namespaces, links) goes with it (tests/reaper.py);
- every loop is bounded in count and in time (`bounded`), every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import queue
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from shuffled import children
from shuffled.config import DaemonConfig
from shuffled.launch import DaemonProcess, stop_process
from shuffled_client import AsyncClient, PartitionReader

KiB = 1 << 10
MiB = 1 << 20
T = TypeVar("T")

#: the daemon's defaults, read from its own config so sizing here follows it
DAEMON_DEFAULTS = DaemonConfig()
SEGMENT = DAEMON_DEFAULTS.segment_size
#: most segments one reader stream holds: exclusive credit plus the gate's floating buffers
SEGMENTS_PER_READER = DAEMON_DEFAULTS.exclusive_buffers + DAEMON_DEFAULTS.floating_buffers
DEFAULT_DAEMON_POOL = DAEMON_DEFAULTS.pool_size
#: pools sized for many readers' full credit windows stop growing here
MAX_WINDOW_POOL = 512 * MiB

#: the first loopback address handed to a daemon; 127.0.0.1 is left to everything else on the machine
FIRST_HOST = 2
#: where helper processes (bare sockets, iperf3) listen: a loopback address like the daemons'
HOST_FOR_HELPERS = "127.0.0.2"
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0
#: a baseline older than this is measured again before a scenario compares against it: on a shared
#: machine the bare rate itself moves by 2x within minutes, so a ratio needs a baseline taken nearby
BASELINE_MAX_AGE = 30.0

_T0 = time.monotonic()


# --------------------------------------------------------------------------- progress and loops


def progress(message: str, scenario: str = "") -> None:
    """One line on stderr, flushed: long runs must show they are alive and where they are."""
    where = f"{scenario}: " if scenario else ""
    print(f"[bench {time.monotonic() - _T0:7.1f}s] {where}{message}", file=sys.stderr, flush=True)


def bounded(count: int, seconds: float) -> Iterator[int]:
    """0 .. count-1, but stop early once `seconds` have passed (the first item always runs).

    Every benchmark loop goes through this, so a slow machine shortens a run
    instead of hanging it.
    """
    deadline = time.monotonic() + seconds
    for i in range(count):
        if i and time.monotonic() >= deadline:
            return
        yield i


def mib_per_s(nbytes: float, seconds: float) -> float:
    return nbytes / MiB / seconds if seconds > 0 else math.inf


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): a value that was actually observed."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def round_up_mib(nbytes: float) -> int:
    return math.ceil(nbytes / MiB) * MiB


def store_pool(nbytes: int, partitions: int = 1) -> int:
    """A daemon pool that can store `nbytes` pushed into `partitions` without back-pressure.

    Each partition may end in a partly filled segment, pushes cannot use the read
    reserve, and open push windows and read gates need a little room on top.
    """
    need = nbytes + partitions * SEGMENT + 8 * MiB
    return max(DEFAULT_DAEMON_POOL, round_up_mib(need / (1 - DAEMON_DEFAULTS.read_reserve) * 1.05))


def relay_pool(readers: int) -> int:
    """A pool for the daemon that relays: room for every concurrent read gate's exclusive segments in the
    part of the read reserve they may hold (three quarters of it), and for their floating ones up to
    `MAX_WINDOW_POOL` (floating ones are only taken while memory is to spare, so beyond that readers share
    less of it, as they would on a busy daemon)."""
    want = readers * SEGMENTS_PER_READER * SEGMENT * 1.25
    exclusive = readers * DAEMON_DEFAULTS.exclusive_buffers * SEGMENT
    floor = exclusive / (DAEMON_DEFAULTS.read_reserve * 3 / 4) * 1.05
    return max(DEFAULT_DAEMON_POOL, round_up_mib(max(min(want, MAX_WINDOW_POOL), floor)))


def reader_client_pool(readers: int) -> int:
    """A client pool in which `readers` streams all start at once and share floating buffers generously."""
    want = readers * SEGMENTS_PER_READER * SEGMENT + 4 * MiB
    floor = readers * DAEMON_DEFAULTS.exclusive_buffers * SEGMENT * 2 + 4 * MiB
    return max(4 * MiB, round_up_mib(max(min(want, MAX_WINDOW_POOL), floor)))


# --------------------------------------------------------------------------- results


class Skip(Exception):
    """A scenario cannot run here (e.g. a tool is missing); not a failure."""


class BenchmarkFailure(Exception):
    """The system did something a scenario requires it not to do (wrong byte count, a stall)."""


def require(condition: bool, message: str) -> None:
    """Like assert, but not stripped by -O and reported as a scenario failure."""
    if not condition:
        raise BenchmarkFailure(message)


@dataclass
class Goal:
    """A target the project set, checked on the metric's ratio or on its value."""

    on: str  # "ratio" or "value"
    op: str  # ">=" or "<="
    limit: float

    def check(self, metric: Metric) -> bool | None:
        x = metric.ratio if self.on == "ratio" else metric.value
        if x is None or math.isnan(x):
            return None
        return x >= self.limit if self.op == ">=" else x <= self.limit

    def __str__(self) -> str:
        return f"{self.on} {self.op} {_fmt(self.limit)}"


@dataclass
class Metric:
    name: str
    value: float
    unit: str
    #: what the ratio compares against, with its value, e.g. "bare 3900 MiB/s"
    baseline: str = ""
    ratio: float | None = None
    goal: str = ""
    ok: bool | None = None
    samples: list[float] = field(default_factory=list)


@dataclass
class Plot:
    """Data for one PNG; drawn at the end so a scenario never touches matplotlib."""

    file: str
    title: str
    xlabel: str
    ylabel: str
    lines: dict[str, tuple[Sequence[float], Sequence[float]]] = field(default_factory=dict)
    bars: dict[str, float] = field(default_factory=dict)
    hlines: dict[str, float] = field(default_factory=dict)
    logx: bool = False


@dataclass
class ScenarioResult:
    name: str
    description: str = ""
    status: str = "ok"  # ok | skipped | failed
    error: str = ""
    seconds: float = 0.0
    metrics: list[Metric] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    #: details a scenario keeps in results.json beside its metrics (the `shapes` breakdown)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(
        self,
        name: str,
        value: float,
        unit: str,
        *,
        baseline_name: str = "",
        baseline: float | None = None,
        goal: Goal | None = None,
        samples: Sequence[float] = (),
    ) -> Metric:
        """Record a metric; with a baseline, the ratio value / baseline is computed here, once."""
        ratio = value / baseline if baseline else None
        label = f"{baseline_name} {_fmt(baseline)} {unit}" if baseline is not None else ""
        metric = Metric(name, value, unit, label, ratio, str(goal) if goal else "", None, list(samples))
        if goal is not None:
            metric.ok = goal.check(metric)
        self.metrics.append(metric)
        return metric


# --------------------------------------------------------------------------- processes

_LIVE: set[ManagedProcess | DaemonProcess] = set()


#: the directory holding the `benchmarks` package, so helpers import it whatever the working directory
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


class ManagedProcess:
    """A child process we own: its output drained by threads, always stopped (SIGTERM, then SIGKILL).

    Output is drained continuously so a chatty child never blocks on a full pipe;
    the last lines are kept for error messages. Readiness is a regex on one of the
    two streams; stdout lines are also queued for `next_line`. With `commands` its stdin
    is a pipe that `send` writes lines to (a helper driven a step at a time).
    """

    def __init__(
        self, name: str, argv: list[str], ready: str, ready_on: str = "stdout", commands: bool = False
    ) -> None:
        self.name = name
        self.argv = argv
        self._ready_re = re.compile(ready)
        self._ready_on = ready_on
        self.ready_match: re.Match[str] | None = None
        self._ready = threading.Event()
        self._tail: deque[str] = deque(maxlen=60)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.proc: subprocess.Popen[str] = children.spawn(
            argv,
            stdin=subprocess.PIPE if commands else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_child_env(),
        )
        _LIVE.add(self)
        for stream_name in ("stdout", "stderr"):
            threading.Thread(target=self._drain, args=(stream_name,), daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _drain(self, stream_name: str) -> None:
        pipe = self.proc.stdout if stream_name == "stdout" else self.proc.stderr
        assert pipe is not None
        for line in pipe:
            self._tail.append(f"{stream_name}: {line.rstrip()}")
            if stream_name == self._ready_on and not self._ready.is_set():
                m = self._ready_re.search(line)
                if m:
                    self.ready_match = m
                    self._ready.set()
                    continue  # the ready line is not a result
            if stream_name == "stdout":
                self._lines.put(line.rstrip("\n"))
        if stream_name == "stdout":
            self._lines.put(None)
        if stream_name == self._ready_on:
            self._ready.set()  # wake the waiter; it sees the process is not ready

    def tail(self) -> str:
        return "\n".join(self._tail)

    async def wait_ready(self, timeout: float = READY_TIMEOUT) -> re.Match[str]:
        waited = await asyncio.to_thread(self._ready.wait, timeout)
        if self.ready_match is None:
            self.stop()
            why = f"exited with code {self.proc.returncode}" if waited else f"was not ready within {timeout:.0f}s"
            raise RuntimeError(f"{self.name} {why}:\n{self.tail()}")
        return self.ready_match

    async def next_line(self, timeout: float) -> str:
        """The next stdout line (helpers report results there), or an error if the process ended first."""
        try:
            line = await asyncio.to_thread(self._lines.get, True, timeout)
        except queue.Empty:
            raise RuntimeError(f"{self.name} printed nothing within {timeout:.0f}s:\n{self.tail()}") from None
        if line is None:
            raise RuntimeError(f"{self.name} exited (code {self.proc.poll()}) without a result:\n{self.tail()}")
        return line

    async def ask(self, command: str, timeout: float) -> str:
        """Send one command line (the process was started with `commands`) and wait for its one-line answer."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except OSError as exc:  # it exited: say why rather than what the pipe says
            raise RuntimeError(f"{self.name} took no command ({exc}):\n{self.tail()}") from None
        return await self.next_line(timeout)

    async def wait_exit(self, timeout: float) -> int:
        try:
            return await asyncio.to_thread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"{self.name} did not exit within {timeout:.0f}s") from None

    def stop(self) -> None:
        """SIGTERM, wait a little, then SIGKILL; safe to call any number of times."""
        try:
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
            stop_process(self.proc, STOP_TIMEOUT)
        finally:
            _LIVE.discard(self)


def stop_all() -> None:
    """Stop every child still running (end of run, error paths, interpreter exit)."""
    while _LIVE:
        p = _LIVE.pop()
        with contextlib.suppress(Exception):
            p.stop()


async def in_thread(work: Callable[[], T], on_cancel: Callable[[], None] = lambda: None) -> T:
    """``work()`` in a worker thread (it blocks: starting JVMs, a Spark job), awaited. A thread cannot be
    interrupted: if the caller is cancelled (the scenario's time limit, SIGINT), ``on_cancel()`` asks the work
    to end and the thread is waited for before the cancellation goes on, so that nothing it starts afterwards
    outlives the scenario, nor keeps the run from exiting (its executor is joined at the end)."""
    running = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        on_cancel()
        with contextlib.suppress(Exception):
            await running
        raise


@contextlib.asynccontextmanager
async def entered_in_thread(manager: contextlib.AbstractContextManager[T]) -> AsyncIterator[T]:
    """A blocking context manager (simulated hosts, a Spark cluster) entered and exited in worker threads, and
    exited also when the caller was cancelled while it was still being entered (`in_thread`)."""
    with contextlib.ExitStack() as stack:
        try:
            yield await in_thread(lambda: stack.enter_context(manager))
        finally:
            await asyncio.to_thread(stack.pop_all().close)


def rss(pid: int) -> int:
    """A process's resident memory in bytes."""
    import psutil

    return int(psutil.Process(pid).memory_info().rss)


def helper_process(module: str, *args: str) -> ManagedProcess:
    """A `python -m benchmarks.<module>` helper that prints `ready <port>` once it listens."""
    argv = [sys.executable, "-m", f"benchmarks.{module}", *args]
    return ManagedProcess(f"{module} {args[0] if args else ''}".strip(), argv, r"^ready (\d+)")


def free_port(host: str) -> int:
    """A port free on `host` right now, for tools that cannot be told to pick one themselves."""
    with contextlib.closing(socket.socket()) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- CPU caps


#: the cgroup v1 CPU controller (cgroup v2 exposes `cpu.max` under /sys/fs/cgroup or its `unified` mount)
_CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
_CGROUP_V2 = next(
    (
        p
        for p in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
        if (p / "cgroup.controllers").exists() and "cpu" in (p / "cgroup.controllers").read_text().split()
    ),
    None,
)


def cpu_cap_unavailable() -> str | None:
    """Why processes cannot be given a CPU quota here (None: they can)."""
    if os.geteuid() != 0:
        return "not root"
    if not (_CGROUP_V1 / "cpu.cfs_quota_us").exists() and _CGROUP_V2 is None:
        return "no cgroup CPU controller"
    return None


@contextlib.contextmanager
def cpu_capped(hosts: Sequence[Sequence[int]], cores: float) -> Iterator[None]:
    """Each group of processes limited to `cores` of CPU time together (a cgroup with a CFS quota), as if
    each group ran on a host of that size: a pusher and its daemon on one, a replica on another, instead
    of all of them taking what they can of one machine's cores. Moved back to the root group on exit."""
    period = 10_000  # µs: short, so that a push of a fraction of a second is held to the quota throughout
    groups: list[tuple[Path, Path]] = []  # (its group, the root to move its processes back to)
    try:
        for i, pids in enumerate(hosts):
            root = _CGROUP_V2 or _CGROUP_V1
            group = root / f"shuffled-bench-{os.getpid()}-{i}"
            if _CGROUP_V2 is not None:
                (root / "cgroup.subtree_control").write_text("+cpu")
                group.mkdir()
                (group / "cpu.max").write_text(f"{int(cores * period)} {period}")
            else:
                group.mkdir()
                (group / "cpu.cfs_period_us").write_text(str(period))
                (group / "cpu.cfs_quota_us").write_text(str(int(cores * period)))
            groups.append((group, root))
            for pid in pids:
                (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        for group, root in groups:
            for moved in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (root / "cgroup.procs").write_text(moved)
            with contextlib.suppress(OSError):
                group.rmdir()


# --------------------------------------------------------------------------- the run context


@dataclass
class Baseline:
    name: str
    bytes_per_s: float
    measured_at: float
    samples: list[float] = field(default_factory=list)

    @property
    def mib_s(self) -> float:
        return self.bytes_per_s / MiB


class Context:
    """What a scenario gets: run mode, output places, its progress line, daemons and clients, baselines."""

    def __init__(
        self, quick: bool, out_dir: Path, tmp_dir: Path, profile: bool = False, minutes: float | None = None
    ) -> None:
        self.quick = quick
        #: how long a scenario that runs for a set time (the soak) runs; None: its own default
        self.minutes = minutes
        #: run daemons under cProfile, stats written to out_dir/<scenario>-<host>.prof
        self.profile = profile
        self.out_dir = out_dir
        self.tmp_dir = tmp_dir
        #: measurements per data point: medians of 5 in full runs, single shots in quick ones
        self.repeats = 1 if quick else 5
        #: wall-clock cap for one scenario, enforced around its coroutine
        self.time_limit = 45.0 if quick else 900.0
        #: what every scenario's time limit is multiplied by (`--limits`): the limits suit an idle machine
        self.limit_scale = 1.0
        self.scenario = ""
        #: the running scenario's own cap (its (QUICK_)TIME_LIMIT, else time_limit): waits inside it that
        #: need the whole of it (a Spark session on a loaded machine) use this, not the default
        self.scenario_limit = self.time_limit
        #: the latest bare-socket baseline (bare.py's `bare_throughput` measures it when stale)
        self.bare: Baseline | None = None
        #: every bare measurement of the run: (scenario that asked for it, MiB/s)
        self.bare_history: list[tuple[str, float]] = []
        self._unix_count = 0

    def pick(self, full: Any, quick: Any) -> Any:
        """The full-run value or the quick one (sizes, counts, time budgets)."""
        return quick if self.quick else full

    def progress(self, message: str) -> None:
        progress(message, self.scenario)

    # -- the bare-socket baseline, shared by every scenario that reports a ratio to it

    def record_bare(self, baseline: Baseline) -> None:
        self.bare = baseline
        self.bare_history.append((self.scenario, baseline.mib_s))

    # -- daemons and clients

    @contextlib.asynccontextmanager
    async def daemons(
        self, *pools: int, unix: bool = False, extra: Sequence[str] = (), peers: bool = False
    ) -> AsyncIterator[list[DaemonProcess]]:
        """Start one daemon per pool size on 127.0.0.2, 127.0.0.3, ... (each with `extra` flags); stop them all.

        With `peers` each gets the others' addresses (`--peers`), which replicas are placed on: their ports
        are then chosen here rather than by the daemons."""
        started: list[DaemonProcess] = []
        scratch = contextlib.ExitStack()  # data dirs: the default (data-dir auto) outlives the run
        hosts = [f"127.0.0.{FIRST_HOST + i}" for i in range(len(pools))]
        ports = [free_port(host) if peers else 0 for host in hosts]
        if peers:
            extra = ["--peers", ",".join(f"{h}:{p}" for h, p in zip(hosts, ports, strict=True)), *extra]
        try:
            for host, port, pool in zip(hosts, ports, pools, strict=True):
                flags = ["--log-level", "info"]
                if unix:
                    self._unix_count += 1
                    flags += ["--unix-socket", str(self.tmp_dir / f"d{self._unix_count}.sock")]
                if "--data-dir" not in extra:
                    data_dir = scratch.enter_context(tempfile.TemporaryDirectory(prefix="shuffled-bench-"))
                    flags += ["--data-dir", data_dir]
                python = [sys.executable]
                if self.profile:  # stats written when the daemon stops (SIGTERM makes it exit normally)
                    python += ["-m", "cProfile", "-o", str(self.out_dir / f"{self.scenario}-{host}.prof")]
                size = f"{round_up_mib(pool) // MiB}M"
                d = DaemonProcess(host, port, size, [*flags, *extra], interpreter=python, env=_child_env())
                _LIVE.add(d)
                started.append(d)
                await asyncio.to_thread(d.wait_ready)
            self.progress("daemons " + ", ".join(f"{d.addr} ({d.pool_size // MiB} MiB pool)" for d in started))
            yield started
        finally:
            for d in started:
                code = d.proc.poll()
                if code is not None:
                    tail = "".join(d.log[-60:])
                    self.progress(f"daemon {d.host} had exited with code {code}; last output:\n{tail}")
                d.stop(STOP_TIMEOUT)
                _LIVE.discard(d)
            scratch.close()

    @contextlib.asynccontextmanager
    async def client(
        self, address: str, pool_size: int = 4 * MiB, shared_memory: bool = True
    ) -> AsyncIterator[AsyncClient]:
        """A client of the daemon at `address`: over a Unix socket, through shared memory unless told not to."""
        client = await AsyncClient.connect(address, pool_size=pool_size, timeout=30.0, shared_memory=shared_memory)
        try:
            yield client
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 5.0)


# --------------------------------------------------------------------------- client operations

#: 1 MiB of non-zero bytes that writes slice from (no per-write allocation in the timed loop)
_PATTERN = memoryview(bytes(range(256)) * (MiB // 256))


async def push(
    client: AsyncClient,
    app: str,
    shuffle: int,
    attempt: int,
    sizes: Sequence[int],
    *,
    map_index: int = 0,
    piece: int = MiB,
) -> int:
    """One map output with `sizes[p]` bytes for each partition p, written in `piece`-sized writes; commits.

    Partitions are written one after the other, the way a sorted map output is.
    Returns the bytes the daemon says it stored, checked against what was written.
    """
    writer = await client.open_writer(app, shuffle, map_index, attempt, len(sizes))
    for partition, size in enumerate(sizes):
        left = size
        while left:
            n = min(left, piece, len(_PATTERN))
            await writer.write(partition, _PATTERN[:n])
            left -= n
    lengths = await writer.commit()
    require(list(lengths) == list(sizes), f"commit stored {sum(lengths)} bytes, {sum(sizes)} were written")
    return sum(lengths)


async def drain(reader: PartitionReader) -> int:
    """Consume a read completely; returns its bytes (content is the daemon's business, counted not copied)."""
    n = 0
    async with reader:
        async for chunk in reader:
            n += len(chunk.data)
    return n


async def timed_read(
    client: AsyncClient, app: str, shuffle: int, partition: int, locations: dict[str, list[int]], t0: float
) -> tuple[int, float]:
    """Read one partition; returns (bytes, seconds from `t0` until its last byte)."""
    n = await drain(client.read(app, shuffle, partition, partition + 1, locations))
    return n, time.perf_counter() - t0


async def warm_up_peer(store: AsyncClient, relay: AsyncClient, store_node: str) -> None:
    """Make the relay daemon dial the storing one now, so no timed read pays for connection setup."""
    app, shuffle = "bench-warmup", 0
    await push(store, app, shuffle, 1, [1])
    require(await drain(relay.read(app, shuffle, 0, 1, {store_node: [1]})) == 1, "warm-up read lost its byte")
    await store.unregister_shuffle(app, shuffle)


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds a process has used so far (None: this process)."""
    if pid is None:
        return time.process_time()
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


class CpuMeter:
    """CPU seconds each process spent in timed sections, per label: with the wall time it shows whether a
    rate is bound by one process's CPU, by all cores, or by waiting (the floor of a scenario)."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = pids
        #: label -> [bytes, wall seconds, CPU seconds per process]
        self.spent: dict[str, list[Any]] = {}

    @contextlib.contextmanager
    def measure(self, label: str, nbytes: int = 0) -> Iterator[list[int]]:
        """Time the block; its bytes are `nbytes` plus what the block adds to the list it is given (for
        sections that learn their size as they go)."""
        before = {who: cpu_seconds(pid) for who, pid in self.pids.items()}
        t0 = time.perf_counter()
        moved = [nbytes]
        yield moved
        wall = time.perf_counter() - t0
        entry = self.spent.setdefault(label, [0, 0.0, dict.fromkeys(self.pids, 0.0)])
        entry[0] += moved[0]
        entry[1] += wall
        for who, pid in self.pids.items():
            entry[2][who] += cpu_seconds(pid) - before[who]

    def per_gib(self, who: str) -> dict[str, float]:
        """Label -> CPU seconds per GiB process `who` spent in it."""
        return {label: cpu[who] / (nbytes / (1 << 30)) for label, (nbytes, _, cpu) in self.spent.items() if nbytes}

    def notes(self) -> list[str]:
        out = []
        for label, (nbytes, wall, cpu) in self.spent.items():
            if not nbytes:  # nothing went through the measured processes (a baseline's section)
                continue
            gib = nbytes / (1 << 30)
            per = ", ".join(f"{who} {secs / gib:.2f}" for who, secs in cpu.items())
            busy = sum(cpu.values()) / wall
            out.append(
                f"{label}: CPU seconds per GiB {per}; wall {wall / gib:.2f} s/GiB, so {busy:.2f} of "
                f"{os.cpu_count()} cores busy"
            )
        return out


# --------------------------------------------------------------------------- memory sampling


class RssSampler:
    """Samples the RSS of some processes from a thread, so the pace holds while the event loop is busy."""

    def __init__(self, pids: dict[str, int], interval: float, max_samples: int = 50_000) -> None:
        self.pids = pids
        self.interval = interval
        self.max_samples = max_samples
        self.t0 = time.monotonic()
        self.series: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        procs = {k: psutil.Process(pid) for k, pid in self.pids.items()}
        for _ in range(self.max_samples):
            self.sample(procs)
            if self._stop.wait(self.interval):
                break
        self.sample(procs)

    def sample(self, procs: dict[str, Any]) -> None:
        now = time.monotonic() - self.t0
        for k, p in procs.items():
            with contextlib.suppress(Exception):
                rss = p.memory_info().rss
                xs, ys = self.series[k]
                xs.append(now)
                ys.append(rss / MiB)

    def peak(self, key: str) -> float:
        ys = self.series[key][1]
        return max(ys) if ys else math.nan

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)


# --------------------------------------------------------------------------- output


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def format_table(results: Sequence[ScenarioResult]) -> str:
    """A plain-text table (pastes into notes as is), then each scenario's notes."""
    header = ("scenario", "metric", "value", "unit", "baseline", "ratio", "goal", "met")
    rows: list[tuple[str, ...]] = []
    for r in results:
        if r.status != "ok" and not r.metrics:
            rows.append((r.name, f"{r.status}: {r.error}", "", "", "", "", "", ""))
            continue
        for m in r.metrics:
            met = "" if m.ok is None else ("yes" if m.ok else "NO")
            ratio = "" if m.ratio is None else f"{m.ratio:.2f}"
            rows.append((r.name, m.name, _fmt(m.value), m.unit, m.baseline, ratio, m.goal, met))
        if r.status != "ok":
            rows.append((r.name, f"{r.status}: {r.error}", "", "", "", "", "", ""))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    right = {2, 5}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    notes = [(r.name, n) for r in results for n in r.notes]
    if notes:
        out.append("")
        out.append("notes:")
        out += [f"  {name}: {note}" for name, note in notes]
    return "\n".join(out)


class MachineLoad:
    """CPU time stolen by the hypervisor and the load average over the run: how noisy this run's machine was."""

    def __init__(self) -> None:
        import psutil

        self._start = psutil.cpu_times()
        self.loadavg_start = os.getloadavg()[0]

    def summary(self) -> dict[str, float]:
        import psutil

        end = psutil.cpu_times()
        total = sum(end) - sum(self._start)
        steal = getattr(end, "steal", 0.0) - getattr(self._start, "steal", 0.0)
        return {
            "cpu_steal_percent": round(100 * steal / total, 1) if total > 0 else 0.0,
            "loadavg_1m_start": round(self.loadavg_start, 2),
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
        }


def run_metadata(quick: bool, seconds: float, argv: Sequence[str], load: MachineLoad) -> dict[str, Any]:
    """Enough about the machine, its load and the code to tell two results files apart."""
    repo = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    from importlib.metadata import version

    return {
        "argv": list(argv),
        "quick": quick,
        "seconds": round(seconds, 2),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "uvloop": version("uvloop"),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        **load.summary(),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def write_json(path: Path, meta: dict[str, Any], results: Sequence[ScenarioResult]) -> None:
    def clean(x: Any) -> Any:
        """JSON has no NaN/inf: write them as null rather than produce a file other tools reject."""
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        return x

    doc = {"meta": meta, "scenarios": {r.name: clean(asdict(r)) for r in results}}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def summary_plot(results: Sequence[ScenarioResult]) -> Plot | None:
    """All throughput metrics of the run side by side: the one picture of where the bytes/s go."""
    bars = {f"{r.name}: {m.name}": m.value for r in results for m in r.metrics if m.unit == "MiB/s"}
    if not bars:
        return None
    return Plot("throughput", "Throughput (same run)", "", "MiB/s", bars=bars)


def write_plots(out_dir: Path, results: Sequence[ScenarioResult]) -> list[Path]:
    """Draw every scenario's plots plus the summary; a plot that fails is noted, not fatal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs: list[tuple[ScenarioResult | None, Plot]] = [(r, p) for r in results for p in r.plots]
    summary = summary_plot(results)
    if summary is not None:
        jobs.append((None, summary))
    written: list[Path] = []
    for owner, plot in jobs:
        path = out_dir / f"{plot.file}.png"
        try:
            fig, ax = plt.subplots(figsize=(9, 5) if not plot.bars else (9, 1.5 + 0.4 * len(plot.bars)))
            if plot.bars:
                labels = list(plot.bars)
                ax.barh(labels, [plot.bars[k] for k in labels], color="tab:blue")
                ax.invert_yaxis()
                ax.set_xlabel(plot.ylabel)
                for i, k in enumerate(labels):
                    ax.text(plot.bars[k], i, f" {_fmt(plot.bars[k])}", va="center", fontsize=8)
            else:
                for label, (xs, ys) in plot.lines.items():
                    ax.plot(xs, ys, marker="o" if len(xs) <= 12 else None, label=label)
                for label, y in plot.hlines.items():
                    ax.axhline(y, linestyle="--", linewidth=1, color="gray")
                    ax.annotate(label, (0, y), xycoords=("axes fraction", "data"), fontsize=8, va="bottom")
                ax.set_xlabel(plot.xlabel)
                ax.set_ylabel(plot.ylabel)
                if plot.logx:
                    ax.set_xscale("log")
                if plot.lines:
                    ax.legend(fontsize=8)
            ax.set_title(plot.title)
            ax.grid(True, alpha=0.3)
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
        except Exception as exc:  # a broken plot must not lose the numbers
            message = f"plot {path.name} failed: {type(exc).__name__}: {exc}"
            progress(message)
            if owner is not None:
                owner.notes.append(message)
    return written
