"""Token authentication, authorization and TLS on the binary protocol, with the official client
against a real ``magnetar standalone`` configured by Pulsar's ``standalone.conf`` keys."""

from __future__ import annotations

import datetime
import ipaddress
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pulsar
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from api.pulsar.proto import pulsar_api_pb2 as pb
from consumers.cli.tokens import create_token
from tests.integration.pulsar_support import RECEIVE_TIMEOUT_MS, binary_broker, client
from tests.integration.pulsar_wire import RawConnection, T, command
from tests.standalone import free_port

SECRET = b"0123456789abcdef0123456789abcdef"


def self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "broker.cert.pem", directory / "broker.key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str, Path]]:
    """(http url, pulsar url, pulsar+ssl url, CA file) of a broker with tokens and TLS on."""
    directory = tmp_path_factory.mktemp("secured")
    secret = directory / "secret.key"
    secret.write_bytes(SECRET)
    cert, key = self_signed(directory)
    tls_port = free_port()
    config = directory / "standalone.conf"
    config.write_text(f"authenticationEnabled=true\ntokenSecretKey=file://{secret}\nsuperUserRoles=admin\n"
                      f"brokerServicePortTls={tls_port}\ntlsCertificateFilePath={cert}\ntlsKeyFilePath={key}\n"
                      "webServicePortTls=0\n"  # the web service's TLS port is tested in test_tls.py
                      "authenticationRefreshCheckSeconds=1\n")
    with binary_broker(directory / "data", "--config", str(config)) as (http_url, pulsar_url, _):
        response = httpx.post(f"{http_url}/admin/v2/namespaces/public/default/permissions/writer",
                              json=["produce"], headers={"Authorization": f"Bearer {token('admin')}"}, timeout=30)
        assert response.status_code in (200, 204), response.text
        yield http_url, pulsar_url, f"pulsar+ssl://127.0.0.1:{tls_port}", cert


def token(role: str, secret: bytes = SECRET) -> str:
    return create_token(role, secret_key=secret)


def test_a_valid_token_produces_and_consumes(secured: tuple[str, str, str, Path]) -> None:
    c = client(secured[1], authentication=pulsar.AuthenticationToken(token("admin")))
    try:
        consumer = c.subscribe("secured", "s")
        c.create_producer("secured").send(b"hello")
        assert consumer.receive(RECEIVE_TIMEOUT_MS).data() == b"hello"
    finally:
        c.close()


@pytest.mark.parametrize("credentials", [None, token("admin", b"another-secret-another-secret-!!"), "not-a-jwt"])
def test_a_missing_or_invalid_token_is_refused(secured: tuple[str, str, str, Path], credentials: str | None) -> None:
    """The broker answers CONNECT with ERROR(AuthenticationError) and closes, as Pulsar's does
    (``test_pulsar_framing.py`` checks those bytes); the C++ library behind the Python client
    treats any answer but CONNECTED as a failed connection and retries until its operation
    timeout, so the refusal surfaces as a timeout and nothing is created."""
    options = {} if credentials is None else {"authentication": pulsar.AuthenticationToken(credentials)}
    c = pulsar.Client(secured[1], operation_timeout_seconds=2, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
                      **options)
    try:
        with pytest.raises((pulsar.Timeout, pulsar.ConnectError, pulsar.AuthenticationError)):
            c.create_producer("secured-refused")
    finally:
        c.close()
    topics = httpx.get(f"{secured[0]}/admin/v2/persistent/public/default",
                       headers={"Authorization": f"Bearer {token('admin')}"}, timeout=30).json()
    assert "persistent://public/default/secured-refused" not in topics


def test_a_role_without_the_permission_is_not_authorized(secured: tuple[str, str, str, Path]) -> None:
    c = client(secured[1], authentication=pulsar.AuthenticationToken(token("writer")))
    try:
        c.create_producer("writer-topic").send(b"allowed")  # writer may produce
        with pytest.raises(pulsar.AuthorizationError):
            c.subscribe("writer-topic", "s")  # but not consume
    finally:
        c.close()
    stranger = client(secured[1], authentication=pulsar.AuthenticationToken(token("stranger")))
    try:
        with pytest.raises(pulsar.AuthorizationError):
            stranger.create_producer("writer-topic")
    finally:
        stranger.close()


def test_tls_listener_serves_the_same_broker(secured: tuple[str, str, str, Path]) -> None:
    c = client(secured[2], authentication=pulsar.AuthenticationToken(token("admin")),
               tls_trust_certs_file_path=str(secured[3]))
    try:
        consumer = c.subscribe("over-tls", "s")
        c.create_producer("over-tls").send(b"encrypted on the wire")
        assert consumer.receive(RECEIVE_TIMEOUT_MS).data() == b"encrypted on the wire"
    finally:
        c.close()


def test_tls_with_an_untrusted_certificate_is_refused(secured: tuple[str, str, str, Path], tmp_path: Path) -> None:
    other, _ = self_signed(tmp_path)
    c = pulsar.Client(secured[2], authentication=pulsar.AuthenticationToken(token("admin")),
                      tls_trust_certs_file_path=str(other), operation_timeout_seconds=5,
                      logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        with pytest.raises(pulsar.PulsarException):
            c.create_producer("over-tls-untrusted")
    finally:
        c.close()


def test_listing_a_namespace_needs_a_permission_there(secured: tuple[str, str, str, Path]) -> None:
    port = int(secured[1].rsplit(":", 1)[1])
    listing = {"request_id": 1, "namespace": "public/default"}
    with RawConnection(port) as stranger:
        stranger.connect(token=token("stranger"))
        stranger.send_command(command(T.GET_TOPICS_OF_NAMESPACE, getTopicsOfNamespace=listing))
        assert stranger.expect(T.ERROR).error.error == pb.AuthorizationError
        stranger.send_command(command(T.WATCH_TOPIC_LIST, watchTopicList={
            **listing, "request_id": 2, "watcher_id": 1, "topics_pattern": ".*"}))
        assert stranger.expect(T.ERROR).error.error == pb.AuthorizationError
    with RawConnection(port) as writer:
        writer.connect(token=token("writer"))
        writer.send_command(command(T.GET_TOPICS_OF_NAMESPACE, getTopicsOfNamespace=listing))
        assert writer.expect(T.GET_TOPICS_OF_NAMESPACE_RESPONSE).getTopicsOfNamespaceResponse.request_id == 1


def connect_expiring(conn: RawConnection, role: str, *, refresh: bool, expires_in_s: int = 2) -> None:
    """CONNECT with a token that expires soon, saying whether this client can refresh it."""
    body: dict[str, object] = {"client_version": "raw-test", "protocol_version": 19, "auth_method_name": "token",
                               "auth_data": create_token(role, secret_key=SECRET, expires_in_s=expires_in_s).encode()}
    if refresh:
        body["feature_flags"] = {"supports_auth_refresh": True}
    conn.send_command(command(T.CONNECT, connect=body))
    assert conn.expect(T.CONNECTED).type == T.CONNECTED


def refresh_with(conn: RawConnection, role: str) -> None:
    conn.send_command(command(T.AUTH_RESPONSE, authResponse={"response": {
        "auth_method_name": "token", "auth_data": create_token(role, secret_key=SECRET, expires_in_s=600).encode()}}))


def test_an_expired_token_is_challenged_and_a_fresh_one_keeps_the_connection(
        secured: tuple[str, str, str, Path]) -> None:
    port = int(secured[1].rsplit(":", 1)[1])
    with RawConnection(port) as conn:
        connect_expiring(conn, "writer", refresh=True)
        challenge = conn.expect(T.AUTH_CHALLENGE).authChallenge  # within a check or two of the expiry
        assert challenge.challenge.auth_method_name == "token"
        refresh_with(conn, "writer")
        time.sleep(2.5)  # two more checks: a refused or missing refresh would have closed the connection
        conn.send_command(command(T.PING, ping={}))
        assert conn.expect(T.PONG).type == T.PONG


@pytest.mark.parametrize("case", ["cannot refresh", "refreshes as another role"])
def test_an_expired_token_ends_a_connection_that_does_not_refresh_it(
        secured: tuple[str, str, str, Path], case: str) -> None:
    port = int(secured[1].rsplit(":", 1)[1])
    with RawConnection(port) as conn:
        connect_expiring(conn, "writer", refresh=case != "cannot refresh")
        if case == "refreshes as another role":
            conn.expect(T.AUTH_CHALLENGE)
            refresh_with(conn, "admin")
        assert conn.closes()
