"""/metrics, /healthz and /readyz on a small HTTP server in its own thread.

The server runs beside the event loop, not on it, so /healthz can tell a stalled
loop from a live one: the loop stamps a heartbeat a few times a second and
/healthz fails when the stamp is older than the stall timeout. /metrics and
/readyz read daemon state on the loop (the thread hands the call over and waits,
bounded), so they never see a half-updated structure.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol, TypeVar

from .metrics import DaemonMetrics
from .stats import DaemonStats

T = TypeVar("T")

#: most seconds /metrics and /readyz wait for the event loop to answer
LOOP_CALL_TIMEOUT = 5.0


class LoopStalled(Exception):
    pass


class Observed(Protocol):
    """What the endpoints read of the daemon (which is one): this module stays below the server's."""

    @property
    def metrics(self) -> DaemonMetrics: ...

    def stats(self) -> DaemonStats: ...

    def readiness(self) -> list[str]: ...


class OpsServer:
    def __init__(self, daemon: Observed, host: str, port: int, stall_timeout: float) -> None:
        self.daemon = daemon
        self.stall_timeout = stall_timeout
        self.heartbeat = time.monotonic()
        self._interval = min(1.0, stall_timeout / 4)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beat_handle: asyncio.TimerHandle | None = None
        server_class = _Server6 if ":" in host else _Server
        try:
            self._httpd = server_class((host, port), _Handler)
        except OSError as exc:
            hint = ""
            if exc.errno == errno.EADDRINUSE:
                hint = " (daemons on one host need a metrics port each: --metrics-port, 0 for any, -1 for none)"
            raise OSError(exc.errno, f"metrics endpoint {host}:{port}: {exc.strerror}{hint}") from None
        self._httpd.ops = self
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else host
        return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._beat()
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="shuffled-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._beat_handle is not None:
            self._beat_handle.cancel()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(LOOP_CALL_TIMEOUT)
        self._httpd.server_close()

    def _beat(self) -> None:
        assert self._loop is not None
        self.heartbeat = time.monotonic()
        self._beat_handle = self._loop.call_later(self._interval, self._beat)

    def stalled_for(self) -> float:
        """Seconds since the loop last ran the heartbeat, beyond the expected interval (0 when live)."""
        return max(0.0, time.monotonic() - self.heartbeat - self._interval)

    def on_loop(self, fn: Callable[[], T]) -> T:
        """Run fn on the event loop and return its result (called from the HTTP thread)."""
        assert self._loop is not None
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:
                    fut.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        try:
            return fut.result(min(LOOP_CALL_TIMEOUT, self.stall_timeout))
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise LoopStalled("the event loop did not answer") from None

    # -- the three endpoints: (status, content type, body)

    def metrics(self) -> tuple[int, str, bytes]:
        snapshot = self.on_loop(self.daemon.stats)
        body, content_type = self.daemon.metrics.render(snapshot)
        return 200, content_type, body

    def healthz(self) -> tuple[int, str, bytes]:
        stalled = self.stalled_for()
        if stalled > self.stall_timeout:
            return 503, _TEXT, f"event loop stalled for {stalled:.1f}s\n".encode()
        return 200, _TEXT, b"ok\n"

    def readyz(self) -> tuple[int, str, bytes]:
        reasons = self.on_loop(self.daemon.readiness)
        if reasons:
            return 503, _TEXT, ("not ready: " + "; ".join(reasons) + "\n").encode()
        return 200, _TEXT, b"ready\n"


_TEXT = "text/plain; charset=utf-8"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    ops: OpsServer

    def server_bind(self) -> None:
        """Without HTTPServer's reverse lookup of the bound address (`socket.getfqdn`): it blocked the daemon's
        start for as long as the resolver took (10 s in a container whose DNS server is out of reach), while
        its listeners already accepted connections that got no answer."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = host if isinstance(host, str) else bytes(host).decode()
        self.server_port = port


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "shuffled"
    routes: dict[str, Callable[[OpsServer], tuple[int, str, bytes]]] = {
        "/metrics": OpsServer.metrics,
        "/healthz": OpsServer.healthz,
        "/readyz": OpsServer.readyz,
    }

    def do_GET(self) -> None:
        route = self.routes.get(self.path.split("?", 1)[0])
        if route is None:
            self._reply(404, _TEXT, b"not found: try /metrics, /healthz or /readyz\n")
            return
        try:
            self._reply(*route(self.server.ops))
        except LoopStalled as exc:
            self._reply(503, _TEXT, f"{exc}\n".encode())

    def _reply(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """No line per request: scrapes and probes arrive every few seconds."""
