"""The compose files and the Dockerfile read as Docker reads them, for tests that cannot run Docker.

- ``render(path, env)``: a compose file as ``docker compose config`` sees it: YAML with its merge
  keys, then every string interpolated (``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
  ``$$``) from ``env``; a form Compose has that this does not know fails loudly.
- ``image_stages()``: each Dockerfile stage with what it inherits from the stage it starts ``FROM``:
  its user, the directories it hands that user (``chown``), its ``ENV``, ``CMD``, ``WORKDIR``,
  apt and pip packages.
- ``service_stage(compose, name)``: the stage a service runs: its own ``build.target``, or the
  target of the service that builds the image it names (the Dockerfile's last stage by default).
- ``published(service)``: the ``ports`` short syntax as ``{container port: host port}``.
- ``config_targets(service)``: the configs a service mounts (long syntax) as ``{path: config name}``;
  ``config_content(compose, name)``: a top-level config's inline ``content``.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement

from tests.e2e.test_demo import dockerfile_instructions, shell_commands
from tests.standalone import REPO_ROOT

_REFERENCE = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))")
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>.*))?", re.DOTALL)


def render(path: Path, env: dict[str, str]) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    rendered: dict[str, Any] = _interpolate(loaded, env)
    return rendered


def _interpolate(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _REFERENCE.sub(lambda match: _substitute(match, env), value)
    if isinstance(value, dict):
        return {key: _interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [_interpolate(item, env) for item in value]
    return value


def _substitute(match: re.Match[str], env: dict[str, str]) -> str:
    if match.group("escaped"):
        return "$"
    if match.group("named"):
        return env.get(match.group("named"), "")
    braced = _BRACED.fullmatch(match.group("braced"))
    assert braced is not None, f"an interpolation this reader does not know: {match.group(0)}"
    name, op, default = braced.group("name"), braced.group("op"), braced.group("default")
    if op == ":-":
        return env.get(name) or default
    if op == "-":
        return env.get(name, default)
    return env.get(name, "")


@dataclass(frozen=True)
class Stage:
    name: str
    user: str = "root"
    owned_dirs: frozenset[str] = frozenset()
    env: dict[str, str] = field(default_factory=dict)
    cmd: tuple[str, ...] = ()
    workdir: str = "/"
    apt_packages: frozenset[str] = frozenset()
    pip_packages: frozenset[str] = frozenset()
    useradd_uid: dict[str, int] = field(default_factory=dict)


def image_stages() -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for name, arguments in dockerfile_instructions():
        if name == "FROM":
            words = arguments.split()
            base, stage_name = words[0], words[2]
            current = replace(stages[base], name=stage_name) if base in stages else Stage(stage_name)
            stages[stage_name] = current
            continue
        assert current is not None, "an instruction before the first FROM"
        current = _apply(current, name, arguments)
        stages[current.name] = current
    return stages


def _apply(stage: Stage, name: str, arguments: str) -> Stage:
    if name == "USER":
        return replace(stage, user=arguments.strip())
    if name == "WORKDIR":
        return replace(stage, workdir=arguments.strip())
    if name == "ENV":
        pairs = dict(re.findall(r"(\w+)=(\S+)", arguments))
        return replace(stage, env={**stage.env, **pairs})
    if name == "CMD":
        return replace(stage, cmd=tuple(dockerfile_exec_form_of(arguments)))
    if name == "RUN":
        return _apply_run(stage, arguments)
    return stage


def dockerfile_exec_form_of(arguments: str) -> list[str]:
    array: list[str] = json.loads(arguments[arguments.index("["):])
    return array


def _apply_run(stage: Stage, shell: str) -> Stage:
    owned, apt, pip, uids = set(stage.owned_dirs), set(stage.apt_packages), set(stage.pip_packages), {}
    for tokens in shell_commands(shell):
        if tokens[0] == "chown":
            owned.update(t for t in tokens[2:] if t.startswith("/"))
        elif tokens[:2] == ["apt-get", "install"]:
            apt.update(t for t in tokens[2:] if not t.startswith("-"))
        elif Path(tokens[0]).name == "pip" and tokens[1:2] == ["install"]:
            pip.update(name for target in _pip_targets(tokens[2:]) for name in _installed_by(target))
        elif tokens[0] == "useradd":
            uids[tokens[-1]] = int(tokens[tokens.index("--uid") + 1]) if "--uid" in tokens else 1000
    return replace(stage, owned_dirs=frozenset(owned), apt_packages=frozenset(apt), pip_packages=frozenset(pip),
                   useradd_uid={**stage.useradd_uid, **uids})


def _pip_targets(arguments: list[str]) -> list[str]:
    targets, skip = [], False
    for argument in arguments:
        if skip:
            skip = False
        elif argument in ("-c", "-r", "--find-links"):
            skip = True
        elif not argument.startswith("-"):
            targets.append(argument)
    return targets


def _installed_by(target: str) -> list[str]:
    """The distributions a pip target brings: this project's (its wheel, ``magnetar[extras]``) with
    its dependencies and those of the extras it names, else the target itself."""
    found = re.fullmatch(r"(?:/wheels/)?magnetar(?:-\S*\.whl)?(?:\[(?P<extras>[^\]]*)\])?", target)
    if found is None:
        return [target]
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extras = [e.strip() for e in (found.group("extras") or "").split(",") if e.strip()]
    specs = [*project["dependencies"], *(s for e in extras for s in project["optional-dependencies"][e])]
    return ["magnetar", *(Requirement(spec).name for spec in specs)]


def last_stage() -> str:
    return list(image_stages())[-1]


def service_stage(compose: dict[str, Any], name: str) -> Stage:
    services = compose["services"]
    service = services[name]
    if "build" not in service:
        builders = [s for s in services.values() if "build" in s and s.get("image") == service.get("image")]
        assert builders, f"{name} runs {service.get('image')!r}, which no service builds"
        service = builders[0]
    build = service["build"]
    target = build.get("target", last_stage()) if isinstance(build, dict) else last_stage()
    return image_stages()[target]


def service_command(compose: dict[str, Any], name: str) -> list[str]:
    command = compose["services"][name].get("command") or list(service_stage(compose, name).cmd)
    assert command, f"{name} has no command and its image no CMD"
    return list(command)


def published(service: dict[str, Any]) -> dict[int, int]:
    """``{container port: host port}`` of the short ``ports`` syntax (``H:C``, ``IP:H:C``)."""
    ports: dict[int, int] = {}
    for entry in service.get("ports", []):
        parts = str(entry).split(":")
        assert len(parts) in (2, 3), f"a port without a fixed host port: {entry}"
        ports[int(parts[-1])] = int(parts[-2])
    return ports


def volume_targets(service: dict[str, Any]) -> dict[str, str]:
    """``{mount path: volume name}`` of the short ``volumes`` syntax."""
    return {str(v).split(":")[1]: str(v).split(":")[0] for v in service.get("volumes", [])}


def config_targets(service: dict[str, Any]) -> dict[str, str]:
    """``{mount path: config name}`` of the long ``configs`` syntax (``source``, ``target``)."""
    targets: dict[str, str] = {}
    for entry in service.get("configs", []):
        assert isinstance(entry, dict) and "target" in entry, f"a config without a target path: {entry}"
        targets[str(entry["target"])] = str(entry["source"])
    return targets


def config_content(compose: dict[str, Any], name: str) -> str:
    """The inline ``content`` of the top-level config ``name`` (as interpolated by ``render``)."""
    config = compose.get("configs", {}).get(name)
    assert config is not None and "content" in config, f"the config {name} has no inline content"
    return str(config["content"])
