"""The ``eventsourcing`` library's recorders over one Magnetar topic (through the project's client).

Role: ``MagnetarAggregateRecorder`` stores an aggregate's events as the event stream of its
originator id; ``MagnetarApplicationRecorder`` adds the application sequence (notification id =
offset + 1, read by offset ranges as Arrow columns (``records.notifications_of``), a sequential
reader's pages read in windows, the next asked for ahead (``NotificationReadAhead``), followed
live by ``MagnetarSubscription``);
``MagnetarTrackingRecorder`` keeps each upstream application's tracking records as the stream of
a tracking key; ``MagnetarProcessRecorder`` writes tracking records and events in one request.

Invariants: an insert is one PIP-64 request, so its events (and tracking record) are stored
together or not at all. Each stream it touches is expected at the key version of the head it
checked ("the last originator version is below my first one", "the last tracked notification id
is below mine"), under the broker's offset lock, so a conflict is an ``IntegrityError`` with
nothing written, and a head that moved since it was read is read again and checked again
(``INSERT_ATTEMPTS_MAX``). The heads this recorder saw last are remembered (``HEADS_CACHED_MAX``
keys), so a write after a read costs one request; a stale one costs a 409 and a read. Every
request carries a producer name (one per recorder and thread) and a sequence id that is never
used twice, whatever the request's outcome: when the client sends a request again after its
answer timed out (``Client.request`` does), the broker's deduplication answers the resend with
the first attempt's results, so an insert that was stored is reported stored, never as the
conflict its own first attempt would make it. Notification ids increase in the order readers see
them: offsets are assigned under one lock and read only below the last confirmed entry. The
topic must not be partitioned: the first write or range read of a recorder checks it
(``ProgrammingError``).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol
from uuid import UUID, uuid4

import httpx
import pyarrow as pa
from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    DataError,
    IntegrityError,
    Notification,
    OperationalError,
    ProcessRecorder,
    ProgrammingError,
    StoredEvent,
    Subscription,
    Tracking,
    TrackingRecorder,
)

from consumers.client import Client, ClientError, HttpError, KeyVersionMismatch, Message, PendingGet, Topic
from consumers.eventsourcing.records import (
    ARROW_POOL,
    NEW_STREAM,
    Head,
    check_increasing,
    event_message,
    head_of,
    last_notification_offset,
    notifications_of,
    originator_key,
    persistence_error,
    stored_event_of_message,
    tracking_key,
    tracking_message,
)
from consumers.eventsourcing.subscription import MagnetarSubscription

INSERT_ATTEMPTS_MAX = 16
"""How often one insert re-reads heads that other writers moved before it gives up."""
HEADS_CACHED_MAX = 10_000
STREAM_PAGE_MESSAGES = 1000
NOTIFICATION_PAGE_MESSAGES_MAX = 10_000
WINDOW_PAGES = 4
"""A sequential notification reader's range reads take this many of its pages at once
(``NotificationReadAhead``)."""
WINDOW_AGE_S_MAX = 1.0
"""How long after it was asked for a window answers selects (as the broker keeps a new entry
in its cache: ``managedLedgerCacheEvictionTimeThresholdMillis``)."""
NOT_FOUND_CODES = frozenset({"topic_not_found", "not_found"})
ARROW_ACCEPT = {"accept": "application/vnd.apache.arrow.stream"}
"""The range reads' answer as Arrow IPC (``api/rest_read.py``): columns the recorder selects and
converts at C speed, instead of JSON with base64 payloads to decode message by message."""
NEXT_OFFSET_HEADER = "X-Magnetar-Next-Offset"
NO_ROWS = pa.table({})
"""What a range read of a topic not created yet gives."""
OFFSET_END = 2**63 - 1


class _Heads:
    """The heads this recorder saw last, most recent first out of a bounded LRU."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._heads: OrderedDict[str, Head] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Head | None:
        with self._lock:
            head = self._heads.get(key)
            if head is not None:
                self._heads.move_to_end(key)
            return head

    def put(self, key: str, head: Head) -> None:
        with self._lock:
            self._heads[key] = head
            self._heads.move_to_end(key)
            while len(self._heads) > self._capacity:
                self._heads.popitem(last=False)


class _Producer(threading.local):
    """This thread's producer name and next sequence id for one recorder's requests (a thread's
    requests are sent one after another, so a resend is always of its producer's last entry)."""

    def __init__(self) -> None:
        self.name = f"eventsourcing-{uuid4().hex}"
        self.next_sequence_id = 0

    def stamp(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The body fields that name this producer and give ``messages`` (a PIP-64 request's)
        sequence ids never handed out again, whatever the request's outcome."""
        first, self.next_sequence_id = self.next_sequence_id, self.next_sequence_id + len(messages)
        return {"producerName": self.name, "messages": [{**messages[0], "sequenceId": first}, *messages[1:]]}


@dataclass
class ReadAheadStats:
    windows_read: int = 0
    """Windows read when they were wanted (a sequential reader's first, or after one dropped)."""
    windows_read_ahead: int = 0
    """Windows asked for ahead, while the caller decoded the pages of the one before."""
    windows_taken: int = 0
    """Windows asked for ahead that a select then used."""
    windows_dropped: int = 0
    """Windows asked for ahead and not used: the next select read elsewhere, or the answer was
    empty or failed (read again)."""
    pages_from_windows: int = 0
    """Page reads a window held already (no request)."""


class PendingRows(Protocol):
    """A range read sent to the broker whose answer is read when it is wanted."""

    def result(self) -> tuple[pa.Table, int]:
        """The rows and the offset after them (read once; raises what the read raised)."""
        ...

    def drop(self) -> None:
        """Forget the read, unread."""


@dataclass(eq=False)
class _Window:
    """Rows of consecutive offsets ``first..next_offset - 1`` read in one request (``asked``
    rows were asked for, at ``asked_at_s``), and their notifications once a page needed them."""

    first: int
    rows: pa.Table
    next_offset: int
    asked: int
    asked_at_s: float
    notifications: list[Notification] | None = None
    """Every notification of the rows, made at the first page taken (None: not yet)."""
    per_page: bool = False
    """A row could not be made a notification (no stored event, a version that is no number, a
    key marked a UUID that is none): each page is made on its own, so the page that holds it
    raises (a select that stops before it does not)."""

    def covers(self, offset: int) -> bool:
        return self.first <= offset < self.next_offset

    def page(self, offset: int, count: int, topics: frozenset[str]) -> tuple[list[Notification], int]:
        """The notifications of rows ``offset..offset + count - 1`` (of ``topics``; empty: any)
        and the offset after the rows. Without topics, the window's rows are made into
        notifications once, at its first page, and pages are cut from them: the Arrow kernels
        a page runs cost the same for 2,000 rows as for 500."""
        length = max(0, min(count, self.next_offset - offset))  # (a table of no columns slices to any length)
        end = offset + length
        if not topics and not self.per_page:
            if self.notifications is None:
                try:
                    self.notifications = notifications_of(self.rows, frozenset(), self.rows.num_rows)
                except (DataError, ValueError):  # pyarrow's ArrowInvalid (a version not a number) among them
                    self.per_page = True
            made = self.notifications
            if made is not None:  # ids are offsets + 1, increasing
                return made[bisect.bisect_left(made, offset + 1, key=_ID):
                            bisect.bisect_left(made, end + 1, key=_ID)], end
        return notifications_of(self.rows.slice(offset - self.first, length), topics, length), end


_ID = operator.attrgetter("id")


class _Ahead(NamedTuple):
    """A window asked for ahead: from ``first``, ``asked`` rows, at ``asked_at_s``."""

    first: int
    asked: int
    pending: PendingRows
    asked_at_s: float


class NotificationReadAhead:
    """Windows of a sequential notification reader's pages, the next asked for while its
    caller decodes this one.

    A ``select_notifications`` that starts at the first notification or where the one before it
    ended reads in windows of ``window_pages`` of its pages (at most
    ``NOTIFICATION_PAGE_MESSAGES_MAX`` rows): one request for several pages, as a Kafka
    consumer fetches more than one poll takes. When a window arrives full, the next one is
    asked for at once, from the caller's thread (no thread of the client's waits on the
    interpreter's lock to send it), so the broker reads it while the caller decodes the pages
    of this one; a select that reads elsewhere drops both. One window is kept and one is ahead
    at most. A window's rows become notifications once, at its first page (a select of some
    topics makes its pages' own), and its pages are cut from them. Rows below a read's next
    offset do not change while the topic lives (offsets are assigned once and read only below
    the last confirmed entry), so a window says what a read then said, up to its end; the caller
    reads on from there, and an empty or failed window is read again rather than trusted. A
    window answers for ``WINDOW_AGE_S_MAX`` after it was asked for, no longer: a select may
    answer as a read up to that long before it would have (what it returns existed then; rows
    that retention removed, or of a topic deleted and created again, in that time among them).
    """

    def __init__(self, read: Callable[[int, int], tuple[pa.Table, int]],
                 send: Callable[[int, int], PendingRows], window_pages: int = WINDOW_PAGES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._send = read, send
        self._window_pages = window_pages
        self._clock = clock
        self._lock = threading.Lock()
        self._window: _Window | None = None
        self._ahead: _Ahead | None = None
        self._last_end: int | None = None
        self._stats = ReadAheadStats()

    def sequential(self, first: int) -> bool:
        """Whether a select from ``first`` reads on sequentially: it starts at the first
        notification (a catch-up from the start: a projection rebuilt, a follower's first pull)
        or where the last select ended."""
        with self._lock:
            return first in (0, self._last_end)

    def read(self, offset: int, count: int, *, ahead: bool,
             topics: frozenset[str] = frozenset()) -> tuple[list[Notification], int]:
        """The notifications (of ``topics``; empty: any) among up to ``count`` rows from
        ``offset`` on, and the offset after those rows: with ``ahead``, out of a window (the one
        kept, the one asked for ahead, or one read now); else read as asked, and the windows are
        forgotten."""
        if not ahead:
            self._forget()
            rows, next_offset = self._read(offset, count)
            return notifications_of(rows, topics, rows.num_rows), next_offset
        now_s = self._clock()
        with self._lock:
            window = self._window
            kept = window is not None and window.covers(offset) and now_s - window.asked_at_s <= WINDOW_AGE_S_MAX
            if kept:
                self._stats.pages_from_windows += 1
        if kept and window is not None:
            return window.page(offset, count, topics)
        window = self._taken(offset, now_s)
        window_rows = min(NOTIFICATION_PAGE_MESSAGES_MAX, count * self._window_pages)
        if window is None:
            window = _Window(offset, *self._read(offset, window_rows), window_rows, now_s)
            with self._lock:
                self._stats.windows_read += 1
        next_window = None
        if window.rows.num_rows >= window.asked:  # full: the next one is asked for now
            next_window = _Ahead(window.next_offset, window_rows, self._send(window.next_offset, window_rows),
                                 self._clock())
        with self._lock:
            self._window = window if window.rows.num_rows else None
            dropped, self._ahead = self._ahead, next_window
            self._stats.windows_read_ahead += next_window is not None
            self._stats.windows_dropped += dropped is not None
        if dropped is not None:  # another thread's, asked for meanwhile
            dropped.pending.drop()
        return window.page(offset, count, topics)

    def ended(self, end: int) -> None:
        """A select ended its reads before ``end``."""
        with self._lock:
            self._last_end = end

    def settle(self) -> None:
        """Read the answer of the window asked for ahead, if any, now (kept for its select)."""
        with self._lock:
            ahead = self._ahead
        if ahead is not None:
            with contextlib.suppress(Exception):
                ahead.pending.result()

    def statistics(self) -> ReadAheadStats:
        with self._lock:
            return dataclasses.replace(self._stats)

    def _taken(self, offset: int, now_s: float) -> _Window | None:
        """The window asked for ahead when it starts at ``offset``, holds rows and is young
        enough (the kept one is let go either way; any other is dropped)."""
        with self._lock:
            ahead, self._ahead, self._window = self._ahead, None, None
        if ahead is None:
            return None
        window = None
        if ahead.first == offset and now_s - ahead.asked_at_s <= WINDOW_AGE_S_MAX:
            try:
                rows, next_offset = ahead.pending.result()
            except Exception:  # whatever it was, a read now says what holds now
                rows, next_offset = NO_ROWS, offset
            if rows.num_rows:  # an empty one: the end then may not be the end now
                window = _Window(offset, rows, next_offset, ahead.asked, ahead.asked_at_s)
        else:
            ahead.pending.drop()
        with self._lock:
            if window is None:
                self._stats.windows_dropped += 1
            else:
                self._stats.windows_taken += 1
        return window

    def _forget(self) -> None:
        with self._lock:
            ahead, self._ahead, self._window = self._ahead, None, None
            self._stats.windows_dropped += ahead is not None
        if ahead is not None:
            ahead.pending.drop()


class _PendingRangeRead:
    """A range read sent with ``Client.send_get``, its Arrow answer read by ``result``."""

    def __init__(self, pending: PendingGet, offset: int) -> None:
        self._pending, self._offset = pending, offset
        self._result: tuple[pa.Table, int] | None = None
        self._failure: Exception | None = None

    def result(self) -> tuple[pa.Table, int]:
        if self._result is None and self._failure is None:
            try:
                self._result = _rows_of(self._pending.answer(), self._offset)
            except Exception as exc:
                self._failure = exc
        if self._failure is not None:
            raise self._failure
        assert self._result is not None
        return self._result

    def drop(self) -> None:
        self._pending.drop()


def _rows_of(response: httpx.Response, offset: int) -> tuple[pa.Table, int]:
    """The rows of a range read's Arrow answer and the offset to read next."""
    return (pa.ipc.open_stream(response.content, memory_pool=ARROW_POOL).read_all(),
            int(response.headers[NEXT_OFFSET_HEADER]))


class MagnetarRecorder:
    """The stream operations every recorder shares: conditional inserts and stream reads."""

    def __init__(self, client: Client, topic: str) -> None:
        self.client = client
        self.topic = Topic.parse(topic).full_name
        self._path = f"/topics/{Topic.parse(topic).path}"
        self._heads = _Heads(HEADS_CACHED_MAX)
        self._producer = _Producer()
        self._checked_unpartitioned = False
        self._range_read_url: httpx.URL | None = None
        """The URL that answered the last range read (its broker is where reads ahead go)."""

    def _check_unpartitioned(self) -> None:
        """Refuse a partitioned topic (its offsets are per partition: no total order), once per
        recorder; a topic that does not exist yet is created unpartitioned by the first append."""
        if self._checked_unpartitioned:
            return
        try:
            answer = self.client.request("GET", f"{self._path}/offsets").json()
        except HttpError as exc:
            if exc.status == 404 and exc.code in NOT_FOUND_CODES:
                return
            raise persistence_error(exc) from exc
        except ClientError as exc:
            raise persistence_error(exc) from exc
        if int(answer.get("partitions") or 0) > 0:
            raise ProgrammingError(f"{self.topic} is partitioned: a recorder needs one partition's total order")
        self._checked_unpartitioned = True

    def _insert(self, events: Sequence[StoredEvent], tracking: Tracking | None) -> list[int]:
        """Append ``events`` (and ``tracking``) in one request; their offsets (events only)."""
        first, last = _values_by_key(events, tracking)
        self._check_unpartitioned()
        messages = [event_message(e) for e in events] + ([tracking_message(tracking)] if tracking else [])
        heads = {key: self._heads.get(key) or NEW_STREAM for key in first}
        for _ in range(INSERT_ATTEMPTS_MAX):
            _check_heads(heads, first)
            body = {**self._producer.stamp(messages), "payloadEncoding": "base64",
                    "expectedKeyVersions": {key: head.key_version for key, head in heads.items()}}
            try:
                answer = self.client.request("POST", self._path, json_body=body).json()
            except HttpError as exc:
                if exc.code != KeyVersionMismatch.code:
                    raise persistence_error(exc) from exc
                heads = self._reread(heads, exc.details.get("currentKeyVersions") or {})
                continue
            except ClientError as exc:
                raise persistence_error(exc) from exc
            return self._stored(answer["messagePublishResults"], messages, last, len(events))
        raise OperationalError(f"insert into {self.topic}: the streams kept moving ({INSERT_ATTEMPTS_MAX} attempts)")

    def _stored(self, results: list[dict[str, Any]], messages: list[dict[str, Any]], last: dict[str, int],
                event_count: int) -> list[int]:
        if any(r.get("offset") is None or r.get("keyVersion") is None for r in results):
            raise OperationalError(f"insert into {self.topic}: stored by an earlier attempt whose answer was lost, "
                                   "and the broker no longer has its results")
        for message, result in zip(messages, results, strict=True):
            key = message["key"]
            self._heads.put(key, Head(int(result["keyVersion"]), last[key]))
        return [int(r["offset"]) for r in results[:event_count]]

    def _reread(self, heads: dict[str, Head], current: dict[str, Any]) -> dict[str, Head]:
        """The heads after a 409: the streams that moved are read again."""
        return {key: self._read_head(key) if key not in current or int(current[key]) != head.key_version else head
                for key, head in heads.items()}

    def _read_head(self, key: str) -> Head:
        page = self._read_stream(key, None, 1, backward=True)
        head = head_of(page[0]) if page else NEW_STREAM
        self._heads.put(key, head)
        return head

    def _read_stream(self, key: str, from_version: int | None, count: int, *, backward: bool) -> list[Message]:
        """Up to ``count`` messages of the stream of ``key`` (fewer when the answer's byte bound
        cuts it: an empty list only at the stream's end)."""
        return self._read_page(key, from_version, count, backward=backward)[0]

    def _read_page(self, key: str, from_version: int | None, count: int, *,
                   backward: bool) -> tuple[list[Message], int, int]:
        """A page of the stream of ``key`` with the stream's last and first kept version (-1, 0
        for a stream without events)."""
        try:
            batch = self.client.read_stream(self.topic, key, from_version=from_version, max_messages=count,
                                            backward=backward)
        except HttpError as exc:
            if exc.status == 404 and exc.code in NOT_FOUND_CODES:
                return [], -1, 0
            raise persistence_error(exc) from exc
        except ClientError as exc:
            raise persistence_error(exc) from exc
        return batch.messages, batch.version, batch.first_version

    def _read_range(self, offset: int, count: int) -> tuple[list[dict[str, Any]], int]:
        """Up to ``count`` messages from ``offset`` on (JSON), and the offset to read next."""
        self._check_unpartitioned()
        try:
            answer = self.client.request("GET", f"{self._path}/messages",
                                         params={"offset": offset, "maxMessages": max(1, count)}).json()
        except HttpError as exc:
            if exc.status == 404 and exc.code in NOT_FOUND_CODES:
                return [], offset
            raise persistence_error(exc) from exc
        except ClientError as exc:
            raise persistence_error(exc) from exc
        return list(answer["messages"]), int(answer["nextOffset"])

    def _read_rows(self, offset: int, count: int) -> tuple[pa.Table, int]:
        """Up to ``count`` messages from ``offset`` on as Arrow rows (the broker's Arrow answer,
        decoded column by column, no JSON or base64 on either side), and the offset to read next."""
        self._check_unpartitioned()
        try:
            response = self.client.request("GET", f"{self._path}/messages", headers=ARROW_ACCEPT,
                                           params={"offset": offset, "maxMessages": max(1, count)})
        except HttpError as exc:
            if exc.status == 404 and exc.code in NOT_FOUND_CODES:
                return NO_ROWS, offset
            raise persistence_error(exc) from exc
        except ClientError as exc:
            raise persistence_error(exc) from exc
        self._range_read_url = response.url
        return _rows_of(response, offset)

    def _send_read_rows(self, offset: int, count: int) -> PendingRows:
        """:meth:`_read_rows` sent now to the broker that answered the last one (the topic's
        owner, in a cluster), its answer read later (an error then is read again the usual way
        by the read-ahead's caller)."""
        pending = self.client.send_get(f"{self._path}/messages", headers=ARROW_ACCEPT, broker=self._range_read_url,
                                       params={"offset": offset, "maxMessages": max(1, count)})
        return _PendingRangeRead(pending, offset)

    def _offsets(self) -> tuple[int, int]:
        """The topic's first retained offset and the next offset it will assign."""
        try:
            answer = self.client.request("GET", f"{self._path}/offsets").json()
        except HttpError as exc:
            if exc.status == 404 and exc.code in NOT_FOUND_CODES:
                return 0, 0
            raise persistence_error(exc) from exc
        except ClientError as exc:
            raise persistence_error(exc) from exc
        partitions = list(answer["offsets"].values())
        if not partitions:
            return 0, 0
        return int(partitions[0]["first"]), int(partitions[0]["next"])

    def _pages(self, key: str, *, backward: bool) -> Iterator[Message]:
        """The stream of ``key`` message by message, read a page at a time until its end: the
        stream's last version read forward (as the page that holds it says), its first kept
        version read backward, or an empty page."""
        version: int | None = None
        while True:
            page, last_version, first_version = self._read_page(key, version, STREAM_PAGE_MESSAGES,
                                                                backward=backward)
            if not page:
                return
            if version is None and backward:
                self._heads.put(key, head_of(page[0]))
            yield from page
            last = page[-1].key_version
            assert last is not None
            if (last >= last_version) if not backward else (last <= first_version):
                return
            version = last - 1 if backward else last + 1


def _values_by_key(events: Sequence[StoredEvent], tracking: Tracking | None) -> tuple[dict[str, int], dict[str, int]]:
    """Each stream's first and last new value (originator version, tracked id), checked to increase."""
    values: dict[str, list[int]] = {}
    for event in events:
        values.setdefault(originator_key(event.originator_id), []).append(event.originator_version)
    if tracking is not None:
        values[tracking_key(tracking.application_name)] = [tracking.notification_id]
    for key, sequence in values.items():
        check_increasing(sequence, f"stream {key!r}")
    return {k: v[0] for k, v in values.items()}, {k: v[-1] for k, v in values.items()}


def _check_heads(heads: dict[str, Head], first: dict[str, int]) -> None:
    for key, head in heads.items():
        if head.value is not None and first[key] <= head.value:
            raise IntegrityError(f"stream {key!r} already holds {head.value}; {first[key]} would not follow it")


class MagnetarAggregateRecorder(MagnetarRecorder, AggregateRecorder):
    """Aggregate events (or snapshots) as the event streams of their originators."""

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        if stored_events:
            self._insert(stored_events, None)
        return None

    def select_events(self, originator_id: UUID | str, *, gt: int | None = None, lte: int | None = None,
                      desc: bool = False, limit: int | None = None) -> Sequence[StoredEvent]:
        key = originator_key(originator_id)
        if desc or gt is not None:  # from the newest down: after a snapshot, only the last few are read
            found = self._select_backward(key, gt, lte, limit if desc else None)
            if not desc:
                found.reverse()
        else:
            found = self._select_forward(key, lte, limit)
        return found[:limit] if limit is not None else found

    def _select_backward(self, key: str, gt: int | None, lte: int | None, limit: int | None) -> list[StoredEvent]:
        found: list[StoredEvent] = []
        for message in self._pages(key, backward=True):
            event = stored_event_of_message(message)
            if gt is not None and event.originator_version <= gt:
                break
            if lte is None or event.originator_version <= lte:
                found.append(event)
                if limit is not None and len(found) >= limit:
                    break
        return found

    def _select_forward(self, key: str, lte: int | None, limit: int | None) -> list[StoredEvent]:
        found: list[StoredEvent] = []
        for message in self._pages(key, backward=False):
            event = stored_event_of_message(message)
            if lte is not None and event.originator_version > lte:
                break
            found.append(event)
            if limit is not None and len(found) >= limit:
                break
        return found


class MagnetarApplicationRecorder(MagnetarAggregateRecorder, ApplicationRecorder):
    """Aggregate events plus the application sequence: the topic's offsets."""

    def __init__(self, client: Client, topic: str) -> None:
        super().__init__(client, topic)
        self.read_ahead = NotificationReadAhead(self._read_rows, self._send_read_rows)

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        if not stored_events:
            return None
        return [offset + 1 for offset in self._insert(stored_events, None)]

    def select_notifications(self, start: int | None, limit: int, stop: int | None = None,
                             topics: Sequence[str] = (), *, inclusive_of_start: bool = True) -> Sequence[Notification]:
        offset = 0 if start is None else max(0, start - 1 if inclusive_of_start else start)
        end = OFFSET_END if stop is None else stop  # notification id = offset + 1 <= stop
        wanted = frozenset(topics)
        found: list[Notification] = []
        ahead = self.read_ahead.sequential(offset)
        while len(found) < limit and offset < end:
            page, next_offset = self.read_ahead.read(
                offset, min(NOTIFICATION_PAGE_MESSAGES_MAX, limit - len(found), end - offset), ahead=ahead,
                topics=wanted)
            if next_offset <= offset:  # no rows
                break
            found += page
            offset = next_offset
        self.read_ahead.ended(offset)
        return found

    def max_notification_id(self) -> int | None:
        first, end = self._offsets()
        while end > first:
            start = max(first, end - STREAM_PAGE_MESSAGES)
            last = self._last_notification_between(start, end)
            if last is not None:
                return last + 1
            end = start
        return None

    def _last_notification_between(self, start: int, end: int) -> int | None:
        """The offset of the last notification in ``[start, end)``, read in as many range reads
        as the rows' bytes take."""
        last, offset = None, start
        while offset < end:
            rows, offset = self._read_rows(offset, end - offset)
            if not rows.num_rows:
                break
            found = last_notification_offset(rows)
            last = last if found is None else found
        return last

    def subscribe(self, gt: int | None = None, topics: Sequence[str] = ()) -> Subscription[ApplicationRecorder]:
        return MagnetarSubscription(self, self.client, self.topic, gt=gt, topics=topics)


class MagnetarTrackingRecorder(MagnetarRecorder, TrackingRecorder):
    """Tracking records: each upstream application's notification ids as one stream."""

    def insert_tracking(self, tracking: Tracking) -> None:
        self._insert([], tracking)

    def max_tracking_id(self, application_name: str) -> int | None:
        return self._read_head(tracking_key(application_name)).value


class MagnetarProcessRecorder(MagnetarTrackingRecorder, MagnetarApplicationRecorder, ProcessRecorder):
    """Events and the tracking record of the notification that caused them, in one request."""

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        tracking: Tracking | None = kwargs.get("tracking")
        if not stored_events and tracking is None:
            return None
        return [offset + 1 for offset in self._insert(stored_events, tracking)]
