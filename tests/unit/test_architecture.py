"""The package's layering, read from the source: which package may import which, no import cycles,
and a protocol core that depends on nothing.

The graph is built with `ast`, not by importing, so it sees every import a module can make: top-level
ones, those inside functions (which hide a cycle from the interpreter but not from the design) and
those under `if TYPE_CHECKING:` (which hide it from the interpreter altogether). It covers the
daemon's package, the Python client and the benchmarks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
#: the packages read, each from the directory that holds it
PACKAGES = {
    ROOT / "shuffled": ROOT,
    ROOT / "client/python/shuffled_client": ROOT / "client/python",
    ROOT / "benchmarks": ROOT,
}

#: Which unit may import which (besides itself): a unit is a package, or a module of the top level of
#: `shuffled`, and a module belongs to the longest unit that names it or its package. Lower layers
#: first; nothing imports a unit above it, so serving builds on the cluster, accounting and storage and
#: none of them on serving. ops holds the stats snapshot the server fills in and publishes it (metrics,
#: HTTP), so the server imports ops and ops nothing of the server.
PROTOCOL = "shuffled.protocol"
BELOW_SERVER = {PROTOCOL, "shuffled.buffers", "shuffled.config", "shuffled.logs", "shuffled.net", "shuffled.ops"}
STORAGE, ACCOUNTING = "shuffled.server.storage", "shuffled.server.accounting"
CLUSTER, SERVING = "shuffled.server.cluster", "shuffled.server.serving"
LAYERS: dict[str, set[str]] = {
    PROTOCOL: set(),
    "shuffled.logs": set(),
    "shuffled": set(),  # the package's __init__: its version
    "shuffled.buffers": {PROTOCOL},
    "shuffled.config": {PROTOCOL},
    "shuffled.net": {PROTOCOL, "shuffled.buffers"},
    "shuffled.ops": {"shuffled", PROTOCOL},
    # what the daemon holds: the store, the data dir, spilling, loading back (settings: the object store's)
    STORAGE: {PROTOCOL, "shuffled.buffers", "shuffled.config", "shuffled.logs", "shuffled.ops"},
    # counting and sharing out what is stored and sent
    ACCOUNTING: BELOW_SERVER | {STORAGE},
    # the daemons together: peers, membership, placement, replication, the drain
    CLUSTER: BELOW_SERVER | {STORAGE, ACCOUNTING},
    # connections and what they run
    SERVING: BELOW_SERVER | {STORAGE, ACCOUNTING, CLUSTER},
    # the composition root (daemon.py)
    "shuffled.server": BELOW_SERVER | {STORAGE, ACCOUNTING, CLUSTER, SERVING},
    "shuffled_client": {PROTOCOL, "shuffled.buffers", "shuffled.net"},
    # the top: what a user runs
    "shuffled.children": set(),
    "shuffled.launch": {"shuffled.children", "shuffled.config"},
    "shuffled.spark_jar": {"shuffled"},
    "shuffled.spark_settings": {"shuffled.spark_jar"},
    "shuffled.spark_demo": {"shuffled.spark_jar", "shuffled_client"},
    "shuffled.demo": {"shuffled.launch", "shuffled.spark_demo", "shuffled_client"},
    "shuffled.cli": BELOW_SERVER
    | {"shuffled", "shuffled.server", "shuffled.demo", "shuffled.spark_jar", "shuffled_client"},
    "shuffled.__main__": {"shuffled.cli"},
    # (the object store's layer is measured on its own)
    "benchmarks": {"shuffled.children", "shuffled.config", "shuffled.launch", "shuffled.spark_jar"}
    | {"shuffled_client", PROTOCOL, STORAGE},
}


def module_name(path: Path) -> str:
    """`shuffled/server/storage/store.py` is `shuffled.server.storage.store`; a package's `__init__.py`, the package."""
    base = next(base for package, base in PACKAGES.items() if path.is_relative_to(package))
    parts = path.relative_to(base).with_suffix("").parts
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
    """Each module read to the other modules read that it imports."""
    paths = {module_name(path): path for package in PACKAGES for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = imported(path.read_text(), package, set(paths)) - {name}
    return graph


def unit(module: str) -> str:
    """The unit of LAYERS `module` belongs to ("" for none); `shuffled` is its `__init__` alone."""
    units = (u for u in LAYERS if module == u or (u != "shuffled" and module.startswith(u + ".")))
    return max(units, key=len, default="")


def wrong_direction(graph: dict[str, set[str]]) -> list[str]:
    """Every import of `graph` that LAYERS does not allow, as 'module -> target'."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if unit(target) != unit(module) and unit(target) not in LAYERS.get(unit(module), set())
    )


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


def test_every_module_has_a_layer() -> None:
    """A new package must be placed in the table before the direction of its imports can be judged."""
    homeless = sorted(module for module in import_graph() if not unit(module))
    assert not homeless, f"add to LAYERS: {homeless}"


def test_layers_point_one_way() -> None:
    """The table itself has no cycle: no two units may import each other, however indirectly."""
    cycle = find_cycle({u: {t for t in allowed if t in LAYERS} for u, allowed in LAYERS.items()})
    assert cycle is None, "layers import each other: " + " -> ".join(cycle or [])


def test_a_wrong_direction_import_is_found() -> None:
    """The check below sees an import against the table (storage reaching up into serving) and passes
    those it allows (serving building on storage, a package importing its own modules)."""
    graph = {
        "shuffled.server.storage.store": {"shuffled.server.serving.connection", "shuffled.server.storage.disk"},
        "shuffled.server.serving.connection": {"shuffled.server.storage.store"},
        "shuffled.net.sender": {"shuffled.ops.metrics"},
    }
    assert wrong_direction(graph) == [
        "shuffled.net.sender -> shuffled.ops.metrics",
        "shuffled.server.storage.store -> shuffled.server.serving.connection",
    ]


def test_packages_import_only_what_lies_below_them() -> None:
    """Each unit imports only the units LAYERS allows it (serving -> storage, never back)."""
    wrong = wrong_direction(import_graph())
    assert not wrong, "imports against the layers (tests/unit/test_architecture.py LAYERS):\n" + "\n".join(wrong)


#: What of storage the rest of the daemon may import: its door (manager.py: open, read, drop, flush, ...), the
#: handles the door gives out (a push's writer, a read's view), and plain helpers that hold no stored state
#: (the data dir's opening and its directory names, object keys and leases, which the sweep reads). The
#: store, the shuffles and their map outputs are storage's own: a module that cannot import them cannot
#: reach into their dicts and arrays, so what commit, drop, flush and persist do stays written once.
STORAGE_DOOR = {
    f"{STORAGE}.{name}"
    for name in ("manager", "holdings", "writer", "view", "disk", "at_rest", "lease", "object_format", "objects")
}


def test_the_rest_of_the_daemon_uses_storage_only_through_its_door() -> None:
    """Outside storage/, the daemon imports only STORAGE_DOOR of it."""
    graph = import_graph()
    inside = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("shuffled.") and unit(module) != STORAGE
        for target in targets
        if unit(target) == STORAGE and target not in STORAGE_DOOR
    )
    assert not inside, "storage reached past its door (tests/unit/test_architecture.py STORAGE_DOOR):\n" + "\n".join(
        inside
    )


#: The house rule: no class over 200 lines (one that grows past it does several things: split it into parts
#: named from the domain, as the store, the tier, the spiller, the pool, the read view, the push session and
#: the client were), in the daemon's package and the Python client's.
MAX_CLASS_LINES = 200
#: Classes let past it, each with its own cap so it cannot drift either, and why.
CLASS_ALLOWANCES = {
    # Every setting once, each a field with its default, help, unit, parser and metavar: a declarative
    # table the flags, the TOML file, the environment and the generated docs are all read from, not
    # behaviour. Nested groups would not make one setting easier to find, and would have to be flattened
    # again for the flat names, flags, file keys and docs tables (docs/architecture.md, "The code").
    "shuffled.config.DaemonConfig": 700,
}


def class_lengths(source: str, module: str) -> dict[str, int]:
    """Each class of `source` to its lines, decorators aside; nested classes too, named by the classes they
    are in."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.ClassDef):
                name = f"{prefix}.{child.name}"
                lengths[name] = (child.end_lineno or child.lineno) - child.lineno + 1
            visit(child, name)

    visit(ast.parse(source), module)
    return lengths


def test_class_lengths_are_measured() -> None:
    """The rule below means something only if a long class is measured as long, nested or not."""
    body = "    x = 1\n" * 300
    source = (
        f"class Small:\n    pass\n\ndef f():\n    class Inner:\n{body.replace('    ', '        ')}\nclass Big:\n{body}"
    )
    assert class_lengths(source, "m") == {"m.Small": 2, "m.Inner": 301, "m.Big": 301}


def test_no_class_is_over_the_size_rule() -> None:
    """No class of the daemon's or the client's package is over MAX_CLASS_LINES, but those CLASS_ALLOWANCES
    names (each under its own cap)."""
    lengths: dict[str, int] = {}
    for package in (ROOT / "shuffled", ROOT / "client" / "python" / "shuffled_client"):
        for path in package.rglob("*.py"):
            lengths.update(class_lengths(path.read_text(), module_name(path)))
    assert set(CLASS_ALLOWANCES) <= set(lengths), "an allowance names a class that is gone: drop it"
    over = sorted(
        f"{name}: {n} lines (at most {CLASS_ALLOWANCES.get(name, MAX_CLASS_LINES)})"
        for name, n in lengths.items()
        if n > CLASS_ALLOWANCES.get(name, MAX_CLASS_LINES)
    )
    assert not over, "classes over the size rule (split them into parts named from the domain):\n" + "\n".join(over)
