"""Advertised listeners (Pulsar's ``advertisedListeners`` and ``internalListenerName``) against a
real ``magnetar standalone``: lookups answer the listener a client names, the internal one when
it names none, and Pulsar's refusal for a name the broker does not have; the official client
connects to what the lookup answered; a malformed ``advertisedListeners`` is a one-line
start-up error.

Before ``api/pulsar/listeners.py`` the keys were ignored (named in the "unused keys" warning):
every lookup answered ``pulsar://127.0.0.1:PORT``, the address the client had connected to,
whatever listener it named, and a client naming a listener the broker does not have was
served as any other.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pulsar
import pytest

from api.pulsar.proto import pulsar_api_pb2 as pb
from tests.integration.pulsar_support import client
from tests.integration.pulsar_wire import RawConnection, T, command
from tests.integration.test_startup_errors import run_refused
from tests.standalone import free_port, standalone_command, standalone_process

TOPIC = "persistent://public/default/listened"
REFUSAL_S_MAX = 2.0
"""A lookup refused for an unknown listener is answered at once (a bound, not a timing claim)."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(http url, binary port) of a broker advertising ``internal`` on 127.0.0.1 and
    ``external`` on localhost, both its one binary port."""
    directory = Path(tmp_path_factory.mktemp("listeners"))
    port = free_port()
    config = directory / "standalone.conf"
    config.write_text(f"advertisedListeners=internal:pulsar://127.0.0.1:{port},external:pulsar://localhost:{port}\n"
                      "internalListenerName=internal\n")
    with standalone_process(directory / "data", "--pulsar-port", str(port), "--config", str(config)) as (url, _):
        yield url, port


def _lookup(port: int, listener: str | None) -> pb.CommandLookupTopicResponse:
    body: dict[str, object] = {"topic": TOPIC, "request_id": 1}
    if listener is not None:
        body["advertised_listener_name"] = listener
    with RawConnection(port) as conn:
        conn.connect()
        conn.send_command(command(T.LOOKUP, lookupTopic=body))
        return conn.expect(T.LOOKUP_RESPONSE).lookupTopicResponse


def test_a_binary_lookup_answers_the_named_listener_or_the_internal_one(broker: tuple[str, int]) -> None:
    _, port = broker
    external = _lookup(port, "external")
    assert external.response == pb.CommandLookupTopicResponse.Connect
    assert external.brokerServiceUrl == f"pulsar://localhost:{port}"
    internal = _lookup(port, "internal")
    assert internal.brokerServiceUrl == f"pulsar://127.0.0.1:{port}"
    unnamed = _lookup(port, None)
    assert unnamed.brokerServiceUrl == f"pulsar://127.0.0.1:{port}"


def test_an_unknown_listener_is_refused_with_pulsars_error(broker: tuple[str, int]) -> None:
    _, port = broker
    refused = _lookup(port, "elsewhere")
    assert refused.response == pb.CommandLookupTopicResponse.Failed
    assert refused.error == pb.ServiceNotReady
    assert refused.message == "the broker do not have elsewhere listener"


def test_the_official_client_connects_through_the_named_listener(broker: tuple[str, int]) -> None:
    _, port = broker
    pc = client(f"pulsar://127.0.0.1:{port}", listener_name="external")
    try:
        consumer = pc.subscribe(TOPIC, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = pc.create_producer(TOPIC, batching_enabled=False)
        producer.send(b"through external")
        message = consumer.receive(10_000)
        assert message.data() == b"through external"
    finally:
        pc.close()


def test_the_official_client_naming_pulsars_test_listener_fails_at_once(broker: tuple[str, int]) -> None:
    # Pulsar's clients end a lookup refused for "the broker do not have test listener" at once
    # (ConnectError); for other names they retry ServiceNotReady until their operation timeout
    _, port = broker
    pc = client(f"pulsar://127.0.0.1:{port}", listener_name="test")
    try:
        started = time.monotonic()
        with pytest.raises(pulsar.PulsarException):
            pc.create_producer(TOPIC)
        assert time.monotonic() - started < REFUSAL_S_MAX
    finally:
        pc.close()


def test_the_http_lookup_honours_listener_name_and_its_header(broker: tuple[str, int]) -> None:
    url, port = broker
    path = f"{url}/lookup/v2/topic/persistent/public/default/listened"
    assert httpx.get(path, params={"listenerName": "external"}).json()["brokerUrl"] == f"pulsar://localhost:{port}"
    by_header = httpx.get(path, headers={"X-Pulsar-ListenerName": "external"}).json()
    assert by_header["brokerUrl"] == by_header["nativeUrl"] == f"pulsar://localhost:{port}"
    assert httpx.get(path).json()["brokerUrl"] == f"pulsar://127.0.0.1:{port}"
    refused = httpx.get(path, params={"listenerName": "elsewhere"})
    assert refused.status_code == 503
    assert refused.json()["message"] == "the broker do not have elsewhere listener"


@pytest.mark.parametrize(("listeners", "internal", "words"), [
    ("pulsar://127.0.0.1:6650", "", "is not listener_name:scheme://host:port"),
    ("a:pulsar://127.0.0.1:6650,a:pulsar://127.0.0.2:6650", "", "has two pulsar:// URLs"),
    ("a:pulsar://127.0.0.1:6650,b:pulsar+ssl://127.0.0.1:6650", "", "is given to two listeners"),
    ("a:pulsar://127.0.0.1:6650", "b", "internalListenerName 'b' is not one of"),
    ("a:kafka://127.0.0.1:9092", "", "is not pulsar / pulsar+ssl / http / https://host:port"),
])
def test_a_malformed_advertised_listeners_is_one_line(tmp_path: Path, listeners: str, internal: str,
                                                      words: str) -> None:
    config = tmp_path / "standalone.conf"
    config.write_text(f"advertisedListeners={listeners}\ninternalListenerName={internal}\n")
    line = run_refused(*standalone_command(tmp_path / "data", free_port()), "--config", str(config))
    assert line.startswith("magnetar standalone: ") and words in line, line
    assert not (tmp_path / "data" / "bookie").exists()
