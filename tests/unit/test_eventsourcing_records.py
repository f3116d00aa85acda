"""The application recorder's notifications from a range read's Arrow rows (``records.py``):
tracking records and other topics left out, ids, versions and originator ids as the library's
``Notification``, and a message that is no stored event refused, over the broker's own schema;
each made natively (``_notifications.c``) and in Python, alike."""

from __future__ import annotations

import dataclasses
import pickle
import random
import uuid
from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest
from eventsourcing.persistence import DataError, Notification

from broker.entry_format.columns import ARROW_SCHEMA
from consumers.eventsourcing import records
from consumers.eventsourcing.records import (
    ID_TYPE_PROPERTY,
    TOPIC_PROPERTY,
    TRACKING_PROPERTY,
    UUID_ID_TYPE,
    VERSION_PROPERTY,
    last_notification_offset,
    notifications_of,
)

ORDER = uuid.UUID("0b7a6a34-3f5e-4c0e-9d7e-6c1f3f0c2a11")


@pytest.fixture(autouse=True, params=["native", "python"])
def maker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every test once with the native maker of notifications and UUIDs and once without."""
    if request.param == "python":
        monkeypatch.setattr(records, "NATIVE_NOTIFICATIONS", False)
    yield request.param


def event(offset: int, key: str, version: int, topic: str, state: bytes, *, is_uuid: bool) -> dict[str, object]:
    properties = [(TOPIC_PROPERTY, topic), (VERSION_PROPERTY, str(version))]
    if is_uuid:
        properties.append((ID_TYPE_PROPERTY, UUID_ID_TYPE))
    return row(offset, key, state, properties)


def tracking(offset: int, application: str, notification_id: int) -> dict[str, object]:
    return row(offset, f"__tracking__/{application}", b"", [(TRACKING_PROPERTY, str(notification_id))])


def row(offset: int, key: str, value: bytes, properties: list[tuple[str, str]]) -> dict[str, object]:
    return {"key": key.encode(), "value": value, "topic": "persistent://public/default/app", "partition": -1,
            "offset": offset, "messageId": "CAAQAA==", "publishTime": 0, "eventTime": None,
            "properties": properties}


def rows(*messages: dict[str, object]) -> pa.Table:
    return pa.Table.from_pylist(list(messages), schema=ARROW_SCHEMA)


MIXED = rows(event(0, str(ORDER), 1, "orders:Created", b"a", is_uuid=True),
             tracking(1, "upstream", 7),
             event(2, "account-9", 3, "accounts:Opened", b"bb", is_uuid=False),
             event(3, str(ORDER), 2, "orders:Paid", b"ccc", is_uuid=True),
             tracking(4, "upstream", 8))


def test_notifications_leave_tracking_records_out_and_keep_ids_versions_and_originators() -> None:
    assert notifications_of(MIXED, frozenset(), 10) == [
        Notification(id=1, originator_id=ORDER, originator_version=1, topic="orders:Created", state=b"a"),
        Notification(id=3, originator_id="account-9", originator_version=3, topic="accounts:Opened", state=b"bb"),
        Notification(id=4, originator_id=ORDER, originator_version=2, topic="orders:Paid", state=b"ccc"),
    ]


def test_notifications_of_some_topics_up_to_a_limit() -> None:
    assert [n.id for n in notifications_of(MIXED, frozenset({"orders:Paid", "accounts:Opened"}), 10)] == [3, 4]
    assert [n.id for n in notifications_of(MIXED, frozenset(), 2)] == [1, 3]
    assert notifications_of(MIXED, frozenset({"nothing:Here"}), 10) == []


def test_the_last_notification_is_before_trailing_tracking_records() -> None:
    assert last_notification_offset(MIXED) == 3
    assert last_notification_offset(rows(tracking(0, "upstream", 1))) is None


def test_a_message_that_is_no_stored_event_is_a_data_error() -> None:
    foreign = rows(event(0, "a", 1, "t", b"", is_uuid=False), row(1, "b", b"x", [("colour", "blue")]))
    with pytest.raises(DataError, match="not stored events"):
        notifications_of(foreign, frozenset(), 10)


@pytest.mark.parametrize("texts", [
    [str(uuid.uuid4()) for _ in range(5)],  # as str(UUID) writes them: made from their bits
    [str(uuid.uuid4()).upper(), str(uuid.uuid4())],  # upper case hex is the same UUID
    ["{" + str(ORDER) + "}", str(uuid.uuid4())],  # not the 36 characters: UUID() reads each
    ["urn:uuid:" + str(ORDER)],
    [str(ORDER).replace("-", "")],
    ["0b7a6a34-3f5e-4c0e-9d7e6c1f-3f0c2a11", str(ORDER)],  # dashes elsewhere: UUID() strips them too
    ["0x" + str(ORDER).replace("-", "")[2:]],  # 32 characters that int(_, 16) reads, not all hex digits
])
def test_originator_ids_marked_uuid_are_the_uuids_uuid_reads(texts: list[str]) -> None:
    page = rows(*(event(offset, text, 1, "t", b"", is_uuid=True) for offset, text in enumerate(texts)))
    ids = [n.originator_id for n in notifications_of(page, frozenset(), 10)]
    assert ids == [uuid.UUID(text) for text in texts]
    assert all(type(i) is uuid.UUID and i.is_safe is uuid.SafeUUID.unknown for i in ids)
    assert [hash(i) for i in ids] == [hash(uuid.UUID(text)) for text in texts]
    assert [str(i) for i in ids] == [str(uuid.UUID(text)) for text in texts]


@pytest.mark.parametrize("seed", range(40))
def test_originator_ids_of_random_uuid_texts_are_what_uuid_reads_in_pages_cut_from_a_window(seed: int) -> None:
    rng = random.Random(seed)
    forms: list[Callable[[uuid.UUID], str]] = [str, lambda u: str(u).upper(), lambda u: u.hex,
                                               lambda u: "{" + str(u) + "}"]
    texts = [rng.choice(forms if rng.random() < 0.2 else forms[:1])(uuid.UUID(int=rng.getrandbits(128)))
             for _ in range(rng.randrange(1, 60))]
    window = rows(*(event(offset, text, 1, "t", b"", is_uuid=True) for offset, text in enumerate(texts)))
    first = rng.randrange(len(texts))
    page = window.slice(first, rng.randrange(1, len(texts) - first + 1))  # as pages are cut from a window
    ids = [n.originator_id for n in notifications_of(page, frozenset(), 100)]
    assert ids == [uuid.UUID(text) for text in texts[first:first + page.num_rows]]
    assert all(type(i) is uuid.UUID and i.is_safe is uuid.SafeUUID.unknown for i in ids)


def test_notifications_are_the_librarys_own_in_every_way() -> None:
    made = notifications_of(MIXED, frozenset(), 10)[0]
    built = Notification(id=1, originator_id=ORDER, originator_version=1, topic="orders:Created", state=b"a")
    assert type(made) is Notification and made == built and hash(made) == hash(built)
    assert vars(made) == vars(built) and list(vars(made)) == list(vars(built))  # the same fields, in order
    assert repr(made) == repr(built) and pickle.loads(pickle.dumps(made)) == built
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.id = 2  # type: ignore[misc]


@pytest.mark.parametrize("texts", [
    [str(ORDER), "not-a-uuid"],
    [str(ORDER)[:8] + " " + str(ORDER)[9:], str(uuid.uuid4())],  # 36 characters, a space among them
    [str(ORDER)[:8] + " " + str(ORDER)[8:].replace("-", "")],  # 32 hex digits and a space
    ["0b7a6a34-3f5e-4c0e-9d7e-6c1f3f0c2a1", "10b7a6a34-3f5e-4c0e-9d7e-6c1f3f0c2a1"],  # 31 and 33 digits
    ["0b7a6a34_3f5e_4c0e_9d7e_6c1f3f0c2a11"],
    ["0b7a6a34-3f5e-4c0e-9d7e-6c1f3f0c2a1\u00e4"],  # 32 characters, one of them no ASCII
])
def test_a_key_marked_uuid_that_is_none_is_refused_as_uuid_refuses_it(texts: list[str]) -> None:
    page = rows(*(event(offset, text, 1, "t", b"", is_uuid=True) for offset, text in enumerate(texts)))
    with pytest.raises(ValueError):
        [uuid.UUID(text) for text in texts]
    with pytest.raises(ValueError):
        notifications_of(page, frozenset(), 10)


def test_the_fast_ways_serve_the_installed_library_and_usual_keys() -> None:
    """The decoding shortcuts are taken, not silently passed by: notifications from their fields'
    dict for the library's ``Notification``, and UUIDs from their bits for 32 hex digits a key."""
    assert records._NOTIFICATION_OF_FIELDS
    keys = pa.chunked_array([pa.array([str(ORDER), str(ORDER).upper(), ORDER.hex])])
    assert records._uuids_of(keys) == [ORDER, ORDER, ORDER]
    assert records._uuids_of(pa.chunked_array([pa.array(["{" + str(ORDER) + "}"])])) is None


def test_the_recorders_arrow_work_allocates_from_its_own_pool_not_the_applications_default() -> None:
    """Decoding a page allocates from the recorder's pool (jemalloc here), and Arrow's default
    pool (the application's choice) is left as it was."""
    assert records.ARROW_POOL.backend_name == ("jemalloc" if "jemalloc" in pa.supported_memory_backends()
                                               else pa.default_memory_pool().backend_name)
    if records.ARROW_POOL.backend_name == pa.default_memory_pool().backend_name:
        pytest.skip("this pyarrow has no jemalloc: the recorder uses the default pool")
    ours_before = records.ARROW_POOL.bytes_allocated()
    many = rows(*(event(i, str(uuid.UUID(int=i)), 1, "orders:Created", b"x" * 100, is_uuid=True)
                  for i in range(2000)))
    default_before = pa.default_memory_pool().bytes_allocated()
    properties = records._Properties.of(many)
    events = records._events_among(many, frozenset({"orders:Created"}))
    assert records.ARROW_POOL.bytes_allocated() > ours_before
    assert pa.default_memory_pool().bytes_allocated() == default_before
    assert len(properties.values_of(records._VERSION)) == events.num_rows == 2000

