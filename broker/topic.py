"""PersistentTopic: publishing into one topic partition, over its managed ledger and cursors.

Append path (the one every transport takes; ``broker/entry_builder.py`` names the whole chain):
a group of prepared entries (a single message is a group of one) → under the publish lock, for
each entry: the size bound, its sequence ids (the producer's next when it gave none, encoded
then), one *reservation* of its producer's sequence id (``broker/dedup.py``) and of its keys'
next versions (``broker/key_index/``) → ``ManagedLedger.append`` of the whole group (one
journal write, one future; optionally conditional on ``expected_offset`` and, under the offset
lock, on ``expected_key_versions``) → each entry's ``PublishResult`` with its Pulsar
``MessageId``, gap-free offsets and key versions, or the refusal of that entry alone (too
large, sequence ids out of range, a duplicate still being stored). The reservation commits when
the group is durable and is undone, entry by entry, when nothing was written or the store failed.

Every publish counts against the topic's publish rate (``quotas``, ``broker/quotas.py``): it is
never refused for it; the transport asks ``quotas.publish_delay_s`` how long to stop reading.

Invariants: a duplicate (producer name, sequence id) is acknowledged but never stored twice,
also across restarts (a conditional one answers its first publish's results when it resends
the producer's last entry); a refused conditional append writes nothing; an entry larger than
``message_size_bytes_max`` is refused before anything is written; a chunk other than the last
of its message claims no sequence id (its last chunk does).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from broker.cursor import CursorManager
from broker.dedup import Deduplication, DedupStatus
from broker.entry import Entry
from broker.entry_builder import SEQUENCE_ID_MAX, PreparedEntry
from broker.entry_format import decode_entry
from broker.errors import DataLost, DuplicateInFlight, InvalidRequest, MagnetarError
from broker.key_index import KeyReservation, PartitionKeys
from broker.key_index.derived import DcbCondition
from broker.limits import MESSAGE_SIZE_BYTES_MAX, REPLAY_BATCH_ENTRIES
from broker.managed_ledger import ManagedLedger
from broker.managed_ledger_adds import AddResult
from broker.message_fields import ExpectedVersion
from broker.message_id import MessageId, Position, message_ids_of_entry
from broker.metadata.store import MetadataStore
from broker.quotas import TopicQuotas
from broker.topic_name import TopicName
from storage import new_future


@dataclass(slots=True)
class PublishResult:
    """Where a publish went: ``count`` messages in the entry at ``position`` of partition
    ``partition``, with offsets from ``first_offset`` on. A duplicate stored nothing (``count``
    0). Ids and offsets are built when asked for: a 1000-message REST request needs none.
    Not frozen (a frozen dataclass costs a microsecond more per message to build); treat it as
    a value: nothing changes one after its publish completed."""

    position: Position
    partition: int
    first_offset: int
    count: int
    publish_time_ms: int
    duplicate: bool = False
    key_versions: tuple[int | None, ...] = ()
    """Each message's version in its key's stream (None: no key); empty when none has a key."""

    @property
    def message_ids(self) -> tuple[MessageId, ...]:
        return message_ids_of(self.position, self.partition, self.count) if self.count else ()

    def message_id_texts(self) -> list[str]:
        """Pulsar's base64 ids of the messages (``message_ids`` as ``to_base64`` writes them),
        built from the entry's serialized position once."""
        if not self.count:
            return []
        position = self.position
        return [b.decode("ascii") for b in message_ids_of_entry(position.ledger_id, position.entry_id,
                                                                self.partition, self.count)]

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(range(self.first_offset, self.first_offset + self.count))


def message_ids_of(position: Position, partition: int, count: int) -> tuple[MessageId, ...]:
    """Pulsar's ids for the messages of one entry: a lone message has no batch index."""
    if count == 1:
        return (MessageId(position.ledger_id, position.entry_id, partition, -1),)
    return tuple(MessageId(position.ledger_id, position.entry_id, partition, i) for i in range(count))


_Outcome = PublishResult | MagnetarError
"""One entry's answer: where it went (a duplicate too), or why it alone was refused."""


class _Reservation:
    """What one append took before anything was written: each written entry's claim of its
    producer's sequence ids (deduplication) and its keys' versions (the key index). Committed
    once the group is durable; undone when nothing was written or the store failed."""

    __slots__ = ("claims", "dedup", "keys", "producer")

    def __init__(self, dedup: Deduplication | None, producer: str) -> None:
        self.dedup = dedup
        self.producer = producer
        self.claims: list[tuple[int, int] | None] = []
        """Per written entry, the (first, highest) sequence ids it claimed; None: none."""
        self.keys: list[KeyReservation | None] = []
        """Per written entry, its key reservation (None: nothing to number)."""

    def withdraw_claim(self) -> None:
        """The last claim's entry is not written after all (its encoding failed)."""
        claim = self.claims.pop()
        if claim is not None and self.dedup is not None:
            self.dedup.rollback(self.producer, claim[1], claim[0] - 1)

    def abort(self) -> None:
        """Nothing of the group was written: every claim and key version is given back."""
        for keys in self.keys:
            if keys is not None:
                keys.failed()
        if self.dedup is not None:
            for claim in reversed(self.claims):
                if claim is not None:
                    self.dedup.rollback(self.producer, claim[1], claim[0] - 1)

    def store_failed(self) -> None:
        """The group's store failed: its key versions are withdrawn and the producer's reserved
        sequence ids released (Pulsar's ``resetHighestSequenceIdPushed``): its resends are new
        again, not duplicates in flight. A failed add fails every later one of the ledger, so
        nothing after it was stored."""
        for keys in self.keys:
            if keys is not None:
                keys.failed()
        if self.dedup is not None:
            self.dedup.reset_pushed(self.producer)

    def commit(self, adds: Sequence[AddResult]) -> None:
        """The group is durable: its keys' versions become visible, its last claim persisted."""
        for keys, add in zip(self.keys, adds, strict=True):
            if keys is not None:
                keys.confirmed(add.position)
        if self.dedup is None:
            return
        claimed = [(claim, add) for claim, add in zip(self.claims, adds, strict=True) if claim is not None]
        if claimed:
            (_, highest), add = claimed[-1]
            self.dedup.persisted(self.producer, highest, add.last_offset + 1, len(claimed))


class PersistentTopic:
    def __init__(self, name: TopicName, ml: ManagedLedger, cursors: CursorManager, store: MetadataStore, *,
                 dedup_enabled: bool = True, message_size_bytes_max: int = MESSAGE_SIZE_BYTES_MAX,
                 clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self.ml = ml
        self.cursors = cursors
        self._clock = clock
        self._message_size_bytes_max = message_size_bytes_max
        self._publish_lock = threading.Lock()
        self._rates_in = (0.0, 0.0)  # messages/s, bytes/s over the last maintenance interval
        opened = ml.statistics()
        self._rate_in_base = (clock(), opened.messages_added, opened.bytes_added)
        self.streams: PartitionKeys | None = None
        """The partition's event streams (``broker/key_index/``), set by the service."""
        self.quotas = TopicQuotas(name.full_name, clock)
        """Its producer and consumer counts, limits and rate limiters (``broker/quotas.py``),
        whose limits the service sets; every publish here counts against its publish rate."""
        self.dedup: Deduplication | None = None
        if dedup_enabled:
            self.dedup = Deduplication(store, f"/managed-ledgers/{ml.name}/dedup")
            self.dedup.load(self._replay_sequence_ids)

    @property
    def partition(self) -> int:
        return self.name.partition_index

    # --- publishing ----------------------------------------------------------------------
    def append(self, entries: Sequence[PreparedEntry], *, producer_name: str, expected_offset: int | None = None,
               expected_key_versions: Mapping[str, ExpectedVersion] | None = None,
               dcb_condition: DcbCondition | None = None) -> Future[list[_Outcome]]:
        """Append a group of entries (``broker/entry_builder.py``; a single message is a group
        of one) with one managed-ledger call and one Future, whose list holds, in order, each
        entry's result or the refusal of that entry alone; a failure to store fails the Future.
        A refusal of the whole group raises before anything is written: the conditions
        (``expected_offset``: the group's first offset; ``expected_key_versions``: what its
        keys' streams must be at; ``dcb_condition``: no event matching its query after its
        position, ``broker/dcb.py``), or the managed ledger's (terminated, not served here).

        Deduplication keys on each entry's highest sequence id: a repeat of one stored is
        acknowledged as a duplicate (with its first results when the append is conditional and
        it resends the producer's last entry), a repeat of one still being stored is refused."""
        if not entries:
            raise InvalidRequest("an append needs at least one entry")
        outcomes: list[_Outcome | None] = [None] * len(entries)
        written: list[int] = []  # positions of the entries that are written
        datas: list[bytes] = []
        counts: list[int] = []
        reservation = _Reservation(self.dedup, producer_name)
        conditional = expected_key_versions is not None or expected_offset is not None or dcb_condition is not None
        if self.streams is not None:  # read the keys' stored heads now, not under the offset lock
            self.streams.prefetch_heads(itertools.chain(
                expected_key_versions or (), (key for entry in entries for key in entry.keys),
                (key for entry in entries for derived in entry.dcb for key in derived)))
        with self._publish_lock:  # reservations and append order must agree
            publish_ms = int(self._clock() * 1000)
            try:
                for position, entry in enumerate(entries):
                    outcome = self._reserve(entry, reservation, producer_name, conditional)
                    if outcome is not None:
                        outcomes[position] = outcome
                        continue
                    try:
                        claim = reservation.claims[-1]
                        first = claim[0] if claim is not None else entry.sequence_id or 0
                        datas.append(entry.encoded(producer_name, first, publish_ms))
                    except MagnetarError as exc:
                        outcomes[position] = exc
                        reservation.withdraw_claim()
                        continue
                    written.append(position)
                    counts.append(entry.message_count)
                    lead = len(written) == 1  # the conditions are the group's first entry's
                    reservation.keys.append(self._key_reservation(
                        entry, expected_key_versions if lead else None, dcb_condition if lead else None))
                if datas:
                    added = self.ml.append(datas, counts, expected_offset=expected_offset, on_offsets=reservation.keys)
                    if self.quotas.publish is not None:
                        self.quotas.published(sum(counts), sum(map(len, datas)))
            except BaseException:
                reservation.abort()
                raise
        result: Future[list[_Outcome]] = new_future()
        if not datas:
            result.set_result(outcomes)  # type: ignore[arg-type]  # every position is filled
        else:
            added.add_done_callback(lambda f: self._appended(f, result, reservation, outcomes, written))
        return result

    def _reserve(self, entry: PreparedEntry, reservation: _Reservation, producer: str,
                 conditional: bool) -> _Outcome | None:
        """(Under the publish lock.) Claim the entry's sequence ids, or its answer without
        storing it: a refusal, or a duplicate's acknowledgement."""
        refusal = entry.refusal(self._message_size_bytes_max)
        if refusal is not None:
            return refusal
        first = entry.sequence_id
        if first is None:
            first = (self.dedup.pushed_sequence_id(producer) if self.dedup is not None else -1) + 1
        highest = entry.highest_sequence_id
        if highest is None:
            highest = first + entry.message_count - 1
        if not 0 <= first <= highest <= SEQUENCE_ID_MAX:
            return InvalidRequest(f"sequence ids must lie in 0..{SEQUENCE_ID_MAX}, not {first}..{highest}")
        dedup = self.dedup
        if dedup is not None and (not entry.partial_chunk or highest <= dedup.pushed_sequence_id(producer)):
            status = dedup.check(producer, highest)
            if status is DedupStatus.IN_FLIGHT:
                return DuplicateInFlight(f"sequence id {highest} of {producer} is still being stored; retry")
            if status is DedupStatus.DUPLICATE:
                original = self._original(producer, highest, entry.message_count) if conditional else None
                return original or PublishResult(Position(-1, -1), self.partition, -1, 0, 0, duplicate=True)
            assert not entry.partial_chunk  # a partial chunk at or below the reserved id is never new
            reservation.claims.append((first, highest))
        else:  # no deduplication, or a chunk before its message's last: it claims nothing
            reservation.claims.append(None if dedup is not None else (first, highest))
        return None

    def _key_reservation(self, entry: PreparedEntry, expected: Mapping[str, ExpectedVersion] | None,
                         condition: DcbCondition | None) -> KeyReservation | None:
        if self.streams is None:
            if expected is not None or condition is not None:
                raise InvalidRequest(f"{self.name} keeps no key index: its conditions cannot be checked")
            return None
        return self.streams.reservation_of_keys(entry.keys, expected, entry.dcb, condition)

    def _appended(self, added: Future[list[AddResult]], result: Future[list[_Outcome]], reservation: _Reservation,
                  outcomes: list[_Outcome | None], written: list[int]) -> None:
        """The group's store completed: each written entry's result takes its place."""
        error = added.exception()
        if error is not None:
            reservation.store_failed()
            result.set_exception(error)
            return
        adds = added.result()
        reservation.commit(adds)
        partition = self.partition
        for position, add, keys in zip(written, adds, reservation.keys, strict=True):
            outcomes[position] = PublishResult(add.position, partition, add.first_offset,
                                               add.last_offset - add.first_offset + 1, add.publish_time_ms,
                                               key_versions=keys.message_versions() if keys is not None else ())
        result.set_result(outcomes)  # type: ignore[arg-type]  # every position is filled

    def _original(self, producer: str, highest_seq: int, count: int) -> PublishResult | None:
        """The results of the producer's last entry, when ``highest_seq`` resends it."""
        end = self.dedup.last_entry_end(producer, highest_seq) if self.dedup is not None else None
        found = self.streams.entry_ending_at(end, count) if end is not None and self.streams is not None else None
        if found is None:
            return None
        position, first_offset, publish_ms, versions = found
        return PublishResult(position, self.partition, first_offset, count, publish_ms, duplicate=True,
                             key_versions=versions)

    def last_sequence_id(self, producer: str) -> int:
        return self.dedup.last_sequence_id(producer) if self.dedup is not None else -1

    # --- rates -------------------------------------------------------------------------
    def tick(self) -> None:
        """Update the publish rates from the managed ledger's counters (call periodically)."""
        now = self._clock()
        stats = self.ml.statistics()
        since, messages, size_bytes = self._rate_in_base
        elapsed_s = now - since
        if elapsed_s > 0:
            self._rates_in = ((stats.messages_added - messages) / elapsed_s,
                              (stats.bytes_added - size_bytes) / elapsed_s)
            self._rate_in_base = (now, stats.messages_added, stats.bytes_added)
            if self.quotas.limits.dispatch.relative_to_publish_rate:
                self.quotas.apply(self.quotas.limits, self._rates_in)

    def publish_rates(self) -> tuple[float, float]:
        """(messages/s, bytes/s) published over the last interval between two :meth:`tick` calls."""
        return self._rates_in

    # --- reading helpers -----------------------------------------------------------------
    def entries_from(self, offset: int, *, step_entries: int = REPLAY_BATCH_ENTRIES,
                     step_bytes: int = 5 * 1024 * 1024) -> Iterator[Entry]:
        """Every confirmed entry holding an offset ``>= offset``, in order: the entries of
        :meth:`entry_steps`, one at a time."""
        return itertools.chain.from_iterable(self.entry_steps(offset, step_entries=step_entries,
                                                              step_bytes=step_bytes))

    def entry_steps(self, offset: int, *, step_entries: int = REPLAY_BATCH_ENTRIES,
                    step_bytes: int = 5 * 1024 * 1024) -> Iterator[list[Entry]]:
        """Every confirmed entry holding an offset ``>= offset``, in order, read from the managed
        ledger ``step_entries`` (or about ``step_bytes``) at a time, a list a step (a reader that
        goes through them in C, ``itertools.chain``, resumes no generator an entry). Offsets have
        no gaps: a step that does not start where the last one ended (retention trimmed the
        ledger in between) is ``DataLost``, never a silent jump."""
        if offset < self.ml.first_offset:
            raise DataLost(f"offset {offset} of {self.name} was trimmed; first is {self.ml.first_offset}")
        if offset >= self.ml.confirmed_next_offset():
            return
        position, _ = self.ml.offset_to_position(offset)
        expected: int | None = None
        while True:
            entries = self.ml.read_entries(position, step_entries, max_bytes=step_bytes)
            if not entries:
                return
            if expected is not None and entries[0].first_offset != expected:
                raise DataLost(f"offset {expected} of {self.name} was trimmed while read; first is "
                               f"{self.ml.first_offset}")
            yield entries
            expected = entries[-1].last_offset + 1
            position = self.ml.next_position(entries[-1].position)

    def _replay_sequence_ids(self, from_offset: int) -> Iterator[tuple[str, int, int]]:
        start = max(from_offset, self.ml.first_offset)
        for entry in self.entries_from(start):
            decoded = decode_entry(entry.data)
            highest = decoded.highest_sequence_id
            if highest is None:
                highest = decoded.sequence_id + decoded.num_messages - 1
            yield decoded.producer_name, highest, entry.last_offset + 1

    def message_id_of_offset(self, offset: int) -> MessageId:
        position, index = self.ml.offset_to_position(offset)
        entry = self.ml.read_entry(position)
        return MessageId(position.ledger_id, position.entry_id, self.partition,
                         -1 if entry.message_count == 1 else index)

    def offset_of(self, message_id: MessageId) -> int:
        entry = self.ml.read_entry(message_id.position)
        return entry.first_offset + max(message_id.batch_index, 0)

    def close(self) -> None:
        if self.dedup is not None:
            self.dedup.snapshot(self.ml.confirmed_next_offset())
        self.cursors.close()
        self.ml.close()
