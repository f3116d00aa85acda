"""Layering is one-way and through front doors: api → broker → storage; consumers reach a broker
over the network only; no module imports itself back through a circle.

Parses every module's imports (no import side effects) and checks, module by module:

- ``storage`` imports nothing of ``broker``, ``api`` or ``consumers``;
- ``broker`` imports ``storage`` only through its package (``from storage import X``), never a
  storage module, and nothing of ``api`` or ``consumers``;
- ``api`` imports ``broker`` only through its package (the broker's face) or the cluster's face
  (``broker.cluster``, which only the cluster commands load), never a broker module, and
  nothing of ``storage``;
- ``consumers`` imports nothing of ``storage``, ``broker`` or ``api``;
- the import graph of the project's modules (imports under ``if TYPE_CHECKING:`` excluded) has
  no cycle.

The last test shows the checker itself catches each kind of violation on a made-up tree.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("storage", "broker", "api", "consumers")
FORBIDDEN = {
    "storage": {"broker", "api", "consumers"},
    "broker": {"api", "consumers"},
    "api": {"storage"},
    "consumers": {"storage", "broker", "api"},
}
FRONT_DOOR_ONLY = {"broker": ("storage", {"storage"}), "api": ("broker", {"broker", "broker.cluster"})}
"""A package whose modules may use another package only through that package's front doors."""


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement except those under ``if TYPE_CHECKING:``."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        pending.extend(ast.iter_child_nodes(node))


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules ``path`` imports, as dotted names (``from pkg import mod`` counts as ``pkg.mod``
    when that is a module, else as ``pkg``)."""
    names: set[str] = set()
    for node in _runtime_imports(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                names.add(candidate if candidate in known else node.module)
    return names


def project_modules(root: Path) -> dict[str, Path]:
    return {module_name(root, path): path for package in PACKAGES if (root / package).is_dir()
            for path in sorted((root / package).rglob("*.py"))}


def violations(root: Path) -> list[str]:
    modules = project_modules(root)
    known = set(modules)
    found: list[str] = []
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".")[0]
        imports = imported_modules(path, known)
        graph[name] = {i for i in imports if i in known}
        for imported in sorted(imports):
            top = imported.split(".")[0]
            if top in FORBIDDEN.get(package, set()):
                found.append(f"{name} imports {imported} ({package} may not use {top})")
            elif package in FRONT_DOOR_ONLY and FRONT_DOOR_ONLY[package][0] == top \
                    and imported not in FRONT_DOOR_ONLY[package][1]:
                doors = " or ".join(sorted(FRONT_DOOR_ONLY[package][1]))
                found.append(f"{name} imports {imported}: {package} uses {top} only through {doors}")
    found += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph)]
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_layering_is_one_way_through_front_doors_and_without_cycles() -> None:
    found = violations(ROOT)
    assert not found, "\n".join(found)
    assert len(project_modules(ROOT)) > 50


def test_the_checker_catches_each_kind_of_violation(tmp_path: Path) -> None:
    files = {
        "storage/__init__.py": "from storage.journal import Journal\n",
        "storage/journal.py": "import api\n",  # storage using the api
        "broker/__init__.py": "from broker.service import Service\n",
        "broker/service.py": "from storage.journal import Journal\nfrom broker.topic import T\n",  # past the door
        "broker/topic.py": "from broker.service import Service\n",  # a cycle with service
        "broker/producer.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from broker.service import S\n",
        "api/__init__.py": "",
        "api/routes.py": "from broker.service import Service\nimport storage\n",  # past the face; storage
        "api/cluster.py": "from broker.cluster import Cluster\nfrom broker.cluster.zk import Store\n",  # 2nd door ok
        "consumers/__init__.py": "from api import routes\n",
    }
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    found = violations(tmp_path)
    expected = ["storage.journal imports api", "broker.service imports storage.journal",
                "api.routes imports broker.service", "api.routes imports storage",
                "consumers imports api.routes", "import cycle: broker.service -> broker.topic"]
    for fragment in expected:
        assert any(fragment in line for line in found), (fragment, found)
    assert not any("broker.producer" in line for line in found)  # TYPE_CHECKING imports do not count
    assert any("api.cluster imports broker.cluster.zk" in line for line in found)  # behind the second door
    assert not any("api.cluster imports broker.cluster:" in line for line in found)  # the second door itself
