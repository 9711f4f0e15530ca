"""The package as a wheel built from this tree, as users get it: pure Python, or with the hot path compiled by
mypyc (`SHUFFLED_COMPILE=1`, setup.py's COMPILED), as the container image ships it. Tests that install it into
an environment of their own use `build_wheel` (tests/spark/test_packaging.py); those that run daemons from it
next to the tree's tests install it into a directory (`install_into`) and start daemons with its `launch`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


#: the wheels this test run built, by form (compiled or not): built once, as building the compiled one takes
#: one to two minutes, and the tests only install them
_BUILT: dict[bool, Path] = {}


def build_wheel(work: Path, compiled: bool) -> Path:
    """The wheel `pip wheel` builds (in its isolated build environment) from a copy of the tracked files under
    `work`: setuptools' build/ in the tree would otherwise leave the tree dirty and could carry files the
    tree no longer has into the wheel. Once per run and form: a later call gets the same file (under the
    first caller's `work`, which pytest keeps until the run ends)."""
    if compiled not in _BUILT:
        _BUILT[compiled] = _build_wheel(work, compiled)
    return _BUILT[compiled]


def _build_wheel(work: Path, compiled: bool) -> Path:
    source = work / "source"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60)
    for name in tracked.stdout.decode().split("\0"):
        if name:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name, follow_symlinks=False)
    wheels = work / "wheels"
    build_env = {**os.environ, "SHUFFLED_COMPILE": "1" if compiled else ""}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
        env=build_env,
    )
    (wheel,) = wheels.glob("shuffled-*.whl")
    return wheel


@dataclass(frozen=True)
class Installed:
    """A wheel installed into a directory of its own; its Python programs run with the dependencies of the
    tests' interpreter."""

    path: Path

    @property
    def interpreter(self) -> tuple[str, ...]:
        """`-P`: the working directory (the source tree, for `python -m`) does not go first on sys.path, so
        the installed package is the one imported."""
        return (sys.executable, "-P")

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.path)}

    def module_file(self, module: str) -> str:
        """Where a module of the installed package is loaded from (a .so when compiled)."""
        code = f"import importlib; print(importlib.import_module({module!r}).__file__)"
        run = subprocess.run(
            [*self.interpreter, "-c", code], env=self.env, capture_output=True, text=True, check=True, timeout=60
        )
        return run.stdout.strip()


def install_into(wheel: Path, target: Path) -> Installed:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return Installed(target)
