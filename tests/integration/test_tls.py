"""TLS on every port, plain ports off, mutual TLS: a real ``magnetar standalone`` configured only
by Pulsar's ``standalone.conf`` keys, reached by the official ``pulsar-client``, by HTTPS and WSS
as any Pulsar user's script reaches them, and by Magnetar's own client and CLI.

The broker (``broker``): ``webServicePort=`` and ``brokerServicePort=`` empty, TLS on
``webServicePortTls`` and ``brokerServicePortTls``, tokens and ``AuthenticationProviderTls``
(the role is a client certificate's CN), a CA of the test's own. Roles: ``admin`` is a
superuser, ``writer`` may produce in ``public/default``, ``reader`` may consume there,
``stranger`` holds nothing. A second broker (``strict``) sets
``tlsRequireTrustedClientCertOnConnect=true``.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pulsar
import pytest
from websockets.sync.client import connect

from api.pulsar.framing import command_frame
from api.pulsar.proto import pulsar_api_pb2 as pb
from consumers.cli.tokens import create_token
from consumers.client import Client, ConnectError, HttpError
from tests.integration.pulsar_support import RECEIVE_TIMEOUT_MS, client
from tests.integration.pulsar_wire import RawConnection, T, command
from tests.integration.ws_client import b64, recv_frame, send_frame, unb64
from tests.standalone import REPO_ROOT, free_port, standalone_process, stop, wait_healthy
from tests.tls_material import TlsMaterial, make_material

SECRET = b"tls-test-secret-tls-test-secret-32b"
PROVIDERS = ("org.apache.pulsar.broker.authentication.AuthenticationProviderToken,"
             "org.apache.pulsar.broker.authentication.AuthenticationProviderTls")
CLI_TIMEOUT_S = 60


@dataclass(frozen=True)
class Broker:
    web_url: str
    """``https://127.0.0.1:<webServicePortTls>``"""
    pulsar_url: str
    """``pulsar+ssl://127.0.0.1:<brokerServicePortTls>``"""
    material: TlsMaterial
    pid: int

    @property
    def web_port(self) -> int:
        return int(self.web_url.rsplit(":", 1)[1])

    @property
    def pulsar_port(self) -> int:
        return int(self.pulsar_url.rsplit(":", 1)[1])

    @property
    def ca(self) -> str:
        return str(self.material.ca.cert)


def token(role: str) -> str:
    return create_token(role, secret_key=SECRET)


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(role)}"}


def tls_config(material: TlsMaterial, directory: Path, **keys: str) -> Path:
    secret = directory / "secret.key"
    secret.write_bytes(SECRET)
    lines = {"authenticationEnabled": "true", "authenticationProviders": PROVIDERS,
             "tokenSecretKey": f"file://{secret}", "superUserRoles": "admin",
             "tlsCertificateFilePath": str(material.server.cert), "tlsKeyFilePath": str(material.server.key),
             "tlsTrustCertsFilePath": str(material.ca.cert), **keys}
    config = directory / "standalone.conf"
    config.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
    return config


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The broker is started by its configuration alone (no port flags): what the keys say is
    what listens."""
    directory = tmp_path_factory.mktemp("tls")
    material = make_material(directory / "certs")
    web_port, pulsar_port = free_port(), free_port()
    config = tls_config(material, directory, webServicePort="", brokerServicePort="",
                        webServicePortTls=str(web_port), brokerServicePortTls=str(pulsar_port))
    proc = subprocess.Popen([sys.executable, "-m", "api.cli", "standalone", "--data-dir", str(directory / "data"),
                             "--host", "127.0.0.1", "--config", str(config), "--log-level", "warning"],
                            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        web_url = f"https://127.0.0.1:{web_port}"
        wait_healthy(f"{web_url}/healthz", proc, verify=material.context())
        for role, action in (("writer", "produce"), ("reader", "consume")):
            answer = httpx.post(f"{web_url}/admin/v2/namespaces/public/default/permissions/{role}", json=[action],
                                headers=bearer("admin"), verify=material.context(), timeout=30)
            assert answer.status_code in (200, 204), answer.text
        yield Broker(web_url, f"pulsar+ssl://127.0.0.1:{pulsar_port}", material, proc.pid)
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker with ``tlsRequireTrustedClientCertOnConnect=true`` (its health is checked with
    the admin's certificate: nothing without one gets through)."""
    directory = tmp_path_factory.mktemp("strict")
    material = make_material(directory / "certs")
    pulsar_port = free_port()
    config = tls_config(material, directory, tlsRequireTrustedClientCertOnConnect="true",
                        brokerServicePortTls=str(pulsar_port))
    with standalone_process(directory / "data", "--config", str(config),
                            https=material.context("admin")) as (url, proc):
        yield Broker(url, f"pulsar+ssl://127.0.0.1:{pulsar_port}", material, proc.pid)


# --- (a) the plain listeners are off ---------------------------------------------------------------
def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (from /proc: its socket descriptors, the kernel's
    table of listening sockets)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_only_the_tls_listeners_listen(broker: Broker) -> None:
    """Before: with the same keys the broker listened in plain on 8080 (HTTP 200 to a clear-text
    GET) and 6650, and ignored ``webServicePortTls`` (nothing listened there)."""
    assert listening_ports(broker.pid) == {broker.web_port, broker.pulsar_port}


@pytest.mark.parametrize("port", ["web", "pulsar"])
def test_a_clear_text_request_gets_no_answer_on_a_tls_port(broker: Broker, port: str) -> None:
    number = broker.web_port if port == "web" else broker.pulsar_port
    with socket.create_connection(("127.0.0.1", number), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = _read_until_closed(sock)
    assert b"HTTP/1.1" not in answer and b"healthz" not in answer


def _read_until_closed(sock: socket.socket) -> bytes:
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except ConnectionResetError:
        pass
    return received


# --- (b) HTTPS and WSS: REST, admin, WebSocket, metrics, console ---------------------------------
def https(broker: Broker, role: str | None = None) -> httpx.Client:
    """An HTTPS client trusting the broker's CA; with ``role`` it presents that role's certificate."""
    return httpx.Client(base_url=broker.web_url, verify=broker.material.context(role), timeout=30)


def test_rest_produce_and_read_admin_metrics_and_console_over_https(broker: Broker) -> None:
    with https(broker) as http:
        produced = http.post("/topics/persistent/public/default/https-rest", headers=bearer("admin"),
                             json={"messages": [{"payload": "over https"}]})
        assert produced.status_code == 200, produced.text
        read = http.get("/topics/persistent/public/default/https-rest/messages", params={"offset": 0},
                        headers=bearer("admin"))
        assert [unb64(m["payload"]) for m in read.json()["messages"]] == [b"over https"]
        assert "public" in http.get("/admin/v2/tenants", headers=bearer("admin")).json()
        metrics = http.get("/metrics")
        assert metrics.status_code == 200 and "https-rest" in metrics.text
        console = http.get("/console")
        assert console.status_code == 200 and "<html" in console.text.lower()
        assert http.get("/admin/v2/tenants").status_code == 401  # no token, no certificate


def test_wss_producer_and_consumer(broker: Broker) -> None:
    base = broker.web_url.replace("https://", "wss://") + "/ws/v2"
    context = broker.material.context()
    with connect(f"{base}/consumer/persistent/public/default/wss-topic/sub", ssl=context,
                 additional_headers=bearer("admin"), open_timeout=10) as consumer, \
            connect(f"{base}/producer/persistent/public/default/wss-topic", ssl=context,
                    additional_headers=bearer("admin"), open_timeout=10) as producer:
        send_frame(producer, {"payload": b64("over wss"), "context": "1"})
        assert recv_frame(producer)["result"] == "ok"
        message = recv_frame(consumer)
        assert unb64(message["payload"]) == b"over wss"
        send_frame(consumer, {"messageId": message["messageId"]})


def test_a_client_certificate_names_the_role_over_https_and_wss(broker: Broker) -> None:
    """Mutual TLS without a token: ``writer``'s certificate may produce, not consume;
    ``stranger``'s may do neither; the grants are the CN's."""
    path = "/topics/persistent/public/default/mtls-http"
    body = {"messages": [{"payload": "by certificate"}]}
    with https(broker, "writer") as writer:
        assert writer.post(path, json=body).status_code == 200
        assert writer.get(f"{path}/messages", params={"offset": 0}).status_code == 403
    with https(broker, "stranger") as stranger:
        refused = stranger.post(path, json=body)
        assert refused.status_code == 403 and "stranger" in refused.json()["message"]
    with https(broker) as anonymous:
        assert anonymous.post(path, json=body).status_code == 401
    url = broker.web_url.replace("https://", "wss://") + "/ws/v2/reader/persistent/public/default/mtls-http"
    with connect(f"{url}?messageId=earliest", ssl=broker.material.context("reader"), open_timeout=10) as reader:
        assert unb64(recv_frame(reader)["payload"]) == b"by certificate"


# --- (c) the official client: pulsar+ssl://, tokens and mutual TLS --------------------------------
def test_official_client_with_a_token_verifies_the_broker(broker: Broker) -> None:
    c = client(broker.pulsar_url, authentication=pulsar.AuthenticationToken(token("admin")),
               tls_trust_certs_file_path=broker.ca)
    try:
        consumer = c.subscribe("ssl-token", "s")
        c.create_producer("ssl-token").send(b"token over pulsar+ssl")
        assert consumer.receive(RECEIVE_TIMEOUT_MS).data() == b"token over pulsar+ssl"
    finally:
        c.close()


def mutual_tls_client(broker: Broker, role: str) -> pulsar.Client:
    pair = broker.material.client(role)
    return client(broker.pulsar_url, authentication=pulsar.AuthenticationTLS(str(pair.cert), str(pair.key)),
                  tls_trust_certs_file_path=broker.ca)


def test_official_client_with_mutual_tls_acts_as_the_certificates_cn(broker: Broker) -> None:
    writer = mutual_tls_client(broker, "writer")
    try:
        writer.create_producer("ssl-mtls").send(b"from writer's certificate")
        with pytest.raises(pulsar.AuthorizationError):
            writer.subscribe("ssl-mtls", "s")  # writer may produce, not consume
    finally:
        writer.close()
    reader = mutual_tls_client(broker, "reader")
    try:
        consumer = reader.subscribe("ssl-mtls", "s", initial_position=pulsar.InitialPosition.Earliest)
        assert consumer.receive(RECEIVE_TIMEOUT_MS).data() == b"from writer's certificate"
    finally:
        reader.close()
    stranger = mutual_tls_client(broker, "stranger")
    try:
        with pytest.raises(pulsar.AuthorizationError):
            stranger.create_producer("ssl-mtls")
    finally:
        stranger.close()


def test_connect_with_method_tls_needs_a_verified_certificate(broker: Broker) -> None:
    with RawConnection(broker.pulsar_port, ssl_context=broker.material.context("reader")) as with_cert:
        assert with_cert.connect(method="tls").type == T.CONNECTED
    with RawConnection(broker.pulsar_port, ssl_context=broker.material.context()) as without:
        refused = without.connect(method="tls")
        assert refused.type == T.ERROR and refused.error.error == pb.AuthenticationError
        assert "certificate" in refused.error.message


def test_a_client_without_a_trusted_certificate_is_refused_at_the_handshake(strict: Broker, tmp_path: Path) -> None:
    """``tlsRequireTrustedClientCertOnConnect=true``: no certificate, or one of another CA, and the
    TLS handshake fails on both ports, whatever token comes after; a trusted one connects."""
    foreign = make_material(tmp_path / "foreign")
    for port, probe in ((strict.web_port, HTTP_PROBE), (strict.pulsar_port, CONNECT_PROBE)):
        for context in (strict.material.context(), _trusting(strict, foreign.context("admin"))):
            assert _refused(port, context, probe), f"port {port} accepted a client without a trusted certificate"
        assert not _refused(port, strict.material.context("admin"), probe)
    token_only = pulsar.Client(strict.pulsar_url, authentication=pulsar.AuthenticationToken(token("admin")),
                               tls_trust_certs_file_path=strict.ca, operation_timeout_seconds=3,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        with pytest.raises(pulsar.PulsarException):
            token_only.create_producer("strict-refused")
    finally:
        token_only.close()
    trusted = mutual_tls_client(strict, "admin")
    try:
        trusted.create_producer("strict-ok").send(b"trusted")
    finally:
        trusted.close()


def _trusting(broker: Broker, context: ssl.SSLContext) -> ssl.SSLContext:
    context.load_verify_locations(broker.ca)
    return context


HTTP_PROBE = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
CONNECT_PROBE = command_frame(command(T.CONNECT, connect={"client_version": "probe", "protocol_version": 19,
                                                          "auth_method_name": "tls"}))


def _refused(port: int, context: ssl.SSLContext, probe: bytes) -> bool:
    """True when the TLS handshake fails, or (in TLS 1.3 the server's verdict on the client's
    certificate arrives with the first read) nothing answers ``probe`` but an alert or a close."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                sock.sendall(probe)
                return sock.recv(1) == b""
        except (ssl.SSLError, ConnectionResetError):
            return True


# --- (d) TLS 1.2 and newer only ----------------------------------------------------------------
def old_tls_context(version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client that offers exactly ``version`` (an old one), ciphers allowed at security level 0."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = context.maximum_version = version
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


def _negotiated(port: int, context: ssl.SSLContext) -> str | None:
    """The version the handshake agreed on, None when it failed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                return sock.version()
        except (ssl.SSLError, ConnectionResetError):
            return None


@pytest.fixture(scope="module")
def old_tls_server(broker: Broker) -> Iterator[int]:
    """A server that does accept TLS 1.0 and 1.1, to show the old clients below really speak them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.load_cert_chain(str(broker.material.server.cert), str(broker.material.server.key))
    listener = socket.create_server(("127.0.0.1", 0))
    stopped = threading.Event()

    def serve() -> None:
        while not stopped.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            try:
                context.wrap_socket(connection, server_side=True).close()
            except (ssl.SSLError, OSError):
                connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stopped.set()
        listener.close()
        thread.join(10)


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1], ids=["TLSv1.0", "TLSv1.1"])
def test_tls_older_than_1_2_is_refused_on_both_ports(broker: Broker, old_tls_server: int,
                                                     version: ssl.TLSVersion) -> None:
    context = old_tls_context(version)
    assert _negotiated(old_tls_server, context) is not None  # this client does speak the old version
    assert _negotiated(broker.web_port, context) is None
    assert _negotiated(broker.pulsar_port, context) is None
    assert _negotiated(broker.web_port, old_tls_context(ssl.TLSVersion.TLSv1_2)) == "TLSv1.2"
    assert _negotiated(broker.pulsar_port, old_tls_context(ssl.TLSVersion.TLSv1_3)) == "TLSv1.3"


# --- (e) Magnetar's own client and CLI with https:// and a trust file -----------------------------
def test_python_client_over_https_and_wss(broker: Broker) -> None:
    with Client(broker.web_url, token("admin"), tls_trust_certs_file_path=broker.ca) as c:
        consumer = c.subscribe("client-tls", "s", initial_position="earliest")
        c.create_producer("client-tls").send(b"via wss")
        c.produce_batch("client-tls", [b"via https"])
        assert sorted(consumer.receive(timeout_ms=RECEIVE_TIMEOUT_MS).data for _ in range(2)) == \
            [b"via https", b"via wss"]
        assert "public" in c.request("GET", "/admin/v2/tenants").json()
    pair = broker.material.client("writer")
    with Client(broker.web_url, tls_trust_certs_file_path=broker.ca, tls_certificate_file_path=str(pair.cert),
                tls_private_key_file_path=str(pair.key)) as writer:
        assert writer.produce_batch("client-tls", [b"as writer"])[0].offset == 2


def test_python_client_refuses_a_broker_it_cannot_verify(broker: Broker) -> None:
    with Client(broker.web_url, token("admin")) as untrusting:  # the system's authorities only
        with pytest.raises(HttpError, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting.produce_batch("client-tls-untrusted", [b"x"])
        with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting.create_producer("client-tls-untrusted")


def magnetar_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAGNETAR_SERVICE_URL", "MAGNETAR_TOKEN")}
    return subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S, check=False)


def test_cli_over_https_with_a_trust_file(broker: Broker) -> None:
    common = ("--service-url", broker.web_url, "--tls-trust-certs-file-path", broker.ca, "--token", token("admin"))
    produced = magnetar_cli(*common, "produce", "cli-tls", "-m", "one", "-m", "two")
    assert produced.returncode == 0, produced.stderr
    consumed = magnetar_cli(*common, "consume", "cli-tls", "-s", "s", "-p", "earliest", "-n", "2", "--timeout-s", "20")
    assert consumed.returncode == 0, consumed.stderr
    assert "content:one" in consumed.stdout and "content:two" in consumed.stdout
    tenants = magnetar_cli("admin", "tenants", "list", *common)
    assert tenants.returncode == 0 and "public" in tenants.stdout, tenants.stderr
    untrusted = magnetar_cli("--service-url", broker.web_url, "--token", token("admin"),
                             "produce", "cli-tls", "-m", "x")
    assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    assert "Traceback" not in untrusted.stderr


def test_the_lookup_names_the_https_url(broker: Broker) -> None:
    with https(broker) as http:
        found = http.get("/lookup/v2/topic/persistent/public/default/lookup-tls", headers=bearer("admin")).json()
    assert found["httpUrl"] == found["httpUrlTls"] == broker.web_url
    assert found["brokerUrl"] is None and found["brokerUrlTls"] == broker.pulsar_url


def test_no_session_ticket_follows_the_handshake(broker: Broker) -> None:
    """A TLS 1.3 ticket arriving after the handshake stalled threaded WebSocket clients' first
    request (see api/tls.py): the broker sends none, on either port."""
    for port, probe in ((broker.web_port, HTTP_PROBE), (broker.pulsar_port, CONNECT_PROBE)):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                broker.material.context("reader").wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(probe)
            assert sock.recv(1)  # the answer came: any ticket would have come before it
            assert sock.version() == "TLSv1.3"
            assert sock.session is not None and not sock.session.has_ticket
