"""The native maker of a recorder's notifications and UUIDs (``consumers/eventsourcing/_notifications.c``):
built by ``make``, taken by ``records.py``, its objects the Python path's in every way an
application could see, and any argument ``records.py`` never passes refused."""

from __future__ import annotations

import gc
import sys
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from eventsourcing.persistence import Notification

import consumers.eventsourcing._notifications as native_notifications
from consumers.eventsourcing import records
from consumers.eventsourcing.records import notifications_of
from tests.unit.test_eventsourcing_records import MIXED, ORDER

UUID_INT, UUID_IS_SAFE = vars(uuid.UUID)["int"], vars(uuid.UUID)["is_safe"]


def made_both_ways(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Notification], list[Notification]]:
    native = notifications_of(MIXED, frozenset(), 10)
    monkeypatch.setattr(records, "NATIVE_NOTIFICATIONS", False)
    return native, notifications_of(MIXED, frozenset(), 10)


def test_make_builds_the_native_maker_and_records_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert records.NATIVE_NOTIFICATIONS
    calls: list[str] = []

    class Counted:
        def uuids(self, *args: Any) -> Any:
            calls.append("uuids")
            return native_notifications.uuids(*args)

        def notifications(self, *args: Any) -> Any:
            calls.append("notifications")
            return native_notifications.notifications(*args)

    monkeypatch.setattr("consumers.eventsourcing.records.native_notifications", Counted())
    assert len(notifications_of(MIXED, frozenset(), 10)) == 3
    assert calls == ["notifications"]  # MIXED's keys are not all UUIDs: UUID() reads each
    page = MIXED.filter(pa.array([True, False, False, True, False]))
    assert [n.originator_id for n in notifications_of(page, frozenset(), 10)] == [ORDER, ORDER]
    assert calls == ["notifications", "uuids", "notifications"]


def test_its_notifications_and_uuids_are_the_python_paths_in_every_way(monkeypatch: pytest.MonkeyPatch) -> None:
    native, python = made_both_ways(monkeypatch)
    assert native == python and [vars(n) for n in native] == [vars(n) for n in python]
    assert [list(vars(n)) for n in native] == [list(vars(n)) for n in python]  # fields in order
    assert [gc.is_tracked(n) for n in native] == [gc.is_tracked(n) for n in python] == [True] * 3
    assert [gc.is_tracked(vars(n)) for n in native] == [gc.is_tracked(vars(n)) for n in python]
    ids = [n.originator_id for n in native if isinstance(n.originator_id, uuid.UUID)]
    assert ids == [ORDER, ORDER] and all(type(i) is uuid.UUID and i.is_safe is uuid.SafeUUID.unknown for i in ids)
    assert all(weakref.ref(i)() is i and hash(i) == hash(ORDER) for i in ids)
    with pytest.raises(TypeError):
        ids[0].int = 1  # type: ignore[misc]  # immutable, as UUID is


def test_a_window_of_notifications_gives_the_collector_only_the_notifications_to_walk() -> None:
    """A UUID made natively (immutable: an int and a SafeUUID member) and a notification's dict
    of such fields can be in no reference cycle, so neither is tracked: a window of
    notifications adds one object a row for a collection to walk and promote, not three. The
    dict is tracked again as soon as a value that could be in a cycle goes in (CPython's own
    rule), and a collection frees such a cycle."""
    page = MIXED.filter(pa.array([True, False, False, True, False]))  # every key a UUID: uuids() makes them
    made = notifications_of(page, frozenset(), 10)
    assert [n.originator_id for n in made] == [ORDER, ORDER]
    assert [gc.is_tracked(n) for n in made] == [True, True]
    assert not any(gc.is_tracked(n.originator_id) or gc.is_tracked(vars(n)) for n in made)
    notification = made.pop()
    object.__setattr__(notification, "cycle", [notification])  # a frozen dataclass set anyway
    assert gc.is_tracked(vars(notification))
    freed = weakref.ref(notification)
    del notification
    gc.collect()
    assert freed() is None


def test_what_it_makes_is_freed_with_its_last_reference() -> None:
    bits = ORDER.bytes * 1000
    made = native_notifications.uuids(uuid.UUID, UUID_INT, UUID_IS_SAFE, uuid.SafeUUID.unknown, bits)
    first = weakref.ref(made[0])
    references = sys.getrefcount(made[0])  # the list's and the call's argument
    assert references == 2
    del made
    assert first() is None


@pytest.mark.parametrize(("call", "error"), [
    (lambda n: n.uuids(uuid.UUID, UUID_INT, UUID_IS_SAFE, uuid.SafeUUID.unknown, b"x" * 15), ValueError),
    (lambda n: n.uuids(uuid.UUID, UUID_INT, UUID_IS_SAFE, uuid.SafeUUID.unknown, "x" * 16), TypeError),
    (lambda n: n.uuids(uuid.UUID, 1, 2, 3, b"x" * 16), TypeError),
    (lambda n: n.uuids(uuid.UUID), TypeError),
    (lambda n: n.notifications(Notification, [0, 1], [ORDER], [1], ["t"], [b""]), ValueError),
    (lambda n: n.notifications(Notification, [0], [ORDER], (1,), ["t"], [b""]), TypeError),
    (lambda n: n.notifications(Notification, ["0"], [ORDER], [1], ["t"], [b""]), TypeError),
    (lambda n: n.notifications("Notification", [0], [ORDER], [1], ["t"], [b""]), TypeError),
])
def test_it_refuses_what_records_never_passes(call: Callable[[object], object], error: type[Exception]) -> None:
    with pytest.raises(error):
        call(native_notifications)
