"""Limits live in one place per layer, carry their unit, and README's table is the code's.

- README's "All limits" table is what ``tools/limits_table.py`` renders from the code: a bound
  changed, added or removed in the code and not in README (or the other way) fails here.
- Every module constant of ``storage/``, ``broker/`` and ``api/`` named like a bound
  (``..._MAX``, ``..._MIN``, ``MAX_...``, ``..._LIMIT...``) is defined in its layer's limits module;
  the few that are not bounds (integer ranges of wire formats, the kernel's ``IOV_MAX``) are named
  below with the reason.
- Every constant of a limits module carries a unit in its name and a docstring saying what it
  bounds, and every setting row of the table says what it bounds.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tools.limits_table import README, readme_table, render, rows

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("storage", "broker", "api")
BOUND_NAME = re.compile(r"(^|_)(MAX|MIN|LIMIT)(_|$)")
NOT_BOUNDS = {
    # the integer ranges of wire and storage formats: what a field can hold, not a limit we chose
    ("storage/entry_location_index.py", "U64_MAX"),
    ("storage/ledger_storage.py", "ENTRY_ID_MAX"),
    ("broker/entry_builder.py", "SEQUENCE_ID_MAX"),
    ("broker/message_fields.py", "SEQUENCE_ID_MAX"),
    ("broker/message_fields.py", "OFFSET_MAX"),
    ("broker/message_fields.py", "VERSION_MAX"),
    ("broker/time_format.py", "TIME_MS_MAX"),
    ("broker/namespace/bundles.py", "HASH_MAX"),
    ("broker/entry_format/wire.py", "UINT64_MAX"),
    ("broker/entry_format/wire.py", "INT64_MIN"),
    ("broker/entry_format/wire.py", "INT64_MAX"),
    ("broker/entry_format/common_entry.py", "_INT32_MAX"),
    ("broker/entry_format/columns.py", "_INT32_MAX"),
    ("broker/entry_frames.py", "_INT64_MAX"),
    ("broker/message_id.py", "_INT64_MIN"),
    ("broker/message_id.py", "_INT64_MAX"),
    ("broker/message_id.py", "_INT32_MAX"),
    ("api/pulsar/hot_commands.py", "_VARINT_BYTES_MAX"),
    ("api/pulsar/session.py", "PROTOCOL_VERSION_MAX"),
    # the kernel's bound on the buffers of one writev, not ours
    ("storage/fileio.py", "IOV_MAX"),
}
AWAITING_SPLIT: set[tuple[str, str]] = set()
UNIT = re.compile(r"(^|_)(BYTES|MS|S|US|SECONDS|MINUTES|MB|ENTRIES|ROWS|ITEMS|MESSAGES|FRAMES|COMMANDS|CHARS|"
                  r"PERMITS|ATTEMPTS|RETRIES|TRIES|MERGES|OPS|IDS|KEYS|ROLES|VERSIONS|PARTITIONS|BUNDLES|"
                  r"COUNT|FILES|POSITIONS|HINTS|WATCHERS|WATCHES|RANGES|REQUESTS|TOPICS|CONSUMERS|PRODUCERS|EVENTS|TAGS|TERMS|"
                  r"DELETES|ASSIGNMENTS|COUNTS|HEADS|TEXTS|PULLS|SIZE|RATE|INDEX|FD|HANDLES|CLUSTERS|GROUPS)(_|$)")
"""Units and counted things a bound's name may end in (before ``_MAX``/``_MIN``/``_DEFAULT``)."""
UNIT_OF_ITS_KEYS = {"QUOTA_CONFIG_VALUE_MAX"}
"""Bounds several ``standalone.conf`` keys, each in its own unit (a count, messages or bytes)."""


def _module_constants(path: Path) -> list[str]:
    names = []
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        names += [target.id for target in targets if isinstance(target, ast.Name)]
    return names


def _layer_files() -> list[Path]:
    return [path for layer in LAYERS for path in sorted((ROOT / layer).rglob("*.py"))
            if "proto" not in path.parts and path.name != "limits.py"]


def test_readme_table_is_rendered_from_the_code() -> None:
    assert readme_table(README.read_text()) == render(), \
        "README's limits table differs from the code: run `python tools/limits_table.py --write`"


def test_every_bound_is_defined_in_its_layers_limits_module() -> None:
    stray = [(str(path.relative_to(ROOT)), name) for path in _layer_files() for name in _module_constants(path)
             if BOUND_NAME.search(name.lstrip("_"))]
    outside = sorted(set(stray) - NOT_BOUNDS - AWAITING_SPLIT)
    assert outside == [], f"bounds outside storage/, broker/ or api/limits.py: {outside}"
    assert set(stray) >= NOT_BOUNDS | AWAITING_SPLIT, "an exception above names a constant that is gone"


def test_each_bound_has_a_unit_and_says_what_it_bounds() -> None:
    table = rows()
    assert len(table) > 150
    fixed = [row.name for row in table if "." not in row.name]
    assert [name for name in fixed if not UNIT.search(name) and name not in UNIT_OF_ITS_KEYS] == [], \
        "bounds without a unit in their name"
    undocumented = [row.name for row in table if not row.bounds]
    assert undocumented == [], f"bounds without a docstring saying what they bound: {undocumented}"


def test_every_standalone_conf_key_in_the_table_is_one_the_broker_reads() -> None:
    from api.config import KNOWN_KEYS

    keys = [row.key for row in rows() if row.key]
    assert len(keys) >= 30
    assert set(keys) <= set(KNOWN_KEYS)
