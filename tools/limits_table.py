"""README's "All limits" table, rendered from the code: every bound of every layer, one row each.

Role: reads the fixed bounds of ``storage/limits.py``, ``broker/limits.py`` and ``api/limits.py``
(each a module constant followed by its one-line docstring) and the bounds operators set (the
numeric fields of the config classes, with their docstrings and, from ``api.config.setting_keys``,
their ``standalone.conf`` keys), and renders one markdown table: name, module, value with its
unit, what it bounds, key. ``python tools/limits_table.py`` prints it; ``--write`` puts it
between README's markers. ``tests/unit/test_limits_table.py`` checks README against it.

Invariants: values are read from the imported modules (what the code runs with), texts from the
source (a constant's docstring is not kept at run time); a bound without a docstring renders an
empty cell, which the test refuses outside the classes it names.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START = "<!-- limits-table:start -->"
END = "<!-- limits-table:end -->"

LIMITS_MODULES = ("storage.limits", "broker.limits", "api.limits")
"""The fixed bounds, one module per layer."""
SETTINGS = (
    ("storage.config", "StorageConfig"),
    ("broker.config", "BrokerConfig"),
    ("broker.managed_ledger_config", "ManagedLedgerConfig"),
    ("broker.quotas", "QuotaDefaults"),
    ("api.limits", "EdgeLimits"),
    ("api.pulsar.settings", "PulsarSettings"),
)
"""The config classes whose numeric fields are bounds an operator sets."""
NOT_BOUNDS = {"PulsarSettings.port", "PulsarSettings.tls_port"}
"""Numeric fields that bound nothing."""
UNIT_HELPERS = {"KiB", "MiB", "GiB", "KIB", "MIB"}
"""Module constants that only spell sizes."""

KIB, MIB, GIB = 1024, 1024 * 1024, 1024 * 1024 * 1024
UNITS = {"bytes": "bytes", "us": "µs", "ms": "ms", "s": "s", "seconds": "s", "minutes": "min", "mb": "MB"}
"""A name's unit token → the unit printed after its value."""


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    module: str
    value: int | float
    bounds: str
    key: str = ""

    def markdown(self) -> str:
        key = f"`{self.key}`" if self.key else ""
        return f"| `{self.name}` | `{self.module}` | {format_value(self.name, self.value)} | {self.bounds} | {key} |"


def format_value(name: str, value: int | float) -> str:
    """``value`` with the unit its name carries (sizes in KiB/MiB/GiB when whole, fractions of a
    second in ms; no unit when the name carries two)."""
    units = {UNITS[token] for token in name.lower().split("_") if token in UNITS}
    unit = units.pop() if len(units) == 1 else ""
    if isinstance(value, int) and value >= 2**31 - 1 and (value + 1) & value == 0:
        return f"2^{value.bit_length()} - 1 {unit}".rstrip()
    if unit == "bytes" and isinstance(value, int) and value > 0:
        return next((f"{value // size:,} {suffix}" for size, suffix in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB"))
                     if value % size == 0), f"{value:,} bytes")
    if unit == "s" and isinstance(value, float) and 0 < value < 1:
        return f"{value * 1000:g} ms"
    number = f"{value:,}" if isinstance(value, int) or not value.is_integer() else f"{int(value):,}"
    return f"{number} {unit}".rstrip()


def _docstrings(body: list[ast.stmt]) -> Iterator[tuple[str, str]]:
    """(name, docstring or "") of every plain assignment in ``body``."""
    for index, node in enumerate(body):
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if not isinstance(target, ast.Name):
            continue
        following = body[index + 1] if index + 1 < len(body) else None
        text = ""
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) \
                and isinstance(following.value.value, str):
            text = first_sentence(" ".join(following.value.value.split()))
        yield target.id, text


def first_sentence(text: str) -> str:
    """``text`` up to its first full stop outside parentheses (a docstring's summary)."""
    depth = 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "." and depth == 0 and text[index + 1 : index + 2] in ("", " "):
            return text[: index + 1]
    return text


def _source(module: str) -> ast.Module:
    path = Path(sys.modules[module].__file__ or "")
    return ast.parse(path.read_text(), filename=str(path))


def _path(module: str) -> str:
    return str(Path(sys.modules[module].__file__ or "").resolve().relative_to(ROOT))


def fixed_rows(module: str) -> list[Row]:
    """The constants of a limits module, in their order there."""
    loaded = importlib.import_module(module)
    rows = []
    for name, text in _docstrings(_source(module).body):
        value = getattr(loaded, name)
        if name in UNIT_HELPERS or not name.isupper() or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        rows.append(Row(name, _path(module), value, text))
    return rows


def setting_rows(module: str, class_name: str, keys: dict[str, str]) -> list[Row]:
    """The numeric fields of a config class, with their defaults and ``standalone.conf`` keys."""
    cls = getattr(importlib.import_module(module), class_name)
    node = next(n for n in _source(module).body if isinstance(n, ast.ClassDef) and n.name == class_name)
    texts = dict(_docstrings(node.body))
    defaults = cls()
    rows = []
    for item in dataclasses.fields(cls):
        value = getattr(defaults, item.name)
        qualified = f"{class_name}.{item.name}"
        if qualified in NOT_BOUNDS or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        rows.append(Row(qualified, _path(module), value, texts.get(item.name, ""), keys.get(qualified, "")))
    return rows


def rows() -> list[Row]:
    """Every bound: per layer, its fixed bounds, then its settings."""
    from api.config import setting_keys

    keys = setting_keys()
    found: list[Row] = []
    for layer in ("storage", "broker", "api"):
        found += fixed_rows(f"{layer}.limits")
        for module, class_name in SETTINGS:
            if module.split(".")[0] == layer:
                found += setting_rows(module, class_name, keys)
    return found


def render() -> str:
    """The table, as README holds it between its markers."""
    lines = ["| limit | module | value | bounds | `standalone.conf` key |", "|---|---|---|---|---|"]
    lines += [row.markdown() for row in rows()]
    return "\n".join(lines)


def readme_table(text: str) -> str:
    """What README holds between the markers."""
    start, end = text.index(START) + len(START), text.index(END)
    return text[start:end].strip("\n")


def write() -> None:
    text = README.read_text()
    start, end = text.index(START) + len(START), text.index(END)
    README.write_text(f"{text[:start]}\n{render()}\n{text[end:]}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        print(render())
