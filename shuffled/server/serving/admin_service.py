"""Admin calls over one connection: those it answers (who may ask which: admin_ops.py), and those this daemon
makes to a peer."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ...logs import event
from ...protocol.errors import InternalError, InvalidRequest, ShuffledError, ShuttingDown
from ...protocol.frames import AdminRequest
from .admin_ops import OPERATIONS, Host
from .link import DaemonLink

log = logging.getLogger(__name__)


class AdminService:
    """The admin calls of one connection (see the module): run with the daemon's parts, `env`, and timed."""

    def __init__(self, link: DaemonLink, env: Host) -> None:
        self.link = link
        self.env = env
        self.waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}

    # -- requests the other side makes

    def on_request(self, req: AdminRequest) -> None:
        task = asyncio.create_task(self._run(req))
        background = self.env.background
        background.add(task)
        task.add_done_callback(background.discard)

    async def _run(self, req: AdminRequest) -> None:
        """Every request gets an answer or an error, whatever happens: an unanswered one would hold one
        of the connection's admin slots (and keep it from idling out) for good."""
        try:
            op = OPERATIONS.get(req.op)
            if op is None:
                raise InvalidRequest(f"unknown admin operation {req.op!r}")
            app = req.args.get("app")
            if op.peer_only:
                if self.link.from_client:
                    raise InvalidRequest(f"admin {req.op} is asked by peer daemons only")
            elif op.app_token and isinstance(app, str):
                self.link.authorize(app, req.args.get("token"))
            started = time.monotonic()
            result = await op.call(self.env, req.args, self.link)
            self.env.metrics.observe_admin(op.name, time.monotonic() - started)
        except ShuffledError as exc:
            self._fail(req, exc)
            return
        except asyncio.CancelledError:
            self._fail(req, ShuttingDown(f"admin {req.op} cancelled: the daemon is stopping"))
            raise
        except Exception as exc:  # a bug must fail this request, not leave its caller waiting
            event(log, "admin request failed", logging.ERROR, exc_info=True, op=req.op)
            self._fail(req, InternalError(f"admin {req.op} failed: {exc.__class__.__name__}: {exc}"))
            return
        self.link.proto.answer_admin(req.request, result)

    def _fail(self, req: AdminRequest, exc: ShuffledError) -> None:
        self.link.count_error(exc)
        self.link.proto.fail_admin(req.request, exc)

    @property
    def running(self) -> int:
        return self.link.proto.streams.admin_running

    # -- requests this daemon makes

    async def request(self, op: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        sid = self.link.proto.request_admin(op, args)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiters[sid] = fut
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.waiters.pop(sid, None)
            self.link.proto.forget(sid)

    def ping(self) -> None:
        """Ask a silent peer for a sign of life; the answer (any bytes) is all that matters."""
        self.link.proto.request_admin("ping", {})

    def on_answer(self, request: int, result: dict[str, Any]) -> None:
        fut = self.waiters.pop(request, None)
        if fut is not None and not fut.done():
            fut.set_result(result)

    def on_failed(self, stream: int, exc: ShuffledError) -> bool:
        """The peer failed one of our admin calls; False when `stream` is not one."""
        fut = self.waiters.pop(stream, None)
        if fut is None:
            return False
        if not fut.done():
            fut.set_exception(exc)
        return True

    def release(self, lost: ShuffledError) -> None:
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_exception(lost)
        self.waiters.clear()
