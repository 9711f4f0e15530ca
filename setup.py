"""Builds shuffled; with SHUFFLED_COMPILE=1 the protocol core is compiled with mypyc.

The protocol core (the codec, the protocol connection and its events) runs for
every frame on every connection; compiled, it costs the relaying daemon and the
clients 10-15 % less CPU per GiB with many streams (docs/performance.md). The
pure-Python modules are always in the package and are what runs without the
setting: an editable install stays pure Python, so an edit takes effect without
a rebuild, and a build that cannot compile (no mypy, no C compiler) says why and
installs pure Python instead of failing.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

#: where compiling pays, and nothing interpreted subclasses a class (mypyc refuses that at run time)
COMPILED = ["shuffled/protocol/codec.py", "shuffled/protocol/connection.py", "shuffled/protocol/events.py"]


def _warn(why: str) -> None:
    print(f"shuffled: not compiling the protocol core ({why}); installing pure Python", file=sys.stderr)


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
