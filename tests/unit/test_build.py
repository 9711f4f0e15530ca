"""The compiled build's requirements: `SHUFFLED_COMPILE=1` runs mypyc, which type-checks the hot path and
everything it imports. A typed third-party package it reaches that is missing from the build environment
fails that check, and setup.py then falls back to pure Python: the Docker image shipped a pure wheel that
way (`pip wheel` builds in an isolated environment that has only `build-system.requires`)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from tests.image import compiled_modules

ROOT = Path(__file__).parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _source(module: str) -> Path | None:
    """The file of one of the package's modules (a package's `__init__.py`), None for anything else."""
    base = ROOT / Path(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _third_party_reached(roots: list[str]) -> set[str]:
    """Top-level names of the packages outside shuffled that the modules reach through their imports (at
    any depth, inside functions and under TYPE_CHECKING too, as mypy follows them), with their packages."""
    seen: set[str] = set()
    outside: set[str] = set()
    todo = [m for root in roots for m in (".".join(root.split(".")[: i + 1]) for i in range(root.count(".") + 1))]
    while todo:
        module = todo.pop()
        path = _source(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                base = ".".join([*anchor, node.module] if node.module else anchor)
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in names:
                if name.split(".")[0] in ("shuffled", "shuffled_client"):
                    todo += [".".join(name.split(".")[: i + 1]) for i in range(name.count(".") + 1)]
                else:
                    outside.add(name.split(".")[0])
    return outside


def _distribution(requirement: str) -> str:
    """`prometheus-client>=0.20` is imported as `prometheus_client`."""
    name = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert name is not None, requirement
    return name.group(0).lower().replace("-", "_")


def test_every_typed_package_the_hot_path_reaches_is_in_the_build_environment() -> None:
    overrides = PYPROJECT["tool"]["mypy"]["overrides"]
    untyped = {m for o in overrides if o.get("ignore_missing_imports") for m in o["module"]}
    dependencies = {_distribution(r) for r in PYPROJECT["project"]["dependencies"]}
    reached = _third_party_reached(compiled_modules()) & dependencies
    # msgpack is reached only through another module (frames.py, by codec.py): a walk that stopped at the
    # compiled modules' own imports would miss what mypy follows, and the test would prove nothing
    assert "msgpack" in reached, "the import walk misses what mypy sees: the test proves nothing"
    build = {_distribution(r) for r in PYPROJECT["build-system"]["requires"]}
    missing = reached - untyped - build
    assert not missing, f"mypyc cannot check the hot path without {sorted(missing)} in build-system.requires"
    assert "mypy" in build
