"""Simulated hosts: Linux network namespaces on a bridge of their own, each with its own address, a daemon
and (optionally) a Spark standalone worker; links shaped with ``tc``. Shared by tests and benchmarks.

Every host is a namespace with a veth pair onto the run's bridge in the root namespace, an address from
198.18.0.0/15 (the benchmarking range: nothing leaves the machine) and its own loopback. Its daemon
listens on every address of its namespace, so executors on that host reach it as ``127.0.0.1:7337``
(what a real host's ``spark-defaults.conf`` says) and other daemons, the driver and the tests reach it at
the host's address. Master and driver stay in the root namespace, on the bridge's address.

Links are shaped on both ends of each veth: ``netem`` (rate and delay) where the kernel has it, else
``tbf`` (rate only; the delay is then not emulated, and `Hosts.shaping` says so). Names carry a tag that no
namespace, link or other run uses, and the /24 is one that no other run holds and no address or route of the
machine overlaps (both handed out by tests/reaper.py), so parallel runs, what an earlier run left and the
host's own networks cannot collide. Everything is removed on exit, also after a failure, and by the run's
reaper should the process be killed. Creating namespaces needs root and ``ip``; `netns_unavailable` says why
not, for skips.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shuffled.launch import DaemonProcess
from tests import reaper

DAEMON_PORT = 7337


@dataclass(frozen=True)
class LinkProfile:
    """What every host's link does: a rate, and a one-way delay where netem exists."""

    name: str
    rate: str  # tc rate, e.g. "1gbit"
    delay_ms: float = 0.5


GBIT_1 = LinkProfile("1 Gbit/s", "1gbit")
GBIT_10 = LinkProfile("10 Gbit/s", "10gbit")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def _must(*argv: str) -> None:
    done = _run(*argv)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


def netns_unavailable() -> str | None:
    """Why namespace hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the ip and tc tools (iproute2) are not installed"
    # a name of its own, and in the run's file while it exists: one left by a killed run (whose pid may be
    # this one's) must not make every namespace test skip
    run = reaper.current()
    name = f"shprobe{run.tag()}"
    run.add("netns", name)
    try:
        made = _run("ip", "netns", "add", name)
        if made.returncode != 0:
            return f"cannot create a network namespace (ip netns add: {made.stderr.strip()})"
        _run("ip", "netns", "del", name)
    finally:
        run.remove("netns", name)
    return None


@contextlib.contextmanager
def hosts_for_tests(n: int) -> Iterator[Hosts]:
    """`Hosts` for a test fixture: skipped with the reason where namespaces cannot be made, and checked
    afterwards to have left nothing behind."""
    import pytest

    why = netns_unavailable()
    if why is not None:
        pytest.skip(f"no simulated hosts: {why}")
    with Hosts(n) as hosts:
        # the check afterwards finds the bridge, each host's namespace and its outer link while they exist
        assert len(hosts.leftovers()) == 1 + 2 * n, hosts.leftovers()
        yield hosts
    assert not hosts.leftovers(), f"namespaces or links left behind: {hosts.leftovers()}"


@dataclass
class Host:
    """One simulated host: a namespace, its address, its link's two ends, what runs there."""

    index: int
    netns: str
    addr: str
    outer: str  # the veth end on the bridge (root namespace)
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def daemon_addr(self) -> str:
        return f"{self.addr}:{DAEMON_PORT}"

    def argv(self, *argv: str) -> list[str]:
        """A command line that runs inside this host."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def link(self, up: bool) -> None:
        """Takes the host off the network (or back): its end of the link, as a pulled cable would."""
        _must("ip", "-n", self.netns, "link", "set", "eth0", "up" if up else "down")


class Hosts:
    """``n`` hosts on one bridge; a context manager that tears everything down."""

    def __init__(self, n: int = 3, profile: LinkProfile = GBIT_1) -> None:
        self.n = n
        self.profile = profile
        self.run = reaper.current()
        self.tag = self.run.tag()
        self.subnet = self.run.subnet()
        self.prefix = str(self.subnet.network_address).rpartition(".")[0]
        self.bridge = f"shbr{self.tag}"
        self.gateway = f"{self.prefix}.1"
        self.hosts: list[Host] = []
        self.shaping = ""
        self.scratch = Path(tempfile.mkdtemp(prefix="shuffled-hosts-"))
        self.run.add("dir", str(self.scratch))

    def __enter__(self) -> Hosts:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        self.run.add("link", self.bridge)
        _must("ip", "link", "add", self.bridge, "type", "bridge")
        _must("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _must("ip", "link", "set", self.bridge, "up")
        for i in range(1, self.n + 1):
            host = Host(i, f"shf{self.tag}h{i}", f"{self.prefix}.{10 + i}", f"sh{self.tag}o{i}")
            self.hosts.append(host)
            inner = self._inner(i)
            self.run.add("netns", host.netns)
            self.run.add("link", host.outer)
            _must("ip", "netns", "add", host.netns)
            _must("ip", "link", "add", host.outer, "type", "veth", "peer", "name", inner)
            _must("ip", "link", "set", inner, "netns", host.netns)
            _must("ip", "-n", host.netns, "link", "set", inner, "name", "eth0")
            _must("ip", "-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
            _must("ip", "-n", host.netns, "link", "set", "lo", "up")
            _must("ip", "-n", host.netns, "link", "set", "eth0", "up")
            _must("ip", "-n", host.netns, "route", "add", "default", "via", self.gateway)
            _must("ip", "link", "set", host.outer, "master", self.bridge)
            _must("ip", "link", "set", host.outer, "up")
            self.shaping = self._shape(host)

    def _shape(self, host: Host) -> str:
        """Shapes both directions of the host's link; returns what was applied."""
        p = self.profile
        netem = ["netem", "delay", f"{p.delay_ms}ms", "rate", p.rate, "limit", "10000"]
        tbf = ["tbf", "rate", p.rate, "burst", "1mb", "latency", "50ms"]
        ends = [["ip", "netns", "exec", host.netns, "tc", "qdisc", "add", "dev", "eth0", "root"]]
        ends.append(["tc", "qdisc", "add", "dev", host.outer, "root"])
        if all(_run(*end, *netem).returncode == 0 for end in ends):
            return f"{p.rate} and {p.delay_ms} ms each way (netem)"
        for end in ends:
            _run(*[w if w != "add" else "del" for w in end])
        for end in ends:
            _must(*end, *tbf)
        return f"{p.rate} (tbf; no delay: this kernel has no sch_netem)"

    def data_dir(self, host: Host) -> Path:
        """The host's daemon's data dir: the same one after a restart, so committed data is found again."""
        return self.scratch / f"data-{host.index}"

    def start_daemon(
        self,
        host: Host,
        pool_size: str = "64M",
        extra: list[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> DaemonProcess:
        """``shuffled serve`` inside ``host``: on every address of the namespace, the host address
        advertised, every host's daemon a peer; stopped when the hosts go. `env`: its environment (else
        this process's)."""
        peers = ",".join(h.daemon_addr for h in self.hosts)
        flags = ["--advertise", host.daemon_addr, "--peers", peers, "--data-dir", str(self.data_dir(host))]
        daemon = DaemonProcess(
            "0.0.0.0",
            DAEMON_PORT,
            pool_size,
            [*flags, *(extra or [])],
            interpreter=host.argv(sys.executable),
            env=env,
        )
        host.procs.append(daemon.proc)
        return daemon.wait_ready()

    @contextlib.contextmanager
    def spark_cluster(self) -> Iterator[str]:
        """A standalone master on the bridge and a worker on every host; yields the master URL."""
        from tests.spark_standalone import standalone_cluster

        with standalone_cluster([h.addr for h in self.hosts], self.gateway, [h.netns for h in self.hosts]) as url:
            yield url

    def spark_conf(self, jar: Path, admin: str | None = None) -> dict[str, str]:
        """A driver's settings for `spark_cluster`: the driver on the bridge, the plugin jar shipped to the
        executors; with the address of the daemon the driver sends cleanup to (``admin``), the shuffle goes
        through shuffled, each executor using its own host's daemon (``127.0.0.1:7337`` in its namespace)."""
        from shuffled import spark_jar
        from tests.spark_support import PLUGIN_TIMEOUT

        conf = {
            "spark.jars": str(jar),
            "spark.driver.host": self.gateway,
            "spark.driver.bindAddress": self.gateway,
            "spark.executor.memory": "640m",
            "spark.task.maxFailures": "4",
        }
        if admin is not None:
            conf |= spark_jar.spark_conf(jar, [f"127.0.0.1:{DAEMON_PORT}"])
            conf |= {"spark.shuffled.adminAddress": admin, "spark.shuffled.timeout": PLUGIN_TIMEOUT}
        return conf

    def close(self) -> None:
        for host in self.hosts:
            for proc in host.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
            for pid in _run("ip", "netns", "pids", host.netns).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run("ip", "link", "del", host.outer)
            _run("ip", "netns", "del", host.netns)
            self.run.remove("link", host.outer)
            self.run.remove("netns", host.netns)
        _run("ip", "link", "del", self.bridge)
        self.run.remove("link", self.bridge)
        self.run.remove("subnet", str(self.subnet))
        shutil.rmtree(self.scratch, ignore_errors=True)
        if not self.scratch.exists():  # else the reaper removes it with the run
            self.run.remove("dir", str(self.scratch))

    def _inner(self, i: int) -> str:
        """Host `i`'s end of its veth, named so until it moves into the host's namespace (as eth0)."""
        return f"sh{self.tag}i{i}"

    def leftovers(self) -> list[str]:
        """Names of these hosts' namespaces and links that still exist (a test asserts none): compared whole,
        since the other test worker's names may hold this tag as a part (a veth's peer name, podman's)."""
        made = {self.bridge} | {n for i, h in enumerate(self.hosts, 1) for n in (h.netns, h.outer, self._inner(i))}
        namespaces = {line.split()[0] for line in _run("ip", "netns", "list").stdout.splitlines() if line.strip()}
        links = set(re.findall(r"^\d+: ([^:@]+)", _run("ip", "-o", "link").stdout, re.MULTILINE))
        return sorted(made & (namespaces | links))
