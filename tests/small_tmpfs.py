"""A daemon whose `--shm-dir` is a small tmpfs of its own: mounted in a mount namespace made for the daemon
(`unshare`), which clients join with `nsenter` to map its regions. Needs root, unshare and nsenter; `why_not()`
says what is missing, for a skip."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import DaemonProcess, free_port


def why_not() -> str | None:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        return "needs root, unshare and nsenter to mount a small tmpfs in a mount namespace of its own"
    return None


@dataclass
class TmpfsDaemon:
    daemon: DaemonProcess
    shm: Path
    sock: Path

    @property
    def unix(self) -> str:
        return f"unix:{self.sock}"

    def enter(self, *argv: str) -> list[str]:
        """`argv` run in the daemon's mount namespace, where its tmpfs is."""
        return ["nsenter", "-t", str(self.daemon.proc.pid), "-m", *argv]


@contextmanager
def tmpfs_daemon(tmp_path: Path, size: str, pool: str = "32M") -> Iterator[TmpfsDaemon]:
    """A daemon without a data dir whose shm-dir is a tmpfs of `size` (mount's size=, e.g. "48m")."""
    shm, sock = tmp_path / "shm", tmp_path / "d.sock"
    shm.mkdir()
    mount = f'mount -t tmpfs -o size={size} tmpfs {shm} && exec "$0" "$@"'
    flags = ["--unix-socket", str(sock), "--shm-dir", str(shm), "--data-dir", "none"]
    namespace = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, sys.executable]
    d = DaemonProcess("127.0.0.1", free_port(["127.0.0.1"]), pool, flags, interpreter=namespace)
    try:
        d.wait_ready()
        yield TmpfsDaemon(d, shm, sock)
    finally:
        d.stop()


def fill(where: TmpfsDaemon) -> list[str]:
    """A command that fills the daemon's tmpfs (a file written until ENOSPC), run in its namespace."""
    return where.enter("sh", "-c", f"cat /dev/zero > {where.shm}/filler 2>/dev/null; true")
