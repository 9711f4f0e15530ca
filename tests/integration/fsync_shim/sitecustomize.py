"""A shim the fsync tests load into a daemon (PYTHONPATH): every `os.fsync` and `os.fdatasync` is logged,
and the first one after the test arms the gate waits there until the test lets it go.

The gate is two FIFOs in $SHUFFLED_FSYNC_GATE: the shim writes a byte to `entered` (the test reading it
knows a sync is stopped inside the call, before the real one), then reads one from `release`. `armed` is a
file the test creates; the shim removes it when it stops, so only one sync waits.
"""

from __future__ import annotations

import os

_GATE = os.environ.get("SHUFFLED_FSYNC_GATE")


def _wrap(name: str) -> None:
    real = getattr(os, name)

    def gated(fd: int) -> None:
        assert _GATE is not None
        with open(os.path.join(_GATE, "log"), "a") as log:
            log.write(f"{name} {os.readlink(f'/proc/self/fd/{fd}')}\n")
        armed = os.path.join(_GATE, "armed")
        if os.path.exists(armed):
            os.unlink(armed)
            with open(os.path.join(_GATE, "entered"), "wb") as entered:
                entered.write(b"!")
            with open(os.path.join(_GATE, "release"), "rb") as release:
                release.read(1)
        real(fd)

    setattr(os, name, gated)


if _GATE:
    _wrap("fsync")
    _wrap("fdatasync")
