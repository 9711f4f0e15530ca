"""Configuration: one settings table behind the TOML file, SHUFFLED_ variables, flags, docs and `config show`."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shuffled import config as settings
from shuffled.config import ConfigError, DaemonConfig, load

ROOT = Path(__file__).resolve().parents[2]


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    settings.add_flags(parser)
    return parser.parse_args(list(flags))


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith("SHUFFLED_")} | (env or {})
    cmd = [sys.executable, "-m", "shuffled", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=full)


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "shuffled.toml"
    path.write_text('pool_size = "1G"\nport = 7400\nfloating_buffers = 4\npeers = ["a:1", "b:2"]\ndrain_timeout = 5\n')
    env = {"SHUFFLED_PORT": "7500", "SHUFFLED_FLOATING_BUFFERS": "6"}
    config, sources = load(_args("--config", str(path), "--floating-buffers", "7"), env)
    assert config.pool_size == 1 << 30 and sources["pool_size"] == str(path)
    assert config.port == 7500 and sources["port"] == "env"
    assert config.floating_buffers == 7 and sources["floating_buffers"] == "flag"
    assert config.peers == ["a:1", "b:2"] and config.drain_timeout == 5.0
    assert config.segment_size == DaemonConfig().segment_size and sources["segment_size"] == "default"


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("push_window = 32\n")
    config, _ = load(_args(), {"SHUFFLED_CONFIG": str(path)})
    assert config.push_window == 32


@pytest.mark.parametrize(
    ("toml", "env", "flags", "says"),
    [
        ('pool_size = "lots"', {}, [], "pool-size (from "),
        ("pool_size = true", {}, [], "pool-size"),
        ("port = 1.5", {}, [], "port"),
        ("pool_sise = 4", {}, [], "unknown setting(s) pool_sise"),
        ("port = ", {}, [], "not valid TOML"),
        ("", {"SHUFFLED_EXCLUSIVE_BUFFERS": "two"}, [], "exclusive-buffers (from SHUFFLED_EXCLUSIVE_BUFFERS)"),
        ("", {}, ["--log-format", "xml"], "log-format (from --log-format): 'xml' is not one of kv, json"),
        ("", {}, ["--unix-socket-mode", "999"], "unix-socket-mode"),
        ("", {}, ["--drain-timeout", "-1"], "drain-timeout must be >= 0"),
        ("", {}, ["--drain-timeout", "nan"], "drain-timeout"),
        ("", {"SHUFFLED_SEGMENT_SIZE": "1000"}, [], "segment-size must be a multiple of 4096"),
        # every daemon would be named 0.0.0.0:7337, so Spark's readers could not tell them apart
        ('host = "0.0.0.0"', {}, [], "advertise must be set when host is '0.0.0.0'"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(
    tmp_path: Path, toml: str, env: dict[str, str], flags: list[str], says: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml + "\n")
    with pytest.raises(ConfigError) as err:
        load(_args("--config", str(path), *flags), env)
    assert says in str(err.value)


def test_missing_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(_args("--config", str(tmp_path / "nope.toml")), {})


def test_config_show_reads_back_as_the_same_configuration(tmp_path: Path) -> None:
    """`config show` prints TOML that `--config` turns into exactly the configuration it showed."""
    flags = ["--pool-size", "96M", "--peers", "h1:7337,h2:7337", "--unix-socket", "/tmp/x.sock"]
    env = {"SHUFFLED_DRAIN_TIMEOUT": "2.5", "SHUFFLED_LOG_FORMAT": "json", "SHUFFLED_UNIX_SOCKET_MODE": "0600"}
    shown = _cli("config", "show", *flags, env=env)
    assert shown.returncode == 0, shown.stderr
    assert 'pool_size = "96M"  # flag' in shown.stdout
    assert "drain_timeout = 2.5  # env" in shown.stdout
    path = tmp_path / "shown.toml"
    path.write_text(shown.stdout)
    again, _ = load(_args("--config", str(path)), {})
    expected, _ = load(_args(*flags), env)
    assert again == expected


def test_every_setting_is_documented_in_the_readme() -> None:
    """The documented reference table is the generated one, so docs and code cannot drift apart."""
    doc = (ROOT / "docs" / "configuration.md").read_text()
    table = settings.render_markdown()
    assert table in doc, "docs/configuration.md is stale: paste the output of `shuffled config reference`"
    for s in settings.settings():
        assert s.meta.help and s.flag in table and s.env in table


def test_every_metric_is_documented_in_operations_md() -> None:
    """The metrics table of docs/operations.md is the one generated from the code (`shuffled metrics-reference`):
    a metric added, removed, renamed, relabelled or redescribed without the doc fails here."""
    from shuffled.cli import metrics_reference

    doc = (ROOT / "docs" / "operations.md").read_text()
    table = metrics_reference()
    assert table in doc, "docs/operations.md is stale: paste the output of `shuffled metrics-reference`"
    documented = set(re.findall(r"^\| `(shuffled_\w+)` \|", doc, re.M))
    generated = set(re.findall(r"^\| `(shuffled_\w+)` \|", table, re.M))
    assert documented == generated, f"rows not served by the daemon: {sorted(documented - generated)}"
    for name in ("shuffled_pool_segments", "shuffled_errors_total", "shuffled_read_duration_seconds"):
        assert f"| `{name}` |" in table


def test_flags_of_earlier_versions_still_work() -> None:
    """Flag names operators already use in scripts keep working."""
    old = [
        "--host", "127.0.0.2", "--port", "0", "--unix-socket", "/tmp/s", "--advertise", "h:1", "--pool-size", "64M",
        "--segment-size", "64K", "--data-dir", "/tmp/d", "--peers", "a:1,b:2", "--exclusive-buffers", "3",
        "--floating-buffers", "9", "--push-window", "20", "--log-level", "debug",
    ]  # fmt: skip
    config, _ = load(_args(*old), {})
    assert (config.exclusive_buffers, config.floating_buffers, config.push_window, config.segment_size) == (
        3,
        9,
        20,
        64 << 10,
    )


def test_reference_and_unknown_variables(tmp_path: Path) -> None:
    ref = _cli("config", "reference")
    assert ref.returncode == 0 and ref.stdout == settings.render_markdown()
    assert settings.unknown_env({"SHUFFLED_POOL_SIZ": "1G", "SHUFFLED_PORT": "1", "OTHER": "x"}) == [
        "SHUFFLED_POOL_SIZ"
    ]


def test_serve_refuses_a_bad_config_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('segment_size = "5000"\n')
    result = _cli("serve", "--config", str(path))
    assert result.returncode == 2
    assert re.search(r"invalid configuration: segment-size", result.stderr), result.stderr


def test_example_config_in_deploy_loads() -> None:
    # It listens on 0.0.0.0; the systemd unit supplies the name (SHUFFLED_ADVERTISE).
    config, sources = load(_args("--config", str(ROOT / "deploy" / "shuffled.toml")), {"SHUFFLED_ADVERTISE": "h:7337"})
    assert config.metrics_host == "0.0.0.0" and config.unix_socket == "/run/shuffled/shuffled.sock"
    assert sources["pool_size"].endswith("shuffled.toml")


@pytest.mark.parametrize(
    ("peers", "zone", "mismatch"),
    [
        ("a:1,b:2", "", None),  # no zones at all: every daemon computes the same orders
        ("a:1@z1,b:2@z2", "z1", None),
        ("a:1,b:2", "z1", "a:1 does not say @z1"),  # the others do not know a's zone
        ("a:1@z2,b:2@z2", "z1", "a:1 does not say @z1"),
        ("a:1@z1,b:2", "z1", "without @zone: b:2"),  # a does not know b's zone, b does
    ],
)
def test_a_zone_the_peers_list_does_not_carry_is_reported(peers: str, zone: str, mismatch: str | None) -> None:
    config, _ = load(_args("--peers", peers, *(["--zone", zone] if zone else [])), {})
    found = config.zone_mismatch("a:1")
    assert found is None if mismatch is None else found is not None and mismatch in found
