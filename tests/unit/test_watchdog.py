"""The watchdog's unsent-timeout (shuffled/server/serving/watchdog.py): a connection whose answers its other
side has not read for the bound is failed, and one that is merely new is not, however long the loop's clock
ran before it was made (the clock is the host's monotonic time, days on a long-running host)."""

from __future__ import annotations

from types import SimpleNamespace

from shuffled.config import DaemonConfig
from shuffled.protocol.errors import ShuffledError
from shuffled.server.serving.link import Liveness
from shuffled.server.serving.watchdog import _check_unread

UPTIME = 86_400.0  # a day: where the loop's clock is on a host up that long


class _Sender:
    """What the watchdog reads of a connection's sender: bytes the kernel took, and answers still held."""

    def __init__(self, unsent: int) -> None:
        self.flushed = 0
        self.unsent = unsent

    def control_unsent(self) -> int:
        return self.unsent


def _connection(made_at: float, unsent: int) -> SimpleNamespace:
    failed: list[ShuffledError] = []
    return SimpleNamespace(
        liveness=Liveness.starting(made_at), sender=_Sender(unsent), peer="client", fail=failed.append, failed=failed
    )


def test_a_new_connection_whose_first_answers_wait_is_not_failed() -> None:
    """Nothing flushed yet (a TLS handshake holds the first answers) on the first look, a day into the clock."""
    cfg = DaemonConfig()
    conn = _connection(UPTIME, 58)
    _check_unread(conn, UPTIME + 1.0, cfg)  # type: ignore[arg-type]
    assert conn.failed == []


def test_answers_unread_for_the_bound_fail_the_connection() -> None:
    cfg = DaemonConfig()
    conn = _connection(UPTIME, 58)
    _check_unread(conn, UPTIME + cfg.unsent_timeout - 1.0, cfg)  # type: ignore[arg-type]
    assert conn.failed == []
    _check_unread(conn, UPTIME + cfg.unsent_timeout + 1.0, cfg)  # type: ignore[arg-type]
    (error,) = conn.failed
    assert "58 bytes of answers unread for 61 s" in error.message


def test_a_reader_that_keeps_reading_is_never_failed() -> None:
    cfg = DaemonConfig()
    conn = _connection(UPTIME, 58)
    for step in range(1, 5):
        conn.sender.flushed += 100  # the other side took some bytes since the last look
        _check_unread(conn, UPTIME + step * cfg.unsent_timeout, cfg)  # type: ignore[arg-type]
    assert conn.failed == []
