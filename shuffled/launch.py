"""Starting `shuffled serve` as a child process and stopping it again.

One launcher for `shuffled demo`, the tests and the benchmarks, so all of them start a daemon the same
way, learn its addresses from the same ready line and never leave one running (`shuffled.children`: a
process group of its own, and a death signal when its starter dies). Kept import-light: it
runs in the process that starts daemons (the demo, a test run), not in the daemon, so it needs none of
the server's asyncio code.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing

from . import children
from .children import STOP_TIMEOUT as STOP_TIMEOUT
from .config import parse_size

READY_TIMEOUT = 30.0
LOGGED_TIMEOUT = 30.0

#: the daemon's ready line as `--log-format kv` or `json` writes it
_READY = re.compile(r' msg=ready |"msg": "ready"')


def free_port(hosts: list[str]) -> int:
    """A TCP port that is free on every one of these loopback addresses: daemons that are peers of each
    other listen on one port, each on its own address, as a cluster's daemons do on their hosts."""
    for _ in range(50):
        with closing(socket.socket()) as s:
            s.bind((hosts[0], 0))
            port = int(s.getsockname()[1])
        try:
            for h in hosts:
                with closing(socket.socket()) as t:
                    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    t.bind((h, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no common free port")


def stop_process(proc: subprocess.Popen[str], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM (a daemon drains and exits), then SIGKILL after `timeout`; safe to call again."""
    children.stop(proc, timeout)


class DaemonProcess:
    """`python -m shuffled serve` on `host`:`port` (0: the daemon picks one), its stderr read line by line.

    `interpreter` is the command that runs ``-m shuffled serve …``: the current Python by default, or one
    wrapped (``ip netns exec NAME python``) or instrumented (``python -m cProfile -o FILE``). Every line
    the daemon writes is kept in `log`; the fields of its ready line give its address and the address of
    its /metrics endpoint, whatever port it picked.
    """

    def __init__(
        self,
        host: str,
        port: int,
        pool_size: str,
        extra: Sequence[str] = (),
        *,
        interpreter: Sequence[str] = (sys.executable,),
        env: Mapping[str, str] | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.pool_size = parse_size(pool_size)
        argv = [*interpreter, "-m", "shuffled", "serve", "--host", host, "--port", str(port)]
        # several daemons (and test runs) share loopback hosts, so the metrics port is always picked
        argv += ["--pool-size", pool_size, "--metrics-port", "0", *extra]
        self.log: list[str] = []
        self.ready_line = ""
        self._done = threading.Event()
        self._lines = threading.Condition()
        self._ended = False  # stderr read to its end
        self.proc: subprocess.Popen[str] = children.spawn(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec=preexec,
        )
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        """Reads stderr to its end, so a chatty daemon never blocks on a full pipe."""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lines:
                self.log.append(line)
                self._lines.notify_all()
            if not self.ready_line and _READY.search(line):
                self.ready_line = line
                self._done.set()
        self._done.set()  # stderr closed, the daemon has ended: a waiter still waiting learns it never got ready
        with self._lines:
            self._ended = True
            self._lines.notify_all()

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> DaemonProcess:
        """Blocks until the ready line; a daemon that exits or stays silent is killed and reported."""
        if not self._done.wait(timeout) or not self.ready_line or self.proc.poll() is not None:
            code = self.proc.poll()
            why = f"exited with code {code}" if code is not None else f"logged no ready line within {timeout:.0f}s"
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
            raise RuntimeError(f"daemon on {self.host}:{self.port} {why}:\n{''.join(self.log)}")
        return self

    def logged(self, *texts: str, timeout: float = LOGGED_TIMEOUT) -> str:
        """The first line holding all the texts, waited for (blocking): the daemon logs an event after it acts,
        and its stderr is read by another thread, so a caller that has seen the act may be ahead of the line."""

        def found() -> str | None:
            return next((line for line in self.log if all(text in line for text in texts)), None)

        with self._lines:
            line = self._lines.wait_for(lambda: found() or self._ended, timeout)
        if not isinstance(line, str):
            tail = "".join(self.log[-20:])
            raise AssertionError(f"daemon on {self.host}:{self.port} logged no line with {texts!r}:\n{tail}")
        return line

    def ready_field(self, name: str) -> str:
        """A field of the ready line ("" if absent or null), in either log format."""
        m = re.search(rf'\b{name}(?:=|": ")([^\s"]+)', self.ready_line)
        return m.group(1) if m else ""

    @property
    def addr(self) -> str:
        """host:port that clients and peers use: what the daemon advertises, with the port it listens on."""
        return self.ready_field("node")

    @property
    def http(self) -> str:
        """host:port of the /metrics, /healthz and /readyz endpoint."""
        return self.ready_field("http")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        stop_process(self.proc, timeout)
