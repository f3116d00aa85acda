"""Layering is one-way and through front doors: api → broker → storage; consumers reach a broker
over the network only; no module imports itself back through a circle.

Parses every module's imports (no import side effects) and checks, module by module:

- ``storage`` imports nothing of ``broker``, ``api`` or ``consumers``;
- ``broker`` imports ``storage`` only through its package (``from storage import X``), never a
  storage module, and nothing of ``api`` or ``consumers``;
- ``api`` imports ``broker`` only through its package (the broker's face) or the cluster's face
  (the module ``broker.cluster``, which only the cluster commands load), never another broker
  module, and nothing of ``storage``;
- ``consumers`` imports nothing of ``storage``, ``broker`` or ``api``;
- the import graph of the project's modules (imports under ``if TYPE_CHECKING:`` excluded) has
  no cycle;
- counting the ``TYPE_CHECKING`` imports too (a module that names another's type for its
  annotations and is called back by it at run time is in a circle all the same), the graph has
  no cycle either: a part that calls back what builds it names a narrow ``typing.Protocol`` of
  its own instead (``broker/producer.py``'s ``ProducerTopics``, ``broker/topic_admin.py``'s
  ``AdminTopics``), or takes a callable.

Two tests show the checker itself catches each kind of violation on a made-up tree; the last
one that the standalone broker's imports never load kazoo (only the cluster's do).
"""

from __future__ import annotations

import ast
import subprocess
import sys
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


def _imports(tree: ast.Module, *, type_checking: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement; those under ``if TYPE_CHECKING:`` only when ``type_checking``."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if not type_checking and isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        pending.extend(ast.iter_child_nodes(node))


def imported_modules(path: Path, known: set[str], *, type_checking: bool = False) -> set[str]:
    """The modules ``path`` imports, as dotted names (``from pkg import mod`` counts as ``pkg.mod``
    when that is a module, else as ``pkg``); ``TYPE_CHECKING`` imports only when ``type_checking``."""
    names: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), filename=str(path)), type_checking=type_checking):
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


def import_graph(root: Path, *, type_checking: bool) -> dict[str, set[str]]:
    """Each project module's imports of other project modules."""
    modules = project_modules(root)
    known = set(modules)
    return {name: imported_modules(path, known, type_checking=type_checking) & known
            for name, path in modules.items()}


def describe_cycles(graph: dict[str, set[str]], runtime: dict[str, set[str]]) -> list[str]:
    """Each cycle of ``graph`` with its imports, marking those that only ``TYPE_CHECKING`` makes."""
    lines = []
    for cycle in cycles(graph):
        edges = [f"{a} -> {b}{'' if b in runtime.get(a, set()) else ' (TYPE_CHECKING)'}"
                 for a in cycle for b in sorted(graph[a]) if b in cycle]
        lines.append(f"import cycle: {' -> '.join(cycle)}; its imports: {', '.join(edges)}")
    return lines


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


def test_no_cycle_counting_type_checking_imports() -> None:
    graph = import_graph(ROOT, type_checking=True)
    assert cycles(graph) == [], "\n".join(describe_cycles(graph, import_graph(ROOT, type_checking=False)))


def test_the_checker_counts_type_checking_imports_when_asked(tmp_path: Path) -> None:
    files = {
        "broker/__init__.py": "",
        "broker/service.py": "from broker.producer import Producer\n",
        "broker/producer.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from broker.service import S\n",
    }
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    assert cycles(import_graph(tmp_path, type_checking=False)) == []
    graph = import_graph(tmp_path, type_checking=True)
    assert cycles(graph) == [["broker.producer", "broker.service"]]
    assert describe_cycles(graph, import_graph(tmp_path, type_checking=False)) == [
        "import cycle: broker.producer -> broker.service; its imports: "
        "broker.producer -> broker.service (TYPE_CHECKING), broker.service -> broker.producer"]


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


def test_standalone_imports_never_load_kazoo() -> None:
    """``storage``'s ZooKeeper names (``storage/registration.py``, ``storage/bookie_process.py``)
    load kazoo only when first asked for: the standalone broker and its edge never load it, the
    cluster's face does."""
    script = (
        "import sys\n"
        "import api.app, api.cli, broker, storage\n"
        "from broker import BrokerService\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kazoo')[:3])\n"
        "from storage import BookieRegistration, connect, run_bookie\n"
        "print('kazoo.client' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "True"], result.stdout
