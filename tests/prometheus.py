"""A real Prometheus server with the deploy/ config, scraping daemons for the tests (the deploy tests scrape a
daemon process, the image tests a daemon container). Skips with the reason where `prometheus` is missing
(`.ci/run` installs it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from shuffled import children
from tests.cluster import free_port, http_get

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (.ci/run installs it)")
    return path


def prometheus_dir(tmp_path: Path, target: str, interval: str | None = None) -> Path:
    """A copy of deploy/prometheus with one file_sd target (and a shorter interval for tests)."""
    yaml = pytest.importorskip("yaml")
    work = tmp_path / "prometheus"
    shutil.copytree(DEPLOY / "prometheus", work)
    (work / "targets").mkdir()
    (work / "targets" / "shuffled.json").write_text(json.dumps([{"targets": [target], "labels": {"env": "test"}}]))
    if interval:
        doc = yaml.safe_load((work / "prometheus.yml").read_text())
        doc["global"]["scrape_interval"] = doc["global"]["evaluation_interval"] = interval
        (work / "prometheus.yml").write_text(yaml.safe_dump(doc))
    return work


def query(api: str, promql: str) -> list[dict[str, Any]]:
    status, body = http_get(api, f"/api/v1/query?query={quote(promql)}")
    assert status == 200, body
    result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
    return result


def scrapes(api: str) -> bool:
    """Whether Prometheus answers and has scraped its target successfully (`up` is 1)."""
    try:
        status, text = http_get(api, "/api/v1/query?query=up")
    except OSError:
        return False  # not listening yet
    return status == 200 and any(r["value"][1] == "1" for r in json.loads(text)["data"]["result"])


@contextmanager
def prometheus_server(tmp_path: Path, target: str) -> Iterator[str]:
    """Prometheus on a free loopback port scraping ``target`` every second; yields its API address. Its log
    is printed if the body fails."""
    binary = tool("prometheus")
    work = prometheus_dir(tmp_path, target, interval="1s")
    api = f"127.0.0.1:{free_port(['127.0.0.1'])}"
    argv = [
        binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
        f"--web.listen-address={api}", "--log.level=warn",
    ]  # fmt: skip
    log_path = tmp_path / "prometheus.log"
    with log_path.open("w") as log:
        proc = children.spawn(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield api
        except BaseException:
            print(log_path.read_text(), file=sys.stderr)
            raise
        finally:
            children.stop(proc, 30)
