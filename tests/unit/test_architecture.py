"""The package's layering, read from the source: no import cycles, and a protocol core that depends on nothing.

The graph is built with `ast`, not by importing, so it sees every import a module can make: top-level
ones, those inside functions (which hide a cycle from the interpreter but not from the design) and
those under `if TYPE_CHECKING:` (which hide it from the interpreter altogether).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "shuffled"


def module_name(path: Path) -> str:
    """`shuffled/server/storage/store.py` is `shuffled.server.storage.store`; a package's `__init__.py`, the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, package: str, modules: set[str]) -> set[str]:
    """The modules of `modules` that `source`, a module of `package`, imports anywhere in it."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from . import config` names a module; `from .store import Store` names an attribute.
            targets.update(
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
            )
    return targets & modules


def import_graph() -> dict[str, set[str]]:
    """Each module of `shuffled` to the other modules of `shuffled` it imports."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = imported(path.read_text(), package, set(paths)) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as the list of modules along it (the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for target in sorted(graph[module]):
            if cycle := visit(target):
                return cycle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        if cycle := visit(module):
            return cycle
    return None


def test_graph_sees_every_kind_of_import() -> None:
    """The checks below mean something only if the parser finds the imports they are about."""
    modules = {"p", "p.a", "p.b", "p.c", "p.d", "p.e", "p.q", "p.q.f"}
    source = """
import p.a
from .b import name
from . import c
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from .d import Hidden
def late():
    from .e import Late
"""
    assert imported(source, "p", modules) == {"p.a", "p.b", "p.c", "p.d", "p.e"}
    assert imported("from .. import version\nfrom . import f", "p.q", modules) == {"p", "p.q.f"}
    assert "shuffled.server.daemon" in import_graph()["shuffled.cli"]  # the real package is read too


def test_no_import_cycles() -> None:
    """Modules form layers: a cycle means neither module can be understood, tested or replaced alone."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_protocol_depends_on_nothing_else_in_the_package() -> None:
    """The sans-IO core is the bottom layer: the daemon, the net shell and the clients build on it, not it on them."""
    for module, targets in import_graph().items():
        if module.startswith("shuffled.protocol"):
            outside = {target for target in targets if not target.startswith("shuffled.protocol")}
            assert not outside, f"{module} imports {sorted(outside)}"
