"""The compiled build's requirements: `SHUFFLED_COMPILE=1` runs mypyc, which type-checks the hot path and what
it imports. A typed runtime dependency missing from the build environment fails that check, and setup.py
then falls back to pure Python: the Docker image shipped a pure wheel that way (`pip wheel` builds in an
isolated environment that has only `build-system.requires`)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())


def _module(requirement: str) -> str:
    """`prometheus-client>=0.20` is imported as `prometheus_client`."""
    name = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert name is not None, requirement
    return name.group(0).lower().replace("-", "_")


def test_every_typed_runtime_dependency_is_in_the_build_environment() -> None:
    overrides = PYPROJECT["tool"]["mypy"]["overrides"]
    untyped = {m for o in overrides if o.get("ignore_missing_imports") for m in o["module"]}
    typed = {_module(r) for r in PYPROJECT["project"]["dependencies"]} - untyped
    build = {_module(r) for r in PYPROJECT["build-system"]["requires"]}
    assert typed, "every runtime dependency is ignore_missing_imports: the test proves nothing"
    assert typed <= build, f"mypyc cannot check the hot path without {sorted(typed - build)} in build-system.requires"
    assert "mypy" in build
