"""``docker-compose.cluster.yml``, checked without Docker (none runs here).

- The file follows the Compose specification's JSON schema (the copy vendored by
  ``check-jsonschema``), like ``docker-compose.yml``.
- Its wiring is the cluster's: every Magnetar service runs the one image the broker builds (the
  demo's); the bookies and the broker name the same ZooKeeper service and chroot; each bookie
  advertises its own service name and listening port, keeps its entry logs and its journal on
  separate volumes where the Dockerfile lets its user write; the two brokers start once every
  bookie is healthy, each advertising its own service name and listening on ports of its own,
  published at the same numbers (the URLs the other broker's 307s and lookups name, inside the
  network and on the host alike), the demo's producer and Spark job (the spark image) once both
  brokers are, and they list both by name in their service URL.
- Every Magnetar command parses with ``magnetar``'s own argument parser, so a renamed option
  fails here rather than in a container. (The same commands run natively, as processes, in
  ``tests/crash/test_cluster_kill9.py``, and service by service in
  ``tests/e2e/test_compose_native.py``.)
"""

from __future__ import annotations

from typing import Any

import yaml

from api.cli import build_parser
from tests.e2e.test_demo import CONTAINER_URL, _option, compose_schema_validator, dockerfile_instructions
from tests.standalone import REPO_ROOT

CLUSTER_FILE = REPO_ROOT / "docker-compose.cluster.yml"
DEMO_FILE = REPO_ROOT / "docker-compose.yml"
BOOKIES = ("bookie-1", "bookie-2", "bookie-3")
BROKERS = ("broker-1", "broker-2")


def cluster() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CLUSTER_FILE.read_text())
    return loaded


def test_cluster_compose_follows_the_compose_specification() -> None:
    validator = compose_schema_validator()
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(cluster())]
    assert errors == []


def test_cluster_services_are_wired_together() -> None:
    services = cluster()["services"]
    demo = yaml.safe_load(DEMO_FILE.read_text())["services"]
    assert set(services) == {"zookeeper", *BOOKIES, *BROKERS, "producer", "spark-job"}
    broker = services["broker-1"]
    assert broker["build"] == {"context": ".", "target": "broker"} and broker["image"] == demo["broker"]["image"]
    store = _option(broker["command"], "--metadata-store")
    assert store.startswith("zk:zookeeper:2181/")
    host_ports = set()
    pulsar_ports = set()
    for name in BROKERS:
        service = services[name]
        assert service["image"] == broker["image"]
        assert service["depends_on"] == {b: {"condition": "service_healthy"} for b in BOOKIES}
        assert "/healthz" in " ".join(service["healthcheck"]["test"])
        assert _option(service["command"], "--metadata-store") == store
        assert _option(service["command"], "--advertised-address") == name
        http_port = _option(service["command"], "--port")  # advertised as http://{name}:{port}
        assert f"{http_port}:{http_port}" in service["ports"]
        host_ports.add(http_port)
        pulsar_port = _option(service["command"], "--pulsar-port")  # advertised as pulsar://{name}:{port}
        assert f"{pulsar_port}:{pulsar_port}" in service["ports"]
        pulsar_ports.add(pulsar_port)
    assert host_ports == {"8080", "8081"}
    assert pulsar_ports == {"6650", "6651"}
    writable = _dockerfile_writable_dirs()
    for name in BOOKIES:
        bookie = services[name]
        command = bookie["command"]
        assert bookie["image"] == broker["image"] and "build" not in bookie
        assert bookie["depends_on"] == {"zookeeper": {"condition": "service_healthy"}}
        assert _option(command, "--metadata-store") == store
        assert _option(command, "--advertised-address") == name and _option(command, "--port") == "3181"
        assert "3181" in " ".join(bookie["healthcheck"]["test"])
        mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in bookie["volumes"]}
        data, journal = _option(command, "--data-dir"), _option(command, "--journal-dir")
        assert data in mounts and journal in mounts and mounts[data] != mounts[journal]
        assert {data, journal} <= writable
    both = ",".join(f"http://{b}:{_option(services[b]['command'], '--port')}" for b in BROKERS)
    assert services["spark-job"]["build"] == demo["spark-job"]["build"]
    for name in ("producer", "spark-job"):
        service = services[name]
        assert service["image"] == demo[name]["image"] != broker["image"]
        assert _option(service["command"], "--service-url") == both
        assert [a if a != both else CONTAINER_URL for a in service["command"]] == demo[name]["command"]
        assert service["depends_on"] == {b: {"condition": "service_healthy"} for b in BROKERS}
    assert services["zookeeper"]["image"].startswith("zookeeper:")
    assert "jute.maxbuffer" in services["zookeeper"]["environment"]["JVMFLAGS"]


def test_cluster_commands_parse_with_magnetars_parser() -> None:
    services = cluster()["services"]
    for name in (*BOOKIES, *BROKERS):
        command = services[name]["command"]
        assert command[0] == "magnetar"
        args = build_parser().parse_args(command[1:])
        assert args.command == ("broker" if name in BROKERS else "bookie")
        assert args.metadata_store == "zk:zookeeper:2181/magnetar"


def _dockerfile_writable_dirs() -> set[str]:
    """The directories the image's ``chown`` hands to its user."""
    owned: set[str] = set()
    for name, arguments in dockerfile_instructions():
        if name == "RUN" and "chown" in arguments:
            tail = arguments.split("chown", 1)[1].split()
            owned.update(t for t in tail[1:] if t.startswith("/"))
    return owned
