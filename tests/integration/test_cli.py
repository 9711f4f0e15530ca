"""The command line a newcomer meets first: help that names the flags, clear refusals."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shuffled import __version__
from shuffled.launch import DaemonProcess
from shuffled_client import AsyncClient
from tests.aio import run, within
from tests.cluster import free_port, secret_flags, start_daemon


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shuffled", *args], capture_output=True, text=True, timeout=60)


def test_cli_help_names_every_serve_flag() -> None:
    top = _cli("--help")
    assert top.returncode == 0 and "serve" in top.stdout and "demo" in top.stdout
    serve = _cli("serve", "--help")
    for flag in ("--host", "--port", "--unix-socket", "--pool-size", "--segment-size", "--data-dir", "--peers"):
        assert flag in serve.stdout


def test_version_is_the_packages() -> None:
    """`shuffled --version` prints the version the package (and so its wheel's metadata) carries."""
    version = _cli("--version")
    assert version.returncode == 0 and version.stdout == f"shuffled {__version__}\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--segment-size", "1000"], "segment-size"),
        (["--pool-size", "64K"], "pool-size"),
        (["--pool-size", "lots"], "is not a size"),
        (["--port", "70000"], "port"),
        (["--exclusive-buffers", "0"], "exclusive-buffers"),
        (["--push-window", "1"], "push-window"),
        (["--spill-high", "0.5", "--spill-low", "0.6"], "spill-low < spill-high"),
        (["--spill-high", "0.95"], "read reserve"),
        (["--app-memory-quota", "64K"], "app-memory-quota"),
        (["--app-ttl", "-1"], "app-ttl"),
        (["--flush-after", "-1"], "flush-after"),
    ],
)
def test_cli_refuses_bad_settings_naming_them(args: list[str], says: str) -> None:
    result = _cli("serve", "--port", "0", *args)
    assert result.returncode == 2
    assert says in result.stderr


def test_an_unusable_data_dir_is_a_clear_start_up_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    result = _cli("serve", "--port", "0", "--data-dir", str(tmp_path / "file" / "d"))
    assert result.returncode == 1
    assert f"data dir {tmp_path / 'file' / 'd'} is not usable" in result.stderr


def test_drain_wait_returns_once_the_daemon_has_stopped(tmp_path: Path) -> None:
    """`shuffled drain --wait` with the secrets a daemon's host has: the daemon drains and exits 0, and the
    command returns after that; without the peer secret it is refused and the daemon keeps serving."""
    host = "127.0.0.1"
    d = start_daemon(host, free_port([host]), extra=secret_flags(tmp_path, "cli-secret"))
    try:
        refused = _cli("drain", d.addr, "--secret-file", str(tmp_path / "secret"))
        assert refused.returncode == 1 and "peer secret" in refused.stderr
        (tmp_path / "wrong").write_text("not the peer secret")
        wrong = _cli(
            "drain", d.addr, "--secret-file", str(tmp_path / "secret"), "--peer-secret-file", str(tmp_path / "wrong")
        )
        assert wrong.returncode == 1 and "could not prove it has the peer secret" in wrong.stderr, wrong.stderr
        assert d.proc.poll() is None
        peer = ["--peer-secret-file", str(tmp_path / "peer-secret")]
        result = _cli("drain", d.addr, "--wait", "--timeout", "10", "--secret-file", str(tmp_path / "secret"), *peer)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"{d.addr}: draining") and result.stdout.endswith(f"{d.addr}: stopped\n")
        assert d.proc.wait(10) == 0
    finally:
        d.stop()


@within(60)
async def test_drain_wait_ends_when_a_supervisor_restarted_the_daemon() -> None:
    """Under a supervisor that restarts the daemon (systemd Restart=always) its address answers again at
    once: `shuffled drain --wait` sees another life of the daemon there and returns. The command is
    held (SIGSTOP) while the daemon exits and comes back, so it cannot see the address refuse."""

    host = "127.0.0.1"
    d = start_daemon(host, free_port([host]))
    restarted: DaemonProcess | None = None
    cmd = [sys.executable, "-m", "shuffled", "drain", d.addr, "--wait", "--timeout", "20"]
    cli = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        c = await AsyncClient.connect(d.addr)
        held = await c.open_writer("app-cli", 1, 0, 1, 1)  # the drain waits for this push
        assert cli.stdout is not None
        assert (await asyncio.to_thread(cli.stdout.readline)).startswith(f"{d.addr}: draining")
        os.kill(cli.pid, signal.SIGSTOP)
        await held.abort()
        await c.close()
        assert await asyncio.to_thread(d.proc.wait, 20) == 0
        restarted = await asyncio.to_thread(start_daemon, host, d.port)
        os.kill(cli.pid, signal.SIGCONT)
        out, _ = await asyncio.to_thread(cli.communicate, None, 20)
        assert cli.returncode == 0 and out.endswith(f"{d.addr}: stopped\n"), out
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        d.stop()
        if restarted is not None:
            restarted.stop()


def test_drain_wait_shows_how_the_hand_over_ended_and_fails_when_data_stays_behind(tmp_path: Path) -> None:
    """`shuffled drain --wait` prints the drain's final counts and exits 3 when attempts are left
    that no other daemon holds, so a rolling restart stops there. Here the only other daemon refuses the
    copy (the application is bound to another token there), and the command says so instead of printing an
    early progress line, `stopped`, and exiting 0."""
    hosts = ["127.0.0.1", "127.0.0.2"]
    port = free_port(hosts)
    flags = [
        *secret_flags(tmp_path, "cli-secret"),
        "--replicas",
        "1",
        "--peers",
        ",".join(f"{h}:{port}" for h in hosts),
    ]
    d0, d1 = [start_daemon(h, port, extra=flags) for h in hosts]

    async def push(addr: str, app_secret: str, attempt: int) -> None:
        async with await AsyncClient.connect(addr, secret="cli-secret", app_secret=app_secret) as c:
            w = await c.open_writer("app-cli", 1, 0, attempt, 1)
            await w.write(0, b"x" * 50_000)
            await w.commit()

    try:
        run(push(d1.addr, "another", 7), 30)
        run(push(d0.addr, "owner", 1), 30)
        secrets = ["--secret-file", str(tmp_path / "secret"), "--peer-secret-file", str(tmp_path / "peer-secret")]
        result = _cli("drain", d0.addr, "--wait", "--timeout", "20", *secrets)
        assert result.returncode == 3, (result.stdout, result.stderr)
        lines = result.stdout.splitlines()
        assert lines[0].startswith(f"{d0.addr}: draining") and lines[-1] == f"{d0.addr}: stopped", lines
        assert "failed=1 " in lines[-2] and "state=done" in lines[-2], lines
        assert "hand-over incomplete" in result.stderr
        assert d0.proc.wait(10) == 0
    finally:
        for d in (d0, d1):
            d.stop()


def test_a_second_daemon_on_the_default_metrics_port_is_told_which_setting_to_change() -> None:
    """Several daemons on one host need one metrics port each; the second one's start-up error
    names the setting, not only `Address already in use`."""
    host = "127.0.0.1"
    first = start_daemon(host, free_port([host]))
    try:
        metrics_port = first.http.rsplit(":", 1)[1]
        second = _cli("serve", "--host", host, "--port", "0", "--data-dir", "none", "--metrics-port", metrics_port)
        assert second.returncode == 1 and "--metrics-port" in second.stderr, second.stderr
    finally:
        first.stop()


def test_health_asks_the_metrics_port_the_environment_configures() -> None:
    """`shuffled health` (the image's HEALTHCHECK) reads the settings from the environment as `serve` does:
    the metrics port set there, on loopback when the daemon listens on every address. It needs no other
    setting (the daemon may have been given its advertise as a flag), and fails once nothing answers."""
    host = "127.0.0.1"
    d = start_daemon(host, free_port([host]))
    port = d.http.rpartition(":")[2]
    env = {**os.environ, "SHUFFLED_HOST": "0.0.0.0", "SHUFFLED_METRICS_PORT": port}

    def health() -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "shuffled", "health"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)

    try:
        result = health()
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"http://127.0.0.1:{port}/healthz: 200")
    finally:
        d.stop()
    result = health()
    assert result.returncode == 1 and f"http://127.0.0.1:{port}/healthz" in result.stderr
    env["SHUFFLED_METRICS_PORT"] = "-1"
    result = health()
    assert result.returncode == 2 and "no fixed metrics port" in result.stderr
