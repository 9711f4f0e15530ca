"""Deadlines on connections: the handshake, idle connections, peer daemons that stop answering, and parties
that stop reading their answers (`unsent-timeout`).

TCP alone does not notice a peer that is still connected but silent: a host that
vanished without a reset is found by keepalive probes only after minutes, and a
daemon whose process hangs, or a network path that drops everything while a
middlebox keeps the connection up, is never found. Streams relayed from such a
peer would wait forever and hold their buffers.

So one task looks at every connection a few times per bound. A peer connection on
which streams depend must keep sending bytes; after a third of `peer_timeout` of
silence it is sent an admin `ping`, which a live daemon answers at once whatever
its credit and back-pressure state, and after the whole `peer_timeout` it is
declared dead: its streams fail with TIMEOUT and the connection closes. Watching
bytes received rather than frames costs nothing on the data path (the connection
counts them anyway).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Set

from ...config import DaemonConfig
from ...logs import event
from ...protocol.errors import LimitExceeded, TimedOut
from ...protocol.frames import Role
from .link import DaemonLink

log = logging.getLogger(__name__)


def tick_interval(cfg: DaemonConfig) -> float:
    """A fifth of the smallest bound, between 50 ms and 1 s: a timeout fires at most 20% late."""
    bounds = [t for t in (cfg.handshake_timeout, cfg.idle_timeout, cfg.peer_timeout, cfg.unsent_timeout) if t > 0]
    return min(1.0, max(0.05, min(bounds) / 5))


async def watch(connections: Set[DaemonLink], cfg: DaemonConfig, tick: Callable[[], None] = lambda: None) -> None:
    """Check the deadlines of every connection in `connections` (the daemon's live set) until cancelled; then
    `tick` (what waits for answers to drain looks again)."""
    loop = asyncio.get_running_loop()
    interval = tick_interval(cfg)
    while True:
        await asyncio.sleep(interval)
        now = loop.time()
        for conn in list(connections):
            try:
                check(conn, now, cfg)
            except Exception:  # a bug here must not stop the deadlines of every other connection
                event(log, "checking deadlines failed", logging.ERROR, exc_info=True, peer=conn.peer)
        tick()


def check(conn: DaemonLink, now: float, cfg: DaemonConfig) -> None:
    if not conn.is_open:
        return
    live = conn.liveness
    if conn.bytes_received != live.rx_seen:
        live.rx_seen = conn.bytes_received
        live.silent_since = now
        live.pinged = False
    if not conn.ready.done():
        if now - live.made_at >= cfg.handshake_timeout:
            conn.fail(
                TimedOut(
                    f"no handshake within {now - live.made_at:.1f} s (handshake-timeout {cfg.handshake_timeout:g} s)"
                )
            )
        return
    _check_unread(conn, now, cfg)
    if not conn.is_open:
        return
    if conn.role is Role.DAEMON and cfg.peer_timeout:
        depends = conn.depends_on_peer()
        if depends and not live.depended:
            live.silent_since = max(live.silent_since, now)  # the clock starts when something waits
        live.depended = depends
        if depends:
            _check_peer(conn, now - live.silent_since, cfg.peer_timeout)
            return
    silent = now - live.silent_since
    if cfg.idle_timeout and silent >= cfg.idle_timeout and not conn.has_streams():
        conn.fail(TimedOut(f"connection idle for {silent:.1f} s (idle-timeout {cfg.idle_timeout:g} s)"))


def _check_unread(conn: DaemonLink, now: float, cfg: DaemonConfig) -> None:
    """A connection holding answers unsent whose other side has read none of its bytes for `unsent-timeout` is
    closed: it is not reading, and what it holds counts against every connection's budget (backlog.py).
    A slow reader keeps reading; a reader that stops with only data unsent holds pool memory its credit
    bounds, not copies, and is left alone."""
    live, sender = conn.liveness, conn.sender
    flushed = sender.flushed
    if flushed != live.flushed_seen or not sender.control_unsent():
        live.flushed_seen, live.unread_since = flushed, now
        return
    stuck = now - live.unread_since
    if stuck >= cfg.unsent_timeout:
        unsent = sender.control_unsent()
        event(log, "answers not read", logging.WARNING, peer=conn.peer, unsent_bytes=unsent, stuck_s=round(stuck, 1))
        conn.fail(
            LimitExceeded(
                f"{unsent} bytes of answers unread for {stuck:.0f} s (unsent-timeout {cfg.unsent_timeout:g} s): "
                "the other side does not read its socket"
            )
        )


def _check_peer(conn: DaemonLink, silent: float, bound: float) -> None:
    if silent >= bound:
        event(log, "peer timed out", logging.WARNING, node=conn.node, silent_s=round(silent, 1), bound_s=bound)
        conn.fail(TimedOut(f"daemon {conn.node} sent nothing for {silent:.1f} s (peer-timeout {bound:g} s)"))
    elif silent >= bound / 3 and not conn.liveness.pinged:
        conn.liveness.pinged = True
        conn.ping()
