"""Child processes that cannot outlive whoever started them: `spawn` and `stop`.

Every process `shuffled demo`, the tests and the benchmarks start goes through here, so that none is left
running when its starter ends, also when the starter is killed with SIGKILL and no `finally` runs:

- each child leads a process group of its own, so `stop` reaches what the child started in turn (the
  executors a Spark worker launches) and a terminal's Ctrl-C reaches the starter only, which then stops
  its children in order;
- on Linux a child forked by the main thread gets SIGTERM when that thread ends (``PR_SET_PDEATHSIG``).
  The kernel ties that signal to the thread that forked, not to the process: a child forked by a worker
  thread would be killed as soon as that thread exits, so it gets no death signal here and relies on the
  test harness's reaper (tests/reaper.py), which also removes what is not a process.

Kept import-light, like `shuffled.launch`: it runs in the process that starts children.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

#: how long `stop` waits after SIGTERM before it kills the child's whole process group
STOP_TIMEOUT = 10.0
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once here: after a fork only async-signal-safe work belongs in the child."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl: Callable[..., int] = libc.prctl
        return prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _preexec(then: Callable[[], None] | None) -> Callable[[], None] | None:
    """The child's set-up between fork and exec: the death signal (main thread only), then ``then``."""
    if _PRCTL is None or threading.current_thread() is not threading.main_thread():
        return then
    prctl, parent = _PRCTL, os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the starter died before the signal was armed: it will never come
            os._exit(1)
        if then is not None:
            then()

    return preexec


def spawn(argv: Sequence[str], *, preexec: Callable[[], None] | None = None, **popen: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(argv, **popen)` as the leader of a new process group, with the death signal where
    it is safe (see the module's docstring); ``preexec`` runs in the child after that."""
    return subprocess.Popen(argv, process_group=0, preexec_fn=_preexec(preexec), **popen)


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def stop(proc: subprocess.Popen[Any], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM to the child (a daemon drains, a JVM runs its shutdown hooks), then after ``timeout`` SIGKILL to
    its whole process group; whatever of the group outlived the child is killed too. Safe to call again."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)  # a stopped child (SIGSTOP, a fault of the tests) cannot act on SIGTERM
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait(timeout)
            return
    _kill_group(proc)
