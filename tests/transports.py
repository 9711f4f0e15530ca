"""A transport for unit tests of the send loop (shuffled/net/sender.py) without a socket."""

from __future__ import annotations

from typing import Any


class InstantTransport:
    """Takes every write at once (nothing stays queued, so every lent buffer comes back at the next reap);
    a test says what it looks at in the writes (`writelines`)."""

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def writelines(self, parts: list[Any]) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False
