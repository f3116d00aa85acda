"""Layering is one-way: api → broker → storage; consumers reach a broker over the network only.

Parses every module's imports (no import side effects) and fails on an edge against the
direction: storage importing broker/api, broker importing api, api importing storage,
consumers importing storage/broker/api.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "storage": {"broker", "api", "consumers"},
    "broker": {"api", "consumers"},
    "api": {"storage"},
    "consumers": {"storage", "broker", "api"},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_layering_is_one_way() -> None:
    violations = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            bad = imported_packages(path) & forbidden
            if bad:
                violations.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not violations, "\n".join(violations)
    assert any((ROOT / "storage").rglob("*.py"))
