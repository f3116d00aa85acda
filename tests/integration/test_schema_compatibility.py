"""Schema compatibility as Pulsar checks it, with the official ``pulsar-client`` and Avro ``Record``
classes against a real ``magnetar standalone``: the strategy a topic lives by (topic policy, else
the namespace's ``schemaCompatibilityStrategy``, else the broker's ``schemaCompatibilityStrategy``
setting), refusals answered at once as ``IncompatibleSchema``, and Java Avro's resolution rules
(a renamed record is the same record to Pulsar).

One broker serves the module, started with ``schemaCompatibilityStrategy=BACKWARD``; every test
uses its own namespace.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, Record, String

from tests.integration.pulsar_support import RECEIVE_TIMEOUT_MS, binary_broker, client

REFUSAL_S_MAX = 2.0
"""A refused producer hears so at once, not after the client's operation timeout."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    directory: Path = tmp_path_factory.mktemp("schemas")
    config = directory / "standalone.conf"
    config.write_text("schemaCompatibilityStrategy=BACKWARD\n")
    with binary_broker(directory / "data", "--config", str(config)) as (http_url, pulsar_url, _):
        yield http_url, pulsar_url


@pytest.fixture
def pc(broker: tuple[str, str]) -> Iterator[pulsar.Client]:
    c = client(broker[1])
    yield c
    c.close()


@pytest.fixture
def namespace(broker: tuple[str, str]) -> str:
    name = f"public/s{uuid.uuid4().hex[:8]}"
    response = httpx.put(f"{broker[0]}/admin/v2/namespaces/{name}", timeout=10)
    assert response.status_code in (200, 204), response.text
    return name


def _record(class_name: str, **fields: object) -> type:
    """A ``Record`` class (its Avro record is named ``class_name``) with ``fields``."""
    return type(class_name, (Record,), fields)


def _set_strategy(http_url: str, path: str, strategy: str) -> None:
    response = httpx.put(f"{http_url}/admin/v2/{path}/schemaCompatibilityStrategy", json=strategy, timeout=10)
    assert response.status_code == 204, response.text


def _refused_at_once(pc: pulsar.Client, topic: str, record: type) -> None:
    start = time.monotonic()
    with pytest.raises(pulsar.IncompatibleSchema):
        pc.create_producer(topic, schema=AvroSchema(record))
    elapsed = time.monotonic() - start
    assert elapsed < REFUSAL_S_MAX, f"the refusal took {elapsed:.2f} s"


def test_the_namespace_strategy_is_put_and_got_as_a_bare_json_string(broker: tuple[str, str],
                                                                     namespace: str) -> None:
    url = f"{broker[0]}/admin/v2/namespaces/{namespace}/schemaCompatibilityStrategy"
    assert httpx.get(url, timeout=10).json() == "UNDEFINED"
    _set_strategy(broker[0], f"namespaces/{namespace}", "FORWARD_TRANSITIVE")
    assert httpx.get(url, timeout=10).json() == "FORWARD_TRANSITIVE"
    refused = httpx.put(url, json="SIDEWAYS", timeout=10)
    assert refused.status_code == 400 and "SIDEWAYS" in refused.json()["message"]
    assert httpx.get(url, timeout=10).json() == "FORWARD_TRANSITIVE"


def test_the_broker_setting_applies_where_the_namespace_says_undefined(pc: pulsar.Client,
                                                                        namespace: str) -> None:
    """Dropping a field without a default: BACKWARD (the broker's setting here) accepts it, FULL
    (Pulsar's default when nothing is set) would refuse it."""
    topic = f"persistent://{namespace}/drop"
    v1 = _record("Event", name=String(), count=Integer())
    pc.create_producer(topic, schema=AvroSchema(v1)).send(v1(name="a", count=1))
    v2 = _record("Event", name=String())
    pc.create_producer(topic, schema=AvroSchema(v2)).send(v2(name="b"))


def test_an_incompatible_producer_is_refused_at_once_and_a_compatible_one_evolves(
        pc: pulsar.Client, broker: tuple[str, str], namespace: str) -> None:
    topic = f"persistent://{namespace}/evolve"
    _set_strategy(broker[0], f"namespaces/{namespace}", "FULL")
    v1 = _record("Event", name=String(), count=Integer())
    consumer = pc.subscribe(topic, "s", schema=AvroSchema(v1), initial_position=pulsar.InitialPosition.Earliest)
    pc.create_producer(topic, schema=AvroSchema(v1)).send(v1(name="first", count=1))
    v2 = _record("Event", name=String(), count=Integer(), note=String(required_default=True))
    pc.create_producer(topic, schema=AvroSchema(v2)).send(v2(name="second", count=2, note="n"))
    assert [consumer.receive(RECEIVE_TIMEOUT_MS).value().name for _ in range(2)] == ["first", "second"]
    required = _record("Event", name=String(), count=Integer(), extra=String(required=True))
    _refused_at_once(pc, topic, required)
    retyped = _record("Event", name=Integer(), count=Integer())
    _refused_at_once(pc, topic, retyped)
    versions = httpx.get(f"{broker[0]}/admin/v2/schemas/{namespace}/evolve/schemas", timeout=10).json()
    assert [v["version"] for v in versions["getSchemaResponses"]] == [0, 1]


def test_a_renamed_record_is_the_same_record_to_pulsar(pc: pulsar.Client, broker: tuple[str, str],
                                                       namespace: str) -> None:
    """Java Avro's resolution does not compare record names (Python's checker does): a producer
    whose Record class was renamed, with the same fields, is a compatible new version."""
    topic = f"persistent://{namespace}/renamed"
    _set_strategy(broker[0], f"namespaces/{namespace}", "FULL_TRANSITIVE")
    old = _record("Order", id=String(), amount=Integer())
    pc.create_producer(topic, schema=AvroSchema(old)).send(old(id="a", amount=1))
    new = _record("PurchaseOrder", id=String(), amount=Integer())
    pc.create_producer(topic, schema=AvroSchema(new)).send(new(id="b", amount=2))
    versions = httpx.get(f"{broker[0]}/admin/v2/schemas/{namespace}/renamed/schemas", timeout=10).json()
    assert [v["version"] for v in versions["getSchemaResponses"]] == [0, 1]


def test_changing_the_strategy_by_the_admin_api_changes_the_answer(pc: pulsar.Client, broker: tuple[str, str],
                                                                   namespace: str) -> None:
    topic = f"persistent://{namespace}/switch"
    v1 = _record("Event", name=String())
    pc.create_producer(topic, schema=AvroSchema(v1))
    required = _record("Event", name=String(), extra=String(required=True))
    _set_strategy(broker[0], f"namespaces/{namespace}", "FORWARD")
    pc.create_producer(topic, schema=AvroSchema(required))  # old readers skip the new field
    stricter = _record("Event", name=String(), extra=String(required=True), more=String(required=True))
    _set_strategy(broker[0], f"namespaces/{namespace}", "BACKWARD")
    _refused_at_once(pc, topic, stricter)  # the new reader misses `more` in the stored data
    _set_strategy(broker[0], f"namespaces/{namespace}", "ALWAYS_COMPATIBLE")
    pc.create_producer(topic, schema=AvroSchema(stricter))
    _set_strategy(broker[0], f"namespaces/{namespace}", "ALWAYS_INCOMPATIBLE")
    harmless = _record("Event", name=String(), extra=String(required=True), more=String(required=True),
                       note=String(required_default=True))
    _refused_at_once(pc, topic, harmless)
    pc.create_producer(topic, schema=AvroSchema(v1))  # a version the topic already has is always admitted


def test_a_topic_strategy_overrides_its_namespace(pc: pulsar.Client, broker: tuple[str, str],
                                                  namespace: str) -> None:
    topic = f"persistent://{namespace}/own"
    _set_strategy(broker[0], f"namespaces/{namespace}", "ALWAYS_INCOMPATIBLE")
    v1 = _record("Event", name=String())
    pc.create_producer(topic, schema=AvroSchema(v1))
    topic_url = f"{broker[0]}/admin/v2/persistent/{namespace}/own/schemaCompatibilityStrategy"
    assert httpx.get(topic_url, timeout=10).json() is None
    assert httpx.get(topic_url, params={"applied": "true"}, timeout=10).json() == "ALWAYS_INCOMPATIBLE"
    _set_strategy(broker[0], f"persistent/{namespace}/own", "BACKWARD")
    assert httpx.get(topic_url, timeout=10).json() == "BACKWARD"
    v2 = _record("Event", name=String(), note=String(required_default=True))
    pc.create_producer(topic, schema=AvroSchema(v2))
    assert httpx.delete(topic_url, timeout=10).status_code == 204
    v3 = _record("Event", name=String(), note=String(required_default=True), n=Integer())
    _refused_at_once(pc, topic, v3)


def test_with_auto_update_off_only_a_schema_the_topic_has_is_admitted(pc: pulsar.Client, broker: tuple[str, str],
                                                                      namespace: str) -> None:
    """Pulsar's ``isAllowAutoUpdateSchema``: off, a producer may not add a version (an upload may)."""
    url = f"{broker[0]}/admin/v2/namespaces/{namespace}/isAllowAutoUpdateSchema"
    assert httpx.get(url, timeout=10).json() is True  # the broker's isAllowAutoUpdateSchemaEnabled
    topic = f"persistent://{namespace}/frozen"
    v1 = _record("Event", name=String())
    pc.create_producer(topic, schema=AvroSchema(v1))
    assert httpx.post(url, json=False, timeout=10).status_code == 204
    assert httpx.get(url, timeout=10).json() is False
    v2 = _record("Event", name=String(), note=String(required_default=True))
    _refused_at_once(pc, topic, v2)
    pc.create_producer(topic, schema=AvroSchema(v1))
    upload = httpx.post(f"{broker[0]}/admin/v2/schemas/{namespace}/frozen/schema", timeout=10,
                        json={"type": "AVRO", "schema": AvroSchema(v2).schema_info().schema()})
    assert upload.status_code == 200 and upload.json() == {"version": 1}, upload.text
    pc.create_producer(topic, schema=AvroSchema(v2))
    assert httpx.post(url, json="no", timeout=10).status_code == 400


def test_with_validation_enforced_a_producer_without_a_schema_is_refused(pc: pulsar.Client, broker: tuple[str, str],
                                                                         namespace: str) -> None:
    """Pulsar's ``schemaValidationEnforced``: on, a producer without a schema may not write to a topic with one."""
    url = f"{broker[0]}/admin/v2/namespaces/{namespace}/schemaValidationEnforced"
    assert httpx.get(url, timeout=10).json() is False
    with_schema, without = f"persistent://{namespace}/typed", f"persistent://{namespace}/untyped"
    pc.create_producer(with_schema, schema=AvroSchema(_record("Event", name=String())))
    pc.create_producer(with_schema).close()  # not enforced: bytes are admitted
    assert httpx.post(url, json=True, timeout=10).status_code == 204
    assert httpx.get(url, timeout=10).json() is True
    start = time.monotonic()
    with pytest.raises(pulsar.IncompatibleSchema):
        pc.create_producer(with_schema)
    assert time.monotonic() - start < REFUSAL_S_MAX
    pc.create_producer(without).send(b"a topic without a schema takes bytes")
