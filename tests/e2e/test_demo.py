"""The clickstream demo and its packaging, end to end.

Docker cannot run here, so the packaging is checked in three other ways:

- ``docker-compose.yml`` is validated against the Compose specification's JSON schema (the copy
  vendored by the ``check-jsonschema`` package, so no network is needed), and its wiring is
  checked: health-gated start, volumes where the commands write;
- each compose service's command runs natively as a smoke test: the broker's (the Dockerfile's
  ``CMD``) on free ports and a temporary data directory instead of ``/data``, 8080 and 6650, the
  compose health checks against it, the producer's for a small seeded count, and the Spark job's
  with ``--available-now``; the window counts in the Parquet output and in the results topic must
  be exactly those Spark's watermark rules give for the clicks found in the topic;
- the Dockerfile builds in stages: a builder with a C compiler makes a wheel of the project
  with the compiled range-read columns (its build step runs here as written, on a copy of what
  it copies, and the wheel must hold the extension); a base stage installs that wheel pinned by
  the Makefile's ``constraints.txt``, no extra; the ``broker`` target (the default) adds nothing
  to it, the ``spark`` target the JRE, the ``spark`` extra and the demo; and every third-party
  module the shipped packages import is a runtime dependency (the ``spark`` extra's only in the
  Spark connector and the demo), so the images without the dev extras have what the code needs.
  ``tests/e2e/test_compose_native.py`` checks and runs both compose files service by service.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.resources
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from demo.clickstream_producer import KIND_LATE, KIND_STRAGGLER, StreamShape, generate_clicks
from tests.standalone import REPO_ROOT, free_port, read_all, stop, wait_healthy

pytestmark = pytest.mark.slow

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
MAKEFILE = REPO_ROOT / "Makefile"
SCHEMA_PACKAGE, SCHEMA_FILE = "check_jsonschema.builtin_schemas.vendor", "compose-spec.json"
CONTAINER_URL = "http://broker:8080"
CONTAINER_PORT = "8080"
CONTAINER_PULSAR_PORT = "6650"

# The smoke run: 400 clicks, 100 ms of event time apart (40 s), a straggler 30 s late every 25th
# click from 30 s on, Spark reading 100 messages per micro-batch with its default 10 s windows and
# 5 s watermark delay. Ordinary late clicks (at most 3 s) are never dropped; every straggler
# arrives two micro-batches after its window closed.
CLICKS = 400
START_MS = 1_700_000_000_000
EVENT_INTERVAL_MS = 100
STRAGGLER_EVERY = 25
STRAGGLER_LATENESS_MS = 30_000
ROWS_PER_TRIGGER = 100
WINDOW_MS = 10_000
WATERMARK_DELAY_MS = 5_000
PRODUCER_TIMEOUT_S = 120
SPARK_TIMEOUT_S = 300
HEALTHCHECK_TIMEOUT_S = 30


# --- reading the packaging files ------------------------------------------------------------------


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return loaded


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}".strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        logical.append(pending)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in logical]


def dockerfile_exec_form(instruction: str) -> list[str]:
    """The JSON-array arguments of the last ``instruction`` (``CMD`` or ``HEALTHCHECK ... CMD``)."""
    found = [args for name, args in dockerfile_instructions() if name == instruction]
    assert found, f"the Dockerfile has no {instruction}"
    array: list[str] = json.loads(found[-1][found[-1].index("["):])
    return array


def shell_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at ``&&``, ``||``, ``;``, ``|``; quotes respected)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


def pip_installs(line: str, verb: str = "install") -> list[list[str]]:
    """The argument lists of every ``pip install`` (or ``pip <verb>``) in a shell line."""
    return [tokens[2:] for tokens in shell_commands(line)
            if Path(tokens[0]).name == "pip" and tokens[1:2] == [verb]]


def dockerfile_stages() -> dict[str, list[tuple[str, str]]]:
    """Each stage's instructions (its ``FROM`` first) by the name ``FROM … AS name`` gives it."""
    stages: dict[str, list[tuple[str, str]]] = {}
    for name, arguments in dockerfile_instructions():
        if name == "FROM":
            words = arguments.split()
            assert len(words) == 3 and words[1].upper() == "AS", f"an unnamed stage: FROM {arguments}"
            stages[words[2]] = []
        stages[list(stages)[-1]].append((name, arguments))
    return stages


def runs(stage: list[tuple[str, str]]) -> list[str]:
    return [shell for name, shell in stage if name == "RUN"]


def apt_packages(stage: list[tuple[str, str]]) -> list[str]:
    return [t for shell in runs(stage) for tokens in shell_commands(shell) if tokens[:2] == ["apt-get", "install"]
            for t in tokens[2:] if not t.startswith("-")]


def copies(stage: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(source, destination) of each plain ``COPY`` (``--from`` ones left out)."""
    pairs = []
    for name, arguments in stage:
        words = arguments.split()
        if name == "COPY" and not words[0].startswith("--from="):
            pairs += [(source, words[-1]) for source in words[:-1]]
    return pairs


def project_install(arguments: list[str]) -> tuple[str, frozenset[str]] | None:
    """(constraints file, extras) of a ``pip install`` of this project (``.``, ``-e '.[dev]'``)."""
    targets = [a for a in arguments if a == "." or a.startswith(".[")]
    if not targets:
        return None
    constraints = arguments[arguments.index("-c") + 1] if "-c" in arguments else ""
    extras = re.fullmatch(r"\.(?:\[([^\]]*)\])?", targets[0])
    assert extras is not None, f"cannot read the project spec {targets[0]!r}"
    names = frozenset(e.strip() for e in (extras.group(1) or "").split(",") if e.strip())
    return constraints, names


def makefile_recipe(target: str) -> list[str]:
    lines = MAKEFILE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


# --- (a) the compose file -------------------------------------------------------------------------


def compose_schema_validator() -> jsonschema.protocols.Validator:
    schema = json.loads((importlib.resources.files(SCHEMA_PACKAGE) / SCHEMA_FILE).read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator: jsonschema.protocols.Validator = validator_class(schema)
    return validator


def test_compose_file_follows_the_compose_specification() -> None:
    validator = compose_schema_validator()
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []

    misspelled = compose()
    misspelled["services"]["broker"]["helthcheck"] = misspelled["services"]["broker"].pop("healthcheck")
    wrong_type = compose()
    wrong_type["services"]["producer"]["depends_on"] = {"broker": {"condition": "when_ready"}}
    assert not validator.is_valid(misspelled)
    assert not validator.is_valid(wrong_type)


def test_compose_services_are_wired_to_the_broker_and_their_volumes() -> None:
    services = compose()["services"]
    assert set(services) == {"broker", "producer", "spark-job"}
    broker = services["broker"]
    assert {"8080:8080", "6650:6650"} <= set(broker["ports"])
    assert "/healthz" in " ".join(broker["healthcheck"]["test"])
    broker_command = broker.get("command") or dockerfile_exec_form("CMD")
    assert _mount_targets(broker) >= {_option(broker_command, "--data-dir")}
    assert broker["build"] == {"context": ".", "target": "broker"} and broker["image"]
    spark_job = services["spark-job"]
    assert spark_job["build"] == {"context": ".", "target": "spark"} and spark_job["image"] != broker["image"]
    for name in ("producer", "spark-job"):
        service = services[name]
        assert service["image"] == spark_job["image"]
        assert service["depends_on"] == {"broker": {"condition": "service_healthy"}}
        assert _option(service["command"], "--service-url") == CONTAINER_URL
        assert "--available-now" not in service["command"]
    assert "build" not in services["producer"]
    written = {_option(spark_job["command"], "--checkpoint-dir"), _option(spark_job["command"], "--output-dir")}
    for path in written:
        assert any(path == target or path.startswith(target + "/") for target in _mount_targets(spark_job)), path


def _mount_targets(service: dict[str, Any]) -> set[str]:
    return {volume.split(":")[1] for volume in service.get("volumes", [])}


def _option(command: list[str], name: str) -> str:
    assert name in command, f"{name} missing from {command}"
    return command[command.index(name) + 1]


# --- (b) the compose commands, run natively ---------------------------------------------------------


def localize(command: list[str], replacements: dict[str, str]) -> list[str]:
    """A container command with its executables, paths, URL and port replaced (whole tokens, or
    path prefixes) by this machine's."""
    return [_localize_token(token, replacements) for token in command]


def _localize_token(token: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        if token == old:
            return new
        if old.startswith("/") and token.startswith(old + "/"):
            return new + token[len(old):]
    return token


def run_command(command: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-3000:]}"
    return result


def read_topic(url: str, topic: str) -> list[dict[str, Any]]:
    """Every message of a ``public/default`` topic, payloads decoded, in offset order."""
    return read_all(url, f"/topics/persistent/public/default/{topic}")


def expected_window_counts(events: list[tuple[str, int]], *,
                           late_uses_previous_watermark: bool) -> Counter[tuple[int, str]]:
    """What Spark's append-mode windowed count emits for ``events`` (page, event time ms) read
    ``ROWS_PER_TRIGGER`` per micro-batch, in order.

    The watermark of micro-batch k is the latest event time of batches before k minus the delay
    (never moving back). A click is dropped as late when its window ends at or before the
    watermark used for late events: Spark uses the previous batch's for that (the current one
    evicts state); ``late_uses_previous_watermark=False`` models the stricter reading. A window
    is emitted once the final watermark reaches its end."""
    counts: Counter[tuple[int, str]] = Counter()
    watermarks: list[int | None] = [None]
    latest_ms: int | None = None
    for first in range(0, len(events), ROWS_PER_TRIGGER):
        batch = events[first:first + ROWS_PER_TRIGGER]
        current = watermarks[-1]
        previous = watermarks[-2] if len(watermarks) > 1 else None
        late_watermark = previous if late_uses_previous_watermark else current
        for page, event_ms in batch:
            start_ms = event_ms - event_ms % WINDOW_MS
            if late_watermark is None or start_ms + WINDOW_MS > late_watermark:
                counts[(start_ms, page)] += 1
        batch_latest_ms = max(event_ms for _, event_ms in batch)
        latest_ms = batch_latest_ms if latest_ms is None else max(latest_ms, batch_latest_ms)
        candidate = latest_ms - WATERMARK_DELAY_MS
        watermarks.append(candidate if current is None else max(current, candidate))
    final = watermarks[-1]
    assert final is not None
    return Counter({key: n for key, n in counts.items() if key[0] + WINDOW_MS <= final})


def parquet_window_counts(output_dir: Path) -> list[tuple[int, str, int]]:
    table = pq.read_table(output_dir)
    starts = table.column("windowStart").cast(pa.timestamp("ms")).cast(pa.int64()).to_pylist()
    ends = table.column("windowEnd").cast(pa.timestamp("ms")).cast(pa.int64()).to_pylist()
    assert all(end - start == WINDOW_MS for start, end in zip(starts, ends, strict=True))
    return list(zip(starts, table.column("page").to_pylist(), table.column("clicks").to_pylist(), strict=True))


def test_compose_commands_run_natively_end_to_end(tmp_path: Path) -> None:
    services = compose()["services"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    bin_dir = Path(sys.executable).parent
    replacements = {
        "python": sys.executable, "magnetar": str(bin_dir / "magnetar"), CONTAINER_URL: url,
        "0.0.0.0": "127.0.0.1", CONTAINER_PORT: str(port), CONTAINER_PULSAR_PORT: str(free_port()),
        "/data": str(tmp_path / "data"),
        "/checkpoints": str(tmp_path / "checkpoints"), "/output": str(tmp_path / "output"),
    }
    broker_command = localize(services["broker"].get("command") or dockerfile_exec_form("CMD"), replacements)
    with (tmp_path / "broker.log").open("wb") as log:
        broker = subprocess.Popen(broker_command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(f"{url}/healthz", broker)
            check_healthchecks(services["broker"], port)
            summary = run_producer(services["producer"]["command"], replacements)
            spark_job = [*localize(services["spark-job"]["command"], replacements),
                         "--available-now", "--max-offsets-per-trigger", str(ROWS_PER_TRIGGER),
                         "--timeout-s", str(SPARK_TIMEOUT_S - 60)]
            printed = run_command(spark_job, SPARK_TIMEOUT_S).stdout
            check_results(url, summary, tmp_path / "output" / "page-counts", printed)
        finally:
            assert stop(broker) == 0


def check_healthchecks(broker_service: dict[str, Any], port: int) -> None:
    """The compose and Dockerfile health checks pass against the running broker, fail without one."""
    for test in (broker_service["healthcheck"]["test"], ["CMD", *dockerfile_exec_form("HEALTHCHECK")]):
        assert test[0] == "CMD"
        for target_port, expect_ok in ((port, True), (free_port(), False)):
            command = [sys.executable if t == "python" else t.replace(":8080/", f":{target_port}/") for t in test[1:]]
            result = subprocess.run(command, capture_output=True, timeout=HEALTHCHECK_TIMEOUT_S, check=False)
            assert (result.returncode == 0) == expect_ok, (command, result.stderr[-500:])


def run_producer(command: list[str], replacements: dict[str, str]) -> dict[str, Any]:
    producer = [*localize(command, replacements),
                "--count", str(CLICKS), "--rate", "0", "--event-interval-ms", str(EVENT_INTERVAL_MS),
                "--start-ms", str(START_MS), "--straggler-every", str(STRAGGLER_EVERY),
                "--straggler-lateness-ms", str(STRAGGLER_LATENESS_MS)]
    lines = run_command(producer, PRODUCER_TIMEOUT_S).stdout.splitlines()
    summary: dict[str, Any] = json.loads(lines[-1].removeprefix("summary: "))
    assert summary["clicks"] == CLICKS and summary["endMarker"] is True
    return summary


def check_results(url: str, summary: dict[str, Any], output_dir: Path, printed: str) -> None:
    clicks = read_topic(url, "clickstream")
    assert len(clicks) == CLICKS + 1  # and the end marker
    events = []
    for message in clicks:
        click = json.loads(message["payload"])
        assert message["eventTimeMs"] == click["eventTimeMs"] and message["key"] == click["userId"]
        events.append((click["page"], click["eventTimeMs"]))

    expected = expected_window_counts(events, late_uses_previous_watermark=True)
    assert expected == expected_window_counts(events, late_uses_previous_watermark=False), \
        "the smoke run's shape must not depend on which watermark Spark uses for late data"
    assert expected.total() == CLICKS - summary["stragglers"] and summary["stragglers"] > 0
    assert summary["late"] > 0

    parquet = parquet_window_counts(output_dir)
    assert len(parquet) == len({(start, page) for start, page, _ in parquet}), "a window was written twice"
    assert Counter({(start, page): n for start, page, n in parquet}) == expected

    results = read_topic(url, "clickstream-page-counts")
    from_topic: Counter[tuple[int, str]] = Counter()
    for message in results:
        result = json.loads(message["payload"])
        assert message["key"] == result["page"] and message["eventTimeMs"] == result["windowEndMs"]
        assert result["windowEndMs"] - result["windowStartMs"] == WINDOW_MS
        from_topic[(result["windowStartMs"], result["page"])] += result["clicks"]
    assert len(results) == len(parquet)
    assert from_topic == expected
    assert f"{len({start for start, _ in expected})} closed 10 s windows, {expected.total()} clicks" in printed


# --- (c) the images: a builder compiles the C columns, neither image ships dev tools ----------------


def test_the_images_build_in_stages_and_ship_no_dev_tools() -> None:
    stages = dockerfile_stages()
    assert list(stages) == ["builder", "base", "spark", "broker"]  # the last, broker, is the default target
    builder, base, spark, broker = stages["builder"], stages["base"], stages["spark"], stages["broker"]
    assert builder[0][1].startswith("python:3.11-slim") and base[0][1].startswith("python:3.11-slim")
    assert spark[0][1] == "base AS spark" and broker[0][1] == "base AS broker"
    assert "gcc" in apt_packages(builder)
    assert {"pyproject.toml", "setup.py", "broker"} <= {source for source, _ in copies(builder)}
    assert [args for shell in runs(builder) for args in pip_installs(shell, "wheel")] == [
        ["--no-deps", "--wheel-dir", "/wheels", "."]]

    make_installs = [project_install(args) for line in makefile_recipe("$(STAMP)") for args in pip_installs(
        line.replace("$(BIN)/", ""))]
    assert [found for found in make_installs if found is not None] == [("constraints.txt", frozenset({"dev", "spark"}))]
    assert [args for shell in runs(base) for args in pip_installs(shell)] == [
        ["--upgrade", "pip"], ["-c", "constraints.txt", "/wheels/magnetar-*.whl"]]  # the wheel, no extras
    assert ("COPY", "--from=builder /wheels /wheels") in base
    assert sorted(source for source, _ in copies(base)) == ["constraints.txt"]
    assert apt_packages(base) == [] and apt_packages(broker) == [] and runs(broker) == []  # no compiler, no Java
    assert apt_packages(spark) == ["openjdk-17-jre-headless"]
    assert [args for shell in runs(spark) for args in pip_installs(shell)] == [
        ["-c", "constraints.txt", "magnetar[spark]"]]  # the installed wheel's spark extra
    assert sorted(source for source, _ in copies(spark)) == ["demo"]
    image_text = " ".join(arguments for stage in (base, spark, broker) for _, arguments in stage)
    for package in _dev_extras():
        assert not re.search(rf"\b{re.escape(package)}\b", image_text), f"an image installs {package}"
    assert dockerfile_exec_form("CMD") == ["magnetar", "standalone", "--data-dir", "/data", "--host", "0.0.0.0",
                                           "--port", CONTAINER_PORT, "--pulsar-port", CONTAINER_PULSAR_PORT]
    assert [name for name, _ in broker].count("CMD") == 1 and "CMD" not in [name for name, _ in spark]
    assert "/healthz" in " ".join(dockerfile_exec_form("HEALTHCHECK"))
    assert "**/*.so" in (REPO_ROOT / ".dockerignore").read_text().split()  # built in the image, never copied


def test_the_builder_stage_compiles_the_range_columns_into_the_wheel(tmp_path: Path) -> None:
    """The builder's build step, run as written on a copy of exactly what the builder copies."""
    assert shutil.which("gcc") is not None, "the builder's build step needs gcc: install it ('apt-get install gcc')"
    builder = dockerfile_stages()["builder"]
    source, wheels = tmp_path / "src", tmp_path / "wheels"
    source.mkdir()
    for item, destination in copies(builder):
        target = source / destination.removeprefix("./") if destination not in ("./", ".") else source / item
        if (REPO_ROOT / item).is_dir():
            shutil.copytree(REPO_ROOT / item, target, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        else:
            shutil.copy2(REPO_ROOT / item, target)
    [build] = [shell for shell in runs(builder) if pip_installs(shell, "wheel")]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", build.replace("/wheels", str(wheels))], cwd=source, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    [wheel] = wheels.glob("magnetar-*.whl")
    names = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(wheel)], capture_output=True, text=True,
                           check=True).stdout
    assert re.search(r"broker/entry_format/_range_columns\.cpython-\S+\.so", names)
    assert "api/console/static/index.html" in names and "consumers/spark/source.py" in names
    assert "tests/" not in names and "demo/" not in names


def _dev_extras() -> list[str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(spec).name for spec in project["optional-dependencies"]["dev"]]


def _requirement_closure(specs: list[str]) -> set[str]:
    """The distributions ``specs`` name and everything they require, with the extras they ask
    for (as installed here), by normalized name."""
    seen: set[str] = set()
    pending = [Requirement(spec) for spec in specs]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in seen and not requirement.extras:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in requires:
            wanted = Requirement(text)
            if wanted.marker is None or any(wanted.marker.evaluate({"extra": e}) for e in requirement.extras or {""}):
                pending.append(wanted)
    return seen


def _imported_modules(path: Path) -> set[str]:
    """Top-level modules ``path`` imports, except imports guarded by ``except ImportError``."""
    tree = ast.parse(path.read_text())
    guarded = {id(node) for handler in ast.walk(tree) if isinstance(handler, ast.Try)
               and any(isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                       for h in handler.handlers)
               for node in ast.walk(handler)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_shipped_packages_import_only_runtime_dependencies() -> None:
    """The servers' image has the core dependencies; only the Spark connector and the demo (the
    spark image) may import what the ``spark`` extra adds."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    core = _requirement_closure(project["dependencies"])
    with_spark = core | _requirement_closure(project["optional-dependencies"]["spark"])
    ours = {"storage", "broker", "api", "consumers", "demo"}
    distributions = importlib.metadata.packages_distributions()
    missing = {}
    for package in sorted(ours):
        for path in (REPO_ROOT / package).rglob("*.py"):
            relative = path.relative_to(REPO_ROOT)
            runtime = with_spark if relative.parts[:2] == ("consumers", "spark") or package == "demo" else core
            for module in _imported_modules(path) - ours - set(sys.stdlib_module_names):
                owners = {canonicalize_name(d) for d in distributions.get(module, [module])}
                if not owners & runtime:
                    missing[f"{relative}: {module}"] = sorted(owners)
    assert not missing, f"imports that only the dev extras (or nothing) install: {missing}"
    assert "pyspark" not in core and "pyspark" in with_spark


# --- the generator the smoke run relies on ---------------------------------------------------------


def test_clickstream_generator_is_seeded_and_bounded_in_lateness() -> None:
    shape = StreamShape(start_ms=START_MS, event_interval_ms=EVENT_INTERVAL_MS, straggler_every=STRAGGLER_EVERY,
                        straggler_lateness_ms=STRAGGLER_LATENESS_MS)
    first = [c for _, c in zip(range(CLICKS), generate_clicks(shape), strict=False)]
    again = [c for _, c in zip(range(CLICKS), generate_clicks(shape), strict=False)]
    other_seed = [c for _, c in zip(range(CLICKS), generate_clicks(
        StreamShape(**{**shape.__dict__, "seed": shape.seed + 1})), strict=False)]
    assert first == again and first != other_seed
    for index, click in enumerate(first):
        clock_ms = START_MS + index * EVENT_INTERVAL_MS
        if click.kind == KIND_STRAGGLER:
            assert index % STRAGGLER_EVERY == STRAGGLER_EVERY - 1 and clock_ms - START_MS >= STRAGGLER_LATENESS_MS
            assert click.event_time_ms == clock_ms - STRAGGLER_LATENESS_MS
        elif click.kind == KIND_LATE:
            assert clock_ms - shape.max_lateness_ms <= click.event_time_ms < clock_ms
        else:
            assert click.event_time_ms == clock_ms
    assert [i for i, click in enumerate(first) if click.kind == KIND_STRAGGLER] == [324, 349, 374, 399]
    assert sum(click.kind == KIND_LATE for click in first) > 0


def test_spark_job_names_the_java_package_when_java_is_missing_or_old(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "demo.spark_job", "--available-now"]
    empty = tmp_path / "empty"
    empty.mkdir()
    old = tmp_path / "old"
    old.mkdir()
    (old / "java").write_text('#!/bin/sh\necho \'java version "1.8.0_402"\' >&2\n')
    (old / "java").chmod(0o755)
    for path, found in ((empty, "Spark needs Java 17+: install"), (old, "Spark needs Java 17+, found 8")):
        result = subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, "PATH": str(path)}, capture_output=True,
                                text=True, timeout=PRODUCER_TIMEOUT_S, check=False)
        assert result.returncode == 2 and found in result.stderr and "openjdk-17-jre-headless" in result.stderr
