"""Builds shuffled; with SHUFFLED_COMPILE=1 the hot path is compiled with mypyc.

The protocol core (the codec, the protocol connection and its events) runs for
every frame on every connection, and the credit state machines, the buffer pool
and the send loop for every 32 KiB buffer: compiled, they cost a relaying daemon
and its clients less CPU per GiB, most with many streams (measured in
docs/performance.md, "The architecture step and the compiled protocol core").
The packed-group checks (`shuffled/protocol/packed.py`) are compiled for the
daemon's check of every pushed buffer: there the runs are checked and summed by a
plain loop that mypyc makes native code, 14-22 ns a run where the
interpreter's C-level calls take 40-60 (docs/performance.md, "The daemon's
ingest per run, compiled"). The two kinds of outbound stream are compiled because they
subclass the send loop's `Outbound`: mypyc refuses interpreted subclasses of
compiled classes at run time, so a module goes into COMPILED together with every
subclass of its classes, or not at all (the floating pool takes its memory by
composition for that reason).

The pure-Python modules are always in the package and are what runs without the
setting: an editable install stays pure Python, so an edit takes effect without
a rebuild, and a build that cannot compile (no mypy, no C compiler) says why and
installs pure Python instead of failing. mypy type-checks everything the hot path
imports, so the build environment needs the typed runtime dependencies too
(`prometheus-client`; pyproject.toml's build requirements): without it a `pip
wheel` in its isolated environment fell back to pure Python, and the Docker image
shipped that. The image's build now fails unless its wheel is compiled.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

#: where compiling pays (measured), with every subclass of their classes (mypyc refuses interpreted ones)
COMPILED = [
    "shuffled/protocol/codec.py",
    "shuffled/protocol/connection.py",
    "shuffled/protocol/handshake.py",
    "shuffled/protocol/inbound.py",
    "shuffled/protocol/streams.py",
    "shuffled/protocol/resume.py",
    "shuffled/protocol/events.py",
    "shuffled/protocol/packed.py",
    "shuffled/protocol/credit.py",
    "shuffled/buffers/pool.py",
    "shuffled/net/sender.py",
    "shuffled/net/streams.py",
]


def _warn(why: str) -> None:
    print(f"shuffled: not compiling the hot path ({why}); installing pure Python", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """A compiler that fails leaves the pure-Python package, with a warning, rather than no package."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # CompileError, LinkError, a missing compiler: all mean "pure Python"
            _warn(f"{exc.__class__.__name__}: {exc}")


def extensions() -> list[Any]:
    if os.environ.get("SHUFFLED_COMPILE") != "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc is not installed")
        return []
    try:
        return list(mypycify(COMPILED, opt_level="3"))
    except (Exception, SystemExit) as exc:  # mypy's type errors end in SystemExit
        _warn(f"mypyc failed: {exc}")
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
