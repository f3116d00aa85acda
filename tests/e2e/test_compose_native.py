"""The compose files (the demo, the cluster, tiered storage on MinIO), rendered as Compose renders
them, checked against what their processes need, and run as processes on this machine (no
container runtime runs here).

Each file is rendered (``tests/e2e/compose_model.py``: YAML, merge keys, ``${VAR:-default}``
interpolation with an empty environment) and then:

- it follows the Compose specification's JSON schema (the copy vendored by ``check-jsonschema``);
- every Magnetar service's command parses with the parser of the program it runs (``magnetar``'s,
  or the demo module's);
- every directory a command writes (``--data-dir``, ``--journal-dir``, ``--checkpoint-dir``,
  ``--output-dir``) is on a volume, mounted where the image hands its (unprivileged) user the
  directory, so a fresh named volume is that user's too;
- every listener of a broker (``--port``, ``--pulsar-port``, the defaults when absent) is published
  at its own number, and a broker advertises its service name: the URLs it gives out (307s,
  lookups, Pulsar's Connect and Redirect) then reach that broker from the host when the names
  resolve to it, and from the other containers;
- the image a broker or bookie runs has no Java and no Spark; the Spark job's has both;
- every ZooKeeper setting has a comment of its own just above it;
- tiered storage's MinIO is wired to the broker: the bucket ``minio-setup`` makes is the one the
  broker's ``standalone.conf`` (an inline Compose config) names, its endpoint is MinIO's S3 port,
  the broker's AWS credentials and mc's alias are MinIO's root user and password whatever the
  environment sets them to, and the images are pinned to MinIO releases;
- every service runs as a process: ZooKeeper is Debian's (as in the cluster tests), each Magnetar
  service its compose command and environment (and the image's ``ENV``), as the image's user
  (``setpriv`` when the test runs as root) in a working directory it cannot write (as ``/app``),
  with only host names rewritten to 127.0.0.1, container ports to free ports and volume paths
  to directories that belong to that user when the image's mount point does. Each service waits
  for its compose health check (run as written, on its rewritten port); the producer runs a
  short burst; a message is produced over REST through one broker to a topic the other serves
  and read through both, as a client on the host does: each 307 followed to where the host's
  names (``/etc/hosts``: service names) and published ports lead; the official Pulsar client
  sends one more through the first broker's published binary port. The Spark job's command is
  only parsed here: ``tests/e2e/test_demo.py`` runs it.
- tiered storage's services run too, the way ZooKeeper is Debian's here: ``minio/minio`` is
  moto's S3 server (``python -m moto.server``: an S3 API served over HTTP stands in for MinIO; its
  request authentication is off, so it takes MinIO's root user as any key, and the credentials
  are checked on paper above), listening on the port this machine gives ``minio:9000``; its
  health is its port accepting connections (its check runs MinIO's own ``mc``, which is not
  here). ``minio/mc`` runs its command (``mb [--ignore-existing] ALIAS/BUCKET``) with boto3, at
  the endpoint and with the credentials of its ``MC_HOST_<alias>`` variable. The broker reads the
  compose file's config, written to this machine with its host names and ports rewritten as the
  commands' are. Beyond the message check: enough entries to close several ledgers (the official
  client through the broker's published binary port, no batching: an entry per message), an
  offload up to the topic's ``lastMessageId`` by the admin API until its status is SUCCESS,
  an index and a data object in the bucket for each ledger internalStats calls offloaded, and
  the topic read back from offset 0 over REST, every message in order.
"""

from __future__ import annotations

import base64
import importlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
import pulsar
import pytest

from api.cli import build_parser
from api.config import parse_properties
from consumers.cluster_launcher import JUTE_MAXBUFFER_BYTES, running_zookeeper, zookeeper_available
from consumers.launcher import free_port, stop_process
from tests.e2e.compose_model import (
    Stage,
    config_content,
    config_targets,
    published,
    render,
    service_command,
    service_stage,
    volume_targets,
)
from tests.e2e.test_demo import compose_schema_validator
from tests.integration.test_tiered_storage import wait_offload_status
from tests.standalone import REPO_ROOT, read_all

pytestmark = pytest.mark.slow

COMPOSE_FILES = ("docker-compose.yml", "docker-compose.cluster.yml", "docker-compose.tiered.yml")
TIERED_FILE = "docker-compose.tiered.yml"
MINIO_IMAGE = "minio/minio"
MC_IMAGE = "minio/mc"
MINIO_PORT = 9000
MINIO_CONSOLE_PORT = 9001
MC_HOST_PREFIX = "MC_HOST_"
OFFLOAD_TOPIC = "compose-offload"
OFFLOADED_LEDGERS_MIN = 3
OFFLOAD_TIMEOUT_S = 30.0
S3_REGION = "us-east-1"
ZOOKEEPER_SERVICE = "zookeeper"
ZOOKEEPER_PORT = 2181
WRITING_OPTIONS = ("--data-dir", "--journal-dir", "--checkpoint-dir", "--output-dir")
LISTENER_DEFAULTS = {"--port": 8080, "--pulsar-port": 6650}
"""The listeners of ``standalone`` and ``broker`` and their ports when the option is absent."""
BROKER_COMMANDS = ("standalone", "broker")
SERVER_COMMANDS = (*BROKER_COMMANDS, "bookie")
SPARK_MODULE = "demo.spark_job"
PRODUCER_MODULE = "demo.clickstream_producer"
JAVA_PACKAGE = "openjdk-17-jre-headless"
PRODUCER_BURST = ("--count", "20", "--rate", "0")
PRODUCED_CLICKS = 20
MESSAGE = b"through the compose file"
PULSAR_MESSAGE = b"through the published binary port"
LOOKUP_TOPICS_MAX = 32
REDIRECTS_MAX = 5
HEALTHY_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 60.0
POLL_S = 0.2


@pytest.fixture(params=COMPOSE_FILES)
def compose_file(request: pytest.FixtureRequest) -> Path:
    path: Path = REPO_ROOT / request.param
    return path


def rendered(path: Path) -> dict[str, Any]:
    return render(path, {})


def image_services(compose: dict[str, Any]) -> list[str]:
    """The services that run this project's image (every one but ZooKeeper)."""
    built = {s["image"] for s in compose["services"].values() if "build" in s}
    return [name for name, s in compose["services"].items() if s.get("image") in built]


def program(command: list[str]) -> str:
    """``magnetar <command>`` or ``python -m <module>``: what the service runs."""
    if command[0] == "magnetar":
        return command[1]
    assert command[:2] == ["python", "-m"], f"neither magnetar nor python -m: {command}"
    return command[2]


def _option(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def listeners(command: list[str]) -> dict[str, int]:
    if program(command) not in BROKER_COMMANDS:
        port = _option(command, "--port")
        return {} if port is None else {"--port": int(port)}
    return {name: int(_option(command, name) or default) for name, default in LISTENER_DEFAULTS.items()}


# --- on paper ---------------------------------------------------------------------------------------


def test_rendering_interpolates_as_compose_does(tmp_path: Path) -> None:
    sample = tmp_path / "compose.yml"
    sample.write_text('x-base: &base\n  a: "${SET:-d1} ${EMPTY:-d2} ${EMPTY-d3} ${UNSET-d4} $SET $$SET ${UNSET}"\n'
                      "services:\n  s:\n    <<: *base\n    b: [\"${SET}\"]\n")
    services = render(sample, {"SET": "v", "EMPTY": ""})["services"]
    assert services == {"s": {"a": "v d2  d4 v $SET ", "b": ["v"]}}
    sample.write_text("services:\n  s:\n    a: ${SET:?required}\n")
    with pytest.raises(AssertionError, match="does not know"):
        render(sample, {"SET": "v"})


def test_follows_the_compose_specification(compose_file: Path) -> None:
    problems = compose_schema_validator().iter_errors(rendered(compose_file))
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in problems]
    assert errors == []


def test_every_command_parses_with_its_programs_parser(compose_file: Path) -> None:
    compose = rendered(compose_file)
    for name in image_services(compose):
        command = service_command(compose, name)
        if command[0] == "magnetar":
            build_parser().parse_args(command[1:])
        else:
            module = importlib.import_module(program(command))
            module.build_parser().parse_args(command[3:])


def test_writes_land_on_volumes_the_images_user_owns(compose_file: Path) -> None:
    compose = rendered(compose_file)
    for name in image_services(compose):
        service, stage = compose["services"][name], service_stage(compose, name)
        user = service.get("user", stage.user)
        assert user not in ("root", "0") and user in stage.useradd_uid, f"{name} runs as {user}"
        mounts = volume_targets(service)
        command = service_command(compose, name)
        for option in WRITING_OPTIONS:
            path = _option(command, option)
            if path is not None:
                assert any(path == t or path.startswith(t + "/") for t in mounts), f"{name} writes {path} off a volume"
        unowned = set(mounts) - stage.owned_dirs
        assert not unowned, f"{name} mounts {unowned}, which the image does not give {user}"


def test_broker_listeners_are_published_at_their_own_numbers(compose_file: Path) -> None:
    compose = rendered(compose_file)
    host_ports: dict[int, str] = {}
    for name in image_services(compose):
        command = service_command(compose, name)
        if program(command) not in BROKER_COMMANDS:
            continue
        ports = published(compose["services"][name])
        for option, port in listeners(command).items():
            assert ports.get(port) == port, f"{name}'s {option} {port} is published as {ports.get(port)}, " \
                                            f"so the URLs it gives out do not reach it from the host"
            assert port not in host_ports, f"{name} and {host_ports[port]} both publish {port}"
            host_ports[port] = name
        advertised = _option(command, "--advertised-address")
        if program(command) == "broker":
            assert advertised == name, f"{name} advertises {advertised}"


def test_servers_carry_no_spark_and_the_spark_job_does(compose_file: Path) -> None:
    compose = rendered(compose_file)
    for name in image_services(compose):
        command, stage = service_command(compose, name), service_stage(compose, name)
        spark = _spark_in(stage)
        if program(command) in SERVER_COMMANDS:
            assert not spark, f"{name} runs the image {stage.name!r}, which carries {spark}"
        if program(command) == SPARK_MODULE:
            assert JAVA_PACKAGE in spark and any("spark" in p for p in spark), (name, stage.name, spark)


def _spark_in(stage: Stage) -> list[str]:
    return sorted({p for p in stage.apt_packages if "jre" in p or "jdk" in p}
                  | {p for p in stage.pip_packages if "spark" in p})


def test_zookeeper_settings_are_explained() -> None:
    path = REPO_ROOT / "docker-compose.cluster.yml"
    zookeeper = rendered(path)["services"][ZOOKEEPER_SERVICE]
    lines = path.read_text().splitlines()
    explained = {lines[i].split(":")[0].strip() for i in range(1, len(lines)) if lines[i - 1].strip().startswith("#")}
    unexplained = [key for key in zookeeper.get("environment", {}) if key not in explained]
    assert not unexplained, f"ZooKeeper settings without a comment: {unexplained}"
    assert f"-Djute.maxbuffer={JUTE_MAXBUFFER_BYTES}" in zookeeper["environment"]["JVMFLAGS"].split()


def test_tiered_storage_is_wired_to_minio() -> None:
    user, password = "someone", "a-password-of-their-own"
    for env in ({}, {"MINIO_ROOT_USER": user, "MINIO_ROOT_PASSWORD": password}):
        compose = render(REPO_ROOT / TIERED_FILE, env)
        minio_name = _service_of(compose, MINIO_IMAGE)
        minio = compose["services"][minio_name]
        root = (minio["environment"]["MINIO_ROOT_USER"], minio["environment"]["MINIO_ROOT_PASSWORD"])
        assert all(root) and (not env or root == (user, password)), root
        broker_name = _service_of(compose, "magnetar")
        broker = compose["services"][broker_name]
        assert (broker["environment"]["AWS_ACCESS_KEY_ID"], broker["environment"]["AWS_SECRET_ACCESS_KEY"]) == root
        conf = broker_conf(compose, broker_name)
        setup_name = _service_of(compose, MC_IMAGE)
        _, bucket, endpoint, credentials = mc_target(compose["services"][setup_name])
        assert credentials == root and bucket == conf["s3ManagedLedgerOffloadBucket"]
        assert endpoint == conf["s3ManagedLedgerOffloadServiceEndpoint"] == f"http://{minio_name}:{MINIO_PORT}"
        assert conf["managedLedgerOffloadDriver"] == "aws-s3"
        assert int(conf["managedLedgerMinLedgerRolloverTimeMinutes"]) == 0
        assert published(minio) == {MINIO_PORT: MINIO_PORT, MINIO_CONSOLE_PORT: MINIO_CONSOLE_PORT}
        assert f":{MINIO_CONSOLE_PORT}" in minio["command"] and minio["healthcheck"]["test"][0] == "CMD"
        assert compose["services"][setup_name]["depends_on"] == {minio_name: {"condition": "service_healthy"}}
        assert broker["depends_on"] == {setup_name: {"condition": "service_completed_successfully"}}
        for image in (minio["image"], compose["services"][setup_name]["image"]):
            assert re.fullmatch(r"minio/(minio|mc):RELEASE\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ", image), image


def _service_of(compose: dict[str, Any], image: str) -> str:
    """The one service running ``image`` (a repository name: any tag)."""
    names: list[str] = [name for name in compose["services"] if _image(compose, name) == image]
    assert len(names) == 1, f"{len(names)} services run {image}"
    return names[0]


def broker_conf(compose: dict[str, Any], name: str) -> dict[str, str]:
    """The standalone.conf keys of the config a broker's ``--config`` names."""
    command = service_command(compose, name)
    path = _option(command, "--config")
    assert path is not None, f"{name} has no --config"
    return parse_properties(config_content(compose, config_targets(compose["services"][name])[path]))


def mc_target(service: dict[str, Any]) -> tuple[str, str, str, tuple[str, str]]:
    """What an ``mc mb [--ignore-existing] ALIAS/BUCKET`` service makes: the alias, the bucket, the
    endpoint and the (user, password) its ``MC_HOST_<alias>`` variable gives."""
    command = service["command"]
    assert command[0] == "mb" and set(command[1:-1]) <= {"--ignore-existing"}, command
    alias, bucket = command[-1].split("/", 1)
    url = httpx.URL(service["environment"][f"{MC_HOST_PREFIX}{alias}"])
    return alias, bucket, f"{url.scheme}://{url.host}:{url.port}", (url.username, url.password)


# --- as processes -----------------------------------------------------------------------------------


@dataclass
class Machine:
    """This machine standing in for the compose network and the host."""

    compose: dict[str, Any]
    root: Path
    ports: dict[tuple[str, int], int] = field(default_factory=dict)
    """(service, container port) → the free port on 127.0.0.1 it listens on here."""

    def port(self, service: str, container_port: int) -> int:
        return self.ports.setdefault((service, container_port), free_port())

    def host_url(self, service: str, option: str = "--port", scheme: str = "http") -> str:
        """A broker's listener (HTTP, or ``--pulsar-port``'s) as the host reaches it: its published port."""
        port = listeners(service_command(self.compose, service))[option]
        assert port in published(self.compose["services"][service]), f"{service} does not publish {port}"
        return f"{scheme}://127.0.0.1:{self.port(service, port)}"

    def host_view(self, url: str) -> str:
        """``url``, as a broker here gave it out, as a client on the host reaches it: a broker
        there names itself by its service name (checked above) and its container port; the name
        resolves to the host (``/etc/hosts``), where that port number is whatever the compose
        file publishes at it."""
        given = httpx.URL(url)
        service, port = next(key for key, local in self.ports.items() if local == given.port)
        publishers = [(name, container) for name in self.compose["services"]
                      for container, host in published(self.compose["services"][name]).items() if host == port]
        assert publishers, f"{url} ({service}:{port}) is not published on the host"
        return str(given.copy_with(port=self.port(*publishers[0])))

    def localize(self, service: str, command: list[str]) -> list[str]:
        names = set(self.compose["services"])
        localized, previous = [], ""
        for token in command:
            localized.append(self._token(service, token, previous, names))
            previous = token
        if program(command) in BROKER_COMMANDS:
            for option, default in LISTENER_DEFAULTS.items():
                if option not in command:  # its default listener, on a port of its own here
                    localized += [option, str(self.port(service, default))]
        return localized

    def _token(self, service: str, token: str, previous: str, names: set[str]) -> str:
        if token == "magnetar":
            return str(Path(sys.executable).parent / "magnetar")
        if token == "python":
            return sys.executable
        if previous in LISTENER_DEFAULTS:
            return str(self.port(service, int(token)))
        if token in names or token == "0.0.0.0":
            return "127.0.0.1"
        if token in config_targets(self.compose["services"][service]):
            return str(self.config_path(config_targets(self.compose["services"][service])[token]))
        for target, volume in volume_targets(self.compose["services"][service]).items():
            if token == target or token.startswith(target + "/"):
                return str(self.root / "volumes" / volume) + token[len(target):]
        return self.localize_addresses(token)

    def localize_addresses(self, text: str) -> str:
        """Every ``service:port`` in ``text`` as the address it listens on here."""
        names = set(self.compose["services"])
        return re.sub(r"\b([a-z][a-z0-9-]*):(\d+)\b", lambda m: self._address(m, names), text)

    def config_path(self, config: str) -> Path:
        """Where the top-level config ``config`` lies here: its content with addresses localized,
        readable by every user as Compose's mounted configs are."""
        path = self.root / "configs" / config
        if not path.exists():
            path.parent.mkdir(mode=0o755, exist_ok=True)
            path.write_text(self.localize_addresses(config_content(self.compose, config)))
            path.chmod(0o444)
        return path

    def _address(self, match: re.Match[str], names: set[str]) -> str:
        if match.group(1) not in names:
            return match.group(0)
        return f"127.0.0.1:{self.port(match.group(1), int(match.group(2)))}"


def test_every_service_runs_as_a_process(compose_file: Path) -> None:
    if not zookeeper_available():
        pytest.fail("Debian's zookeeper package is needed (apt-get install zookeeper; make test installs it)")
    compose = rendered(compose_file)
    with tempfile.TemporaryDirectory(prefix="compose-") as base, ExitStack() as stack:
        root = Path(base)
        root.chmod(0o755)
        machine = Machine(compose, root)
        if ZOOKEEPER_SERVICE in compose["services"]:
            address = stack.enter_context(running_zookeeper(root / "zookeeper"))
            machine.ports[(ZOOKEEPER_SERVICE, ZOOKEEPER_PORT)] = int(address.rsplit(":", 1)[1])
        order = _start_order(compose)
        for name in order:
            _start(machine, stack, name)
        brokers = [name for name in order if name in image_services(compose)
                   and program(service_command(compose, name)) in BROKER_COMMANDS]
        _check_a_message_goes_through(machine, brokers)
        if any(_image(compose, name) == MINIO_IMAGE for name in order):
            _check_an_offload_goes_to_the_bucket(machine, brokers[0])


def _image(compose: dict[str, Any], name: str) -> str:
    """The repository of the image a service runs (its tag aside)."""
    return str(compose["services"][name].get("image", "")).split(":")[0]


def _start(machine: Machine, stack: ExitStack, name: str) -> None:
    """Start ``name`` (until ``stack`` closes), or run it to its end when it is a one-shot."""
    if _image(machine.compose, name) == MINIO_IMAGE:
        stack.enter_context(_running_s3_server(machine, name))
        return
    if _image(machine.compose, name) == MC_IMAGE:
        _make_bucket(machine, name)
        return
    command = service_command(machine.compose, name)
    if program(command) == SPARK_MODULE:
        return  # parsed above; tests/e2e/test_demo.py runs it
    if program(command) == PRODUCER_MODULE:
        _run_once(machine, name, [*command, *PRODUCER_BURST])
        return
    stack.enter_context(_running(machine, name, command))


def _start_order(compose: dict[str, Any]) -> list[str]:
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        for dependency in compose["services"][name].get("depends_on", {}):
            visit(dependency)
        order.append(name)

    for name in image_services(compose):
        visit(name)
    return [name for name in order if name != ZOOKEEPER_SERVICE]


def _process_setup(machine: Machine, name: str) -> tuple[list[str], dict[str, str], Path]:
    """The prefix that runs a command as the image's user, the environment, the working directory."""
    service, stage = machine.compose["services"][name], service_stage(machine.compose, name)
    uid = stage.useradd_uid[service.get("user", stage.user)]
    home = machine.root / "home"
    workdir = machine.root / "app"  # as the image's WORKDIR: the user reads it, never writes it
    for directory in (home, workdir, *(machine.root / "volumes" / v for v in volume_targets(service).values())):
        directory.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o555)
    for target, volume in volume_targets(service).items():
        # a fresh named volume takes the owner of the image's directory it is mounted on
        _hand_over(machine.root / "volumes" / volume, uid if target in stage.owned_dirs else None)
    _hand_over(home, uid)
    environment = service.get("environment", {})
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "HOME": str(home),
           "PYTHONPATH": str(REPO_ROOT), **stage.env, **{k: str(v) for k, v in environment.items()}}
    prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if os.geteuid() == 0 else []
    return prefix, env, workdir


def _hand_over(directory: Path, uid: int | None) -> None:
    if os.geteuid() == 0:
        os.chown(directory, uid if uid is not None else 0, uid if uid is not None else 0)
    elif uid is None:
        directory.chmod(0o555)


@contextmanager
def _running(machine: Machine, name: str, command: list[str]) -> Iterator[None]:
    prefix, env, workdir = _process_setup(machine, name)
    log_path = machine.root / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([*prefix, *machine.localize(name, command)], cwd=workdir, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(machine, name, proc, log_path)
        yield
    finally:
        code = stop_process(proc)
    assert code == 0, f"{name} exited {code} when stopped:\n{log_path.read_text()[-3000:]}"


def _wait_healthy(machine: Machine, name: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    """Until the service's compose health check passes, run as written against its port here."""
    check = machine.compose["services"][name]["healthcheck"]["test"]
    assert check[0] == "CMD", check
    command = service_command(machine.compose, name)
    ports = set(listeners(command).values())
    localized = []
    for token in check[1:]:
        text = sys.executable if token == "python" else token
        for port in ports:
            text = re.sub(rf"(?<!\d){port}(?!\d)", str(machine.port(name, port)), text)
        localized.append(text)
    deadline_s = time.monotonic() + HEALTHY_TIMEOUT_S
    while time.monotonic() < deadline_s:
        assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
        if subprocess.run(localized, capture_output=True, timeout=HEALTHY_TIMEOUT_S, check=False).returncode == 0:
            return
        time.sleep(POLL_S)
    raise AssertionError(f"{name}'s health check {localized} did not pass:\n{log_path.read_text()[-3000:]}")


def _run_once(machine: Machine, name: str, command: list[str]) -> None:
    prefix, env, workdir = _process_setup(machine, name)
    done = subprocess.run([*prefix, *machine.localize(name, command)], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


@contextmanager
def _running_s3_server(machine: Machine, name: str) -> Iterator[None]:
    """moto's S3 server in MinIO's place, on the port this machine gives ``name``'s S3 port;
    healthy once that port accepts connections (MinIO's own check runs its ``mc``, not here)."""
    port = machine.port(name, MINIO_PORT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    log_path = machine.root / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                cwd=machine.root, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline_s = time.monotonic() + HEALTHY_TIMEOUT_S
        while not _accepts(port):
            assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline_s, f"{name} did not listen on {port}:\n{log_path.read_text()[-3000:]}"
            time.sleep(POLL_S)
        yield
    finally:
        stop_process(proc)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _make_bucket(machine: Machine, name: str) -> None:
    """``mc mb ALIAS/BUCKET`` as boto3 does it: at the alias's endpoint, with its credentials."""
    _, bucket, endpoint, (user, password) = mc_target(machine.compose["services"][name])
    _s3_client(machine.localize_addresses(endpoint), user, password).create_bucket(Bucket=bucket)


def _s3_client(endpoint: str, access_key_id: str, secret_access_key: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name=S3_REGION, aws_access_key_id=access_key_id,
                        aws_secret_access_key=secret_access_key)


def _check_an_offload_goes_to_the_bucket(machine: Machine, broker: str) -> None:
    """Enough entries to close several ledgers, offloaded by the admin API up to the last one;
    each offloaded ledger's index and data objects in the bucket; every message read back in order."""
    conf = broker_conf(machine.compose, broker)
    topic = f"/topics/persistent/public/default/{OFFLOAD_TOPIC}"
    admin = f"/admin/v2/persistent/public/default/{OFFLOAD_TOPIC}"
    with httpx.Client(base_url=machine.host_url(broker), timeout=OFFLOAD_TIMEOUT_S) as http:
        payloads = _fill_ledgers(machine, broker, http, int(conf["managedLedgerMaxEntriesPerLedger"]))
        last = http.get(f"{admin}/lastMessageId").json()
        offload = http.put(f"{admin}/offload", json={"ledgerId": last["ledgerId"], "entryId": last["entryId"]})
        assert offload.status_code == 204, offload.text
        status = wait_offload_status(http, admin)
        assert status["status"] == "SUCCESS", status
        ledgers = http.get(f"{admin}/internalStats").json()["ledgers"]
        offloaded = sorted(ledger["ledgerId"] for ledger in ledgers if ledger["offloaded"])
        assert len(offloaded) >= OFFLOADED_LEDGERS_MIN, ledgers
        read = read_all(machine.host_url(broker), topic)
        assert [(m["offset"], m["payload"].decode()) for m in read] == list(enumerate(payloads))
    env = machine.compose["services"][broker]["environment"]
    s3 = _s3_client(machine.localize_addresses(conf["s3ManagedLedgerOffloadServiceEndpoint"]),
                    env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=conf["s3ManagedLedgerOffloadBucket"]).get("Contents", [])]
    assert sorted(int(k.split("-")[0]) for k in keys if k.endswith("-index")) == offloaded, keys
    assert sorted(int(k.split("-")[0]) for k in keys if not k.endswith("-index")) == offloaded, keys


def _fill_ledgers(machine: Machine, broker: str, http: httpx.Client, per_ledger: int) -> list[str]:
    """A ledger's worth of entries at a time until the topic has closed OFFLOADED_LEDGERS_MIN
    ledgers (a ledger rolls over once it holds ``per_ledger``); the payloads sent, in order."""
    payloads: list[str] = []
    for _ in range(2 * OFFLOADED_LEDGERS_MIN + 2):
        batch = [f"offloaded-{len(payloads) + index}" for index in range(per_ledger)]
        _send_one_entry_each(machine, broker, OFFLOAD_TOPIC, batch)
        payloads += batch
        ledgers = http.get(f"/admin/v2/persistent/public/default/{OFFLOAD_TOPIC}/internalStats").json()["ledgers"]
        if len(ledgers) > OFFLOADED_LEDGERS_MIN:
            return payloads
    raise AssertionError(f"{len(payloads)} entries closed {len(ledgers) - 1} ledgers rolling at {per_ledger} entries")


def _send_one_entry_each(machine: Machine, broker: str, topic: str, payloads: list[str]) -> None:
    """The official Pulsar client sends each payload as an entry of its own (no batching)."""
    results: list[pulsar.Result] = []
    client = pulsar.Client(machine.host_url(broker, "--pulsar-port", "pulsar"), operation_timeout_seconds=30)
    try:
        producer = client.create_producer(f"persistent://public/default/{topic}", batching_enabled=False,
                                          block_if_queue_full=True)
        for payload in payloads:
            producer.send_async(payload.encode(), lambda result, _: results.append(result))
        producer.flush()
        deadline_s = time.monotonic() + OFFLOAD_TIMEOUT_S
        while len(results) < len(payloads) and time.monotonic() < deadline_s:  # the last callbacks
            time.sleep(POLL_S)
    finally:
        client.close()
    assert results == [pulsar.Result.Ok] * len(payloads), (len(results), {str(r) for r in results})


def _check_a_message_goes_through(machine: Machine, brokers: list[str]) -> None:
    """Produced over REST to the first broker, read through the first and the last (the same one
    when alone), following redirects as a client on the host does; with two brokers, to a topic
    the last one serves, so the first answers with its redirect. The producer's clicks too."""
    first, last = machine.host_url(brokers[0]), machine.host_url(brokers[-1])
    with httpx.Client(timeout=30) as http:
        topic = f"/topics/persistent/public/default/{_topic_served_by(machine, http, first, brokers[-1])}"
        sent = _from_host(machine, http, "POST", f"{first}{topic}",
                          json={"messages": [{"payload": MESSAGE.decode()}]})
        assert sent.status_code == 200, sent.text
        for url in (first, last):
            read = _from_host(machine, http, "GET", f"{url}{topic}/messages", params={"offset": 0, "maxMessages": 10})
            assert read.status_code == 200, read.text
            assert [m["payload"] for m in read.json()["messages"]] == [base64.b64encode(MESSAGE).decode()]
        clicks = _from_host(machine, http, "GET", f"{last}/topics/persistent/public/default/clickstream/messages",
                            params={"offset": 0, "maxMessages": 100})
        assert clicks.status_code == 200, clicks.text
        assert len(clicks.json()["messages"]) == PRODUCED_CLICKS + 1  # and the end marker
        _send_with_pulsars_client(machine, http, brokers[0], topic.rsplit("/", 1)[1])


def _send_with_pulsars_client(machine: Machine, http: httpx.Client, broker: str, topic: str) -> None:
    """The official Pulsar client on the host sends through the broker's published binary port."""
    client = pulsar.Client(machine.host_url(broker, "--pulsar-port", "pulsar"), operation_timeout_seconds=30)
    try:
        client.create_producer(f"persistent://public/default/{topic}").send(PULSAR_MESSAGE)
    finally:
        client.close()
    read = _from_host(machine, http, "GET", f"{machine.host_url(broker)}/topics/persistent/public/default/{topic}"
                      "/messages", params={"offset": 0, "maxMessages": 10})
    assert [base64.b64decode(m["payload"]) for m in read.json()["messages"]] == [MESSAGE, PULSAR_MESSAGE]


def _topic_served_by(machine: Machine, http: httpx.Client, url: str, broker: str) -> str:
    """A topic the lookups (through ``url``) give to ``broker``."""
    for index in range(LOOKUP_TOPICS_MAX):
        name = f"compose-check-{index}"
        found = http.get(f"{url}/lookup/v2/topic/persistent/public/default/{name}")
        assert found.status_code == 200, found.text
        served_by = next(key[0] for key, local in machine.ports.items()
                         if local == httpx.URL(found.json()["httpUrl"]).port)
        if served_by == broker:
            return name
    raise AssertionError(f"none of {LOOKUP_TOPICS_MAX} topics went to {broker}")


def _from_host(machine: Machine, http: httpx.Client, method: str, url: str, **kwargs: Any) -> httpx.Response:
    """A request from the host, following 307s to where the host's names and ports lead."""
    for _ in range(REDIRECTS_MAX):
        response = http.request(method, url, **kwargs)
        if response.status_code != 307:
            return response
        url = machine.host_view(response.headers["location"])
    raise AssertionError(f"{method} went round {REDIRECTS_MAX} redirects, the last to {url}")
