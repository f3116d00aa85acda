"""PersistentTopic: publishing into one topic partition, over its managed ledger and cursors.

Publish path: messages → producer dedup check (``broker/dedup.py``) → one Pulsar-format entry
(``encode_entry``: a batch, possibly compressed) → ``ManagedLedger.add_entry`` (optionally
conditional on ``expected_offset``; keyed messages get their stream versions from the key index,
``broker/key_index.py``, under the offset lock, conditional on ``expected_key_versions``) →
``PublishResult`` with a Pulsar ``MessageId``, the gap-free offset and the key version of every
message. Two grouped forms store many entries with one ``ManagedLedger.add_entries`` call (one
journal write, one future): ``publish_each`` (each message its own entry, encoded here: the
WebSocket front end) and ``publish_entries`` (entries a binary-protocol client encoded itself,
stored byte for byte); both answer each entry on its own (a refusal of one, a duplicate) and
deduplicate each as a single publish would.

Every publish counts against the topic's publish rate (``quotas``, ``broker/quotas.py``): it is
never refused for it; the transport asks ``quotas.publish_delay_s`` how long to stop reading.

Invariants: a duplicate (producer name, sequence id) is acknowledged but never stored twice,
also across restarts (a conditional one answers its first publish's results when it resends
the producer's last entry); a refused conditional append writes nothing; a message larger than
``message_size_bytes_max`` is refused before anything is written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from broker.cursor import CursorManager
from broker.dedup import Deduplication, DedupStatus
from broker.entry_format import Compression, Message, decode_entry, encode_entry, encode_single_entry
from broker.errors import DataLost, DuplicateInFlight, InvalidRequest, MagnetarError, MessageTooLarge
from broker.key_index import KeyReservation, PartitionKeys
from broker.managed_ledger import AddResult, Entry, ManagedLedger
from broker.message_fields import ExpectedVersion
from broker.message_id import MessageId, Position, message_ids_of_entry
from broker.metadata.store import MetadataStore
from broker.quotas import TopicQuotas
from broker.topic_name import TopicName
from storage import new_future

MESSAGE_SIZE_BYTES_MAX = 5 * 1024 * 1024
CLIENT_ENTRY_OVERHEAD_BYTES_MAX = 64 * 1024
"""What a client's own entry may hold beyond its messages' bytes (metadata, batch headers)."""
SEQUENCE_ID_MAX = 2**63 - 1  # Pulsar's sequence ids are signed 64-bit
REPLAY_BATCH_ENTRIES = 100


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


@dataclass(slots=True, eq=False)
class ClientEntrySend:
    """One entry a client encoded itself, as ``publish_entries`` stores it: the bytes (checked by
    ``check_client_entry``), how many messages they hold and each one's key, and the sequence
    ids the client gave it. Not frozen (built once per SEND, see ``PublishResult``); treat it
    as a value."""

    data: bytes
    message_count: int
    keys: tuple[str | None, ...]
    sequence_id: int
    highest_sequence_id: int
    partial_chunk: bool = False
    """A chunk other than the last of its message."""


def _client_entry_refusal(entry: ClientEntrySend, size_bytes_max: int) -> MagnetarError | None:
    """Why ``publish_entries`` refuses ``entry`` before storing anything, or None."""
    if len(entry.data) > size_bytes_max:
        return MessageTooLarge(f"entry of {len(entry.data)} bytes exceeds "
                               f"{size_bytes_max - CLIENT_ENTRY_OVERHEAD_BYTES_MAX} bytes")
    if not 0 <= entry.sequence_id <= entry.highest_sequence_id <= SEQUENCE_ID_MAX:
        return InvalidRequest(f"sequence ids must lie in 0..{SEQUENCE_ID_MAX} and the highest must not be below "
                              f"the first, not {entry.sequence_id}..{entry.highest_sequence_id}")
    return None


def _duplicate(partition: int) -> Future[PublishResult]:
    """The result of a publish deduplication dropped: nothing stored, id -1:-1."""
    done: Future[PublishResult] = new_future()
    done.set_result(PublishResult(Position(-1, -1), partition, -1, 0, 0, duplicate=True))
    return done


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
        """The partition's event streams (``broker/key_index.py``), set by the service."""
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
    def publish(self, messages: Sequence[Message], *, producer_name: str, sequence_id: int | None = None,
                compression: Compression = Compression.NONE, expected_offset: int | None = None,
                deliver_at_time_ms: int | None = None,
                expected_key_versions: Mapping[str, ExpectedVersion] | None = None) -> Future[PublishResult]:
        """Store ``messages`` as one entry. ``sequence_id`` is the first message's sequence id
        (the next ones follow); without it the producer's next sequence id is used."""
        if not messages:
            raise InvalidRequest("a publish needs at least one message")
        for message in messages:
            if len(message.payload) > self._message_size_bytes_max:
                raise MessageTooLarge(f"message of {len(message.payload)} bytes exceeds "
                                      f"{self._message_size_bytes_max} bytes")
        with self._publish_lock:  # dedup reservation and append order must agree
            first_seq = self._first_sequence_id(producer_name, sequence_id, messages)
            highest_seq = first_seq + len(messages) - 1
            if first_seq < 0 or highest_seq > SEQUENCE_ID_MAX:
                raise InvalidRequest(f"sequence ids must lie in 0..{SEQUENCE_ID_MAX}, not {first_seq}..{highest_seq}")
            duplicate = self._check_duplicate(producer_name, highest_seq, len(messages),
                                              conditional=expected_key_versions is not None)
            if duplicate is not None:
                return duplicate
            keys: KeyReservation | None = None
            try:  # nothing reserved for dedup may outlive a publish that wrote nothing
                keys = self._key_reservation(messages, expected_key_versions)
                # messages without their own sequence id get first_seq + their index
                entry = encode_entry(messages, producer_name=producer_name, sequence_id=first_seq,
                                     publish_time_ms=int(self._clock() * 1000), compression=compression,
                                     deliver_at_time_ms=deliver_at_time_ms)
                added = self.ml.add_entry(entry, len(messages), expected_offset=expected_offset, on_offsets=keys)
                self.quotas.published(len(messages), len(entry))
            except BaseException:
                if keys is not None:
                    keys.failed()
                if self.dedup is not None:
                    self.dedup.rollback(producer_name, highest_seq, first_seq - 1)
                raise
        result: Future[PublishResult] = new_future()
        added.add_done_callback(lambda f: self._published(f, result, producer_name, highest_seq, keys))
        return result

    def publish_entries(self, entries: Sequence[ClientEntrySend], *, producer_name: str,
                        ) -> Future[list[PublishResult | MagnetarError]]:
        """Store entries a client encoded itself (the binary protocol's SEND payloads, checked by
        ``check_client_entry``) byte for byte, each its own entry, with one managed-ledger call
        and one Future for the group; the Future's list holds, in order, each entry's result or
        the broker's refusal of that entry alone (too large, sequence ids out of range, a
        duplicate still being stored); a failure to store fails the whole Future.

        Deduplication keys on each entry's ``highest_sequence_id``; a chunk other than the last
        of its message (``partial_chunk``: every chunk carries the message's sequence id) is
        acknowledged as a duplicate when its message was stored already, and otherwise stored
        without claiming the sequence id, which its last chunk does."""
        outcomes: list[PublishResult | MagnetarError | None] = [None] * len(entries)
        stored: list[int] = []  # positions of the entries that are written
        datas: list[bytes] = []
        counts: list[int] = []
        reserved: list[ClientEntrySend] = []  # the written entries that claimed their sequence id
        claimed: list[bool] = []  # per written entry: it claimed its sequence id
        keys: list[KeyReservation | None] = []
        size_max = self._message_size_bytes_max + CLIENT_ENTRY_OVERHEAD_BYTES_MAX
        dedup = self.dedup
        with self._publish_lock:
            try:
                for position, entry in enumerate(entries):
                    refusal = _client_entry_refusal(entry, size_max)
                    if refusal is not None:
                        outcomes[position] = refusal
                        continue
                    highest = entry.highest_sequence_id
                    claims = not entry.partial_chunk
                    if dedup is not None and (claims or highest <= dedup.pushed_sequence_id(producer_name)):
                        repeated = self._repeated(producer_name, highest, entry.message_count)
                        if repeated is not None:
                            outcomes[position] = repeated
                            continue
                        assert claims  # a partial chunk at or below the reserved id is never new
                        reserved.append(entry)
                    claimed.append(claims and dedup is not None)
                    stored.append(position)
                    datas.append(entry.data)
                    counts.append(entry.message_count)
                    keys.append(self._client_keys(entry.keys))
                added = self.ml.add_entries(datas, counts, on_offsets=keys) if datas else None
                if self.quotas.publish is not None:
                    self.quotas.published(sum(counts), sum(map(len, datas)))
            except BaseException:
                for reservation in keys:
                    if reservation is not None:
                        reservation.failed()
                if dedup is not None:
                    for entry in reversed(reserved):
                        dedup.rollback(producer_name, entry.highest_sequence_id, entry.sequence_id - 1)
                raise
        result: Future[list[PublishResult | MagnetarError]] = new_future()
        if added is None:
            result.set_result(outcomes)  # type: ignore[arg-type]  # every position is filled
        else:
            added.add_done_callback(lambda f: self._published_entries(
                f, result, producer_name, outcomes, stored, claimed, [entries[p] for p in stored], keys))
        return result

    def _client_keys(self, keys: Sequence[str | None]) -> KeyReservation | None:
        """The key index's reservation for a client entry whose messages have ``keys``."""
        if self.streams is None:
            return None
        return self.streams.reservation_of_keys(keys)

    def _published_entries(self, added: Future[list[AddResult]],
                           result: Future[list[PublishResult | MagnetarError]], producer: str,
                           outcomes: list[PublishResult | MagnetarError | None], stored: list[int],
                           claimed: list[bool], entries: list[ClientEntrySend],
                           keys: list[KeyReservation | None]) -> None:
        error = added.exception()
        if error is not None:
            self._group_failed(error, result, producer, keys)
            return
        adds = added.result()
        if self.dedup is not None:
            last_claim = None
            for add, entry, claims in zip(adds, entries, claimed, strict=True):
                if claims:
                    last_claim = (entry.highest_sequence_id, add.last_offset + 1)
            if last_claim is not None:
                self.dedup.persisted(producer, last_claim[0], last_claim[1], sum(claimed))
        self._group_stored(adds, result, outcomes, stored, keys)

    def _group_failed(self, error: BaseException, result: Future[list[PublishResult | MagnetarError]],
                      producer: str, keys: list[KeyReservation | None]) -> None:
        """A group's store failed: every key reservation and sequence id it took is released."""
        for reservation in keys:
            if reservation is not None:
                reservation.failed()
        self._store_failed(producer)
        result.set_exception(error)

    def _group_stored(self, adds: list[AddResult], result: Future[list[PublishResult | MagnetarError]],
                      outcomes: list[PublishResult | MagnetarError | None], stored: list[int],
                      keys: list[KeyReservation | None]) -> None:
        """A group is durable: each stored entry's result takes its place among the outcomes."""
        partition = self.partition
        for position, add, reservation in zip(stored, adds, keys, strict=True):
            versions: tuple[int | None, ...] = ()
            if reservation is not None:
                reservation.confirmed(add.position)
                versions = reservation.message_versions()
            outcomes[position] = PublishResult(add.position, partition, add.first_offset,
                                               add.last_offset - add.first_offset + 1, add.publish_time_ms,
                                               key_versions=versions)
        result.set_result(outcomes)  # type: ignore[arg-type]

    def publish_each(self, messages: Sequence[Message], *, producer_name: str,
                     sequence_ids: Sequence[int | None], compression: Compression = Compression.NONE,
                     ) -> Future[list[PublishResult | MagnetarError]]:
        """Store each of ``messages`` as its own entry, as many :meth:`publish` calls of one
        message would, with one managed-ledger call and one Future for all of them. The Future's
        list holds, in order, each message's result or the broker's refusal of that message alone
        (too large, a sequence id out of range, a duplicate still being stored); a duplicate is
        acknowledged as :meth:`publish` does. A failure to store fails the whole Future."""
        outcomes: list[PublishResult | MagnetarError | None] = [None] * len(messages)
        stored: list[int] = []  # positions of the messages that become entries
        entries: list[bytes] = []
        seqs: list[int] = []
        keys: list[KeyReservation | None] = []  # each stored message's key versions (the key index)
        size_max = self._message_size_bytes_max
        with self._publish_lock:
            publish_ms = int(self._clock() * 1000)
            try:
                for position, (message, sequence_id) in enumerate(zip(messages, sequence_ids, strict=True)):
                    if len(message.payload) > size_max:
                        outcomes[position] = MessageTooLarge(
                            f"message of {len(message.payload)} bytes exceeds {size_max} bytes")
                        continue
                    seq = self._first_sequence_id(producer_name, sequence_id, (message,))
                    if seq < 0 or seq > SEQUENCE_ID_MAX:
                        outcomes[position] = InvalidRequest(f"sequence ids must lie in 0..{SEQUENCE_ID_MAX}, not {seq}")
                        continue
                    repeated = self._repeated(producer_name, seq, 1)
                    if repeated is not None:
                        outcomes[position] = repeated
                        continue
                    seqs.append(seq)
                    try:
                        if compression is Compression.NONE:
                            entry = encode_single_entry(message, producer_name=producer_name, sequence_id=seq,
                                                        publish_time_ms=publish_ms)
                        else:
                            entry = encode_entry((message,), producer_name=producer_name, sequence_id=seq,
                                                 publish_time_ms=publish_ms, compression=compression)
                        entries.append(entry)
                    except MagnetarError as exc:
                        outcomes[position] = exc
                        self._rollback(producer_name, [seqs.pop()])
                        continue
                    stored.append(position)
                    keys.append(self._key_reservation((message,), None))
                added = self.ml.add_entries(entries, [1] * len(entries), on_offsets=keys) if entries else None
                if self.quotas.publish is not None:
                    self.quotas.published(len(entries), sum(map(len, entries)))
            except BaseException:
                for reservation in keys:
                    if reservation is not None:
                        reservation.failed()
                self._rollback(producer_name, seqs)
                raise
        result: Future[list[PublishResult | MagnetarError]] = new_future()
        if added is None:
            result.set_result(outcomes)  # type: ignore[arg-type]  # every position is filled
        else:
            added.add_done_callback(
                lambda f: self._published_each(f, result, producer_name, outcomes, stored, seqs, keys))
        return result

    def _rollback(self, producer: str, seqs: list[int]) -> None:
        if self.dedup is not None:
            for seq in reversed(seqs):
                self.dedup.rollback(producer, seq, seq - 1)

    def _published_each(self, added: Future[list[AddResult]], result: Future[list[PublishResult | MagnetarError]],
                        producer: str, outcomes: list[PublishResult | MagnetarError | None], stored: list[int],
                        seqs: list[int], keys: list[KeyReservation | None]) -> None:
        error = added.exception()
        if error is not None:
            self._group_failed(error, result, producer, keys)
            return
        adds = added.result()
        if self.dedup is not None:
            self.dedup.persisted(producer, seqs[-1], adds[-1].last_offset + 1, len(adds))
        self._group_stored(adds, result, outcomes, stored, keys)

    def _key_reservation(self, messages: Sequence[Message],
                         expected: Mapping[str, ExpectedVersion] | None) -> KeyReservation | None:
        if self.streams is None:
            if expected is not None:
                raise InvalidRequest(f"{self.name} keeps no key index: expectedKeyVersions cannot be checked")
            return None
        return self.streams.reservation(messages, expected)

    def _first_sequence_id(self, producer: str, sequence_id: int | None, messages: Sequence[Message]) -> int:
        if messages[0].sequence_id is not None:
            return messages[0].sequence_id
        if sequence_id is not None:
            return sequence_id
        return (self.dedup.pushed_sequence_id(producer) if self.dedup is not None else -1) + 1

    def _repeated(self, producer: str, highest_seq: int, count: int) -> PublishResult | MagnetarError | None:
        """One message or entry of a group: its answer when it repeats one stored (acknowledged
        as a duplicate) or still being stored (refused), None when it is new (its id reserved)."""
        try:
            duplicate = self._check_duplicate(producer, highest_seq, count, conditional=False)
        except DuplicateInFlight as exc:
            return exc
        return None if duplicate is None else duplicate.result()

    def _check_duplicate(self, producer: str, highest_seq: int, count: int, *,
                         conditional: bool) -> Future[PublishResult] | None:
        if self.dedup is None:
            return None
        status = self.dedup.check(producer, highest_seq)
        if status is DedupStatus.NEW:
            return None
        if status is DedupStatus.IN_FLIGHT:
            raise DuplicateInFlight(f"sequence id {highest_seq} of {producer} is still being stored; retry")
        original = self._original(producer, highest_seq, count) if conditional else None
        if original is None:
            return _duplicate(self.partition)
        done: Future[PublishResult] = new_future()
        done.set_result(original)
        return done

    def _original(self, producer: str, highest_seq: int, count: int) -> PublishResult | None:
        """The results of the producer's last entry, when ``highest_seq`` resends it."""
        end = self.dedup.last_entry_end(producer, highest_seq) if self.dedup is not None else None
        found = self.streams.entry_ending_at(end, count) if end is not None and self.streams is not None else None
        if found is None:
            return None
        position, first_offset, publish_ms, versions = found
        return PublishResult(position, self.partition, first_offset, count, publish_ms, duplicate=True,
                             key_versions=versions)

    def _published(self, added: Future[AddResult], result: Future[PublishResult], producer: str | None,
                   highest_seq: int, keys: KeyReservation | None) -> None:
        error = added.exception()
        if error is not None:
            if keys is not None:
                keys.failed()
            self._store_failed(producer)
            result.set_exception(error)
            return
        add = added.result()
        versions: tuple[int | None, ...] = ()
        if keys is not None:
            keys.confirmed(add.position)
            versions = keys.message_versions()
        if self.dedup is not None and producer is not None:
            self.dedup.persisted(producer, highest_seq, add.last_offset + 1)
        count = add.last_offset - add.first_offset + 1
        result.set_result(PublishResult(add.position, self.partition, add.first_offset, count, add.publish_time_ms,
                                        key_versions=versions))

    def _store_failed(self, producer: str | None) -> None:
        """A failed store releases the producer's reserved sequence ids (Pulsar's
        ``resetHighestSequenceIdPushed``): its resends are new again, not duplicates in flight.
        A failed add fails every later one of the ledger, so nothing after it was stored."""
        if self.dedup is not None and producer is not None:
            self.dedup.reset_pushed(producer)

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
        """Every confirmed entry holding an offset ``>= offset``, in order, read from the managed
        ledger ``step_entries`` (or about ``step_bytes``) at a time."""
        if offset < self.ml.first_offset:
            raise DataLost(f"offset {offset} of {self.name} was trimmed; first is {self.ml.first_offset}")
        if offset >= self.ml.confirmed_next_offset():
            return
        position, _ = self.ml.offset_to_position(offset)
        while True:
            entries = self.ml.read_entries(position, step_entries, max_bytes=step_bytes)
            if not entries:
                return
            yield from entries
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
