"""Range-read columns (broker/entry_format/columns.py): the native accelerator (_range_columns.c) against
the pure-Python reference, and chunked reads.

Checks: for seeded random entries (random counts; keys absent, empty, Unicode, long and
base64-encoded; null keys and values; properties absent, empty, Unicode and long; event times
absent, zero and up to 2^63-1; compacted-out messages; every compression; non-batched entries;
random read windows and byte limits) the native record batch equals the reference's exactly and
is valid Arrow; entries beyond the extension's own rules (non-canonical base64 keys, repeated
property names, too many properties, event times past 2^63-1) take the reference decoder and
give its result or its error; corrupt batch payloads behind a valid checksum (every truncation,
bad varints, sizes past the end, bad wire types, invalid UTF-8, wrong counts, trailing bytes,
seeded random mutations) raise ``CorruptEntry`` from both paths alike, and a failed append
leaves the columns as they were; chunked reads find each next offset without reading an entry,
and a read of N messages stored one an entry reads N entries; a ledger trimmed between two steps
of a read is ``DataLost``, never a silent jump.
"""

from __future__ import annotations

import base64
import random
import shutil
import struct
import sysconfig
from collections.abc import Iterator
from typing import Any

import crc32c
import pytest

from broker.entry import Entry
from broker.entry_format import Compression, Message, encode_entry, with_broker_entry_metadata
from broker.entry_format.columns import (
    ARROW_SCHEMA,
    NATIVE_COLUMNS,
    NativeColumns,
    collect_entries,
)
from broker.errors import CorruptEntry, DataLost
from broker.message_id import MessageId, Position, message_ids_of_entry
from broker.proto import pulsar_entry_pb2 as pb
from broker.range_read import read_range
from broker.topic import PersistentTopic
from broker.topic_name import TopicName
from tests.publishing import publish
from tests.unit.broker_stack import Stack, open_stack

if NATIVE_COLUMNS:
    from broker.entry_format._range_columns import PROPERTIES_PER_MESSAGE_MAX, MalformedBatch, RangeColumns

native_only = pytest.mark.skipif(not NATIVE_COLUMNS, reason="_range_columns.c was not built (no C compiler)")
BOTH_PATHS = [False, pytest.param(True, marks=native_only)]


def _c_compiler() -> str | None:
    command = (sysconfig.get_config_var("CC") or "cc").split()
    return shutil.which(command[0]) if command else None


def test_the_native_columns_are_built_wherever_a_c_compiler_is() -> None:
    """The native tests skip only where the extension cannot be built: with a compiler present, a
    build that failed (``optional=True`` lets the install succeed) must fail the suite instead."""
    compiler = _c_compiler()
    if compiler is None:
        pytest.skip("no C compiler: range reads use the Python columns")
    assert NATIVE_COLUMNS, (f"{compiler} is present but broker/entry_format/_range_columns.c was not built: "
                            "run `.venv/bin/pip install -e .` and read its compiler output")

TOPIC = "persistent://public/default/columns-partition-3"
PARTITION = 3
LEDGER_ID = 41
PUBLISH_TIME_MS = 1_700_000_000_123
EQUIVALENCE_ROUNDS = 120
MUTATION_ROUNDS = 400
INT64_MAX = (1 << 63) - 1
TEXTS = ["", "k", "user-17", "ключ", "键🔑", "é" * 70, "x" * 130, "\x00nul"]


# --- building entries -----------------------------------------------------------------------


def framed(metadata: pb.MessageMetadata, payload: bytes) -> bytes:
    """An entry in Pulsar's layout (checksum over size + metadata + payload), without a prefix."""
    raw: bytes = metadata.SerializeToString()
    size = struct.pack(">I", len(raw))
    return struct.pack(">HI", 0x0E01, crc32c.crc32c(size + raw + payload)) + size + raw + payload


def stored(body: bytes, first_offset: int, count: int, entry_id: int) -> Entry:
    """``body`` as the managed ledger stores and reads it (broker prefix, offsets, position)."""
    last_offset = first_offset + count - 1
    return Entry(Position(LEDGER_ID, entry_id), with_broker_entry_metadata(body, PUBLISH_TIME_MS, last_offset),
                 first_offset, last_offset, PUBLISH_TIME_MS)


def batch_entry(payload: bytes, count: int, first_offset: int = 0, entry_id: int = 0) -> Entry:
    """An uncompressed batched entry whose metadata declares ``count`` messages (any payload)."""
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=PUBLISH_TIME_MS,
                                  num_messages_in_batch=count)
    return stored(framed(metadata, payload), first_offset, max(count, 1), entry_id)


def batch_payload(messages: list[Message]) -> bytes:
    """The uncompressed batch payload ``encode_entry`` writes for ``messages``."""
    data = encode_entry(messages, producer_name="p", sequence_id=0, publish_time_ms=PUBLISH_TIME_MS)
    (metadata_size,) = struct.unpack_from(">I", data, 6)
    return data[10 + metadata_size:]


def encoded_entry(messages: list[Message], compression: Compression, first_offset: int, entry_id: int) -> Entry:
    body = encode_entry(messages, producer_name="p", sequence_id=7, publish_time_ms=PUBLISH_TIME_MS,
                        compression=compression)
    return stored(body, first_offset, len(messages), entry_id)


def non_batched_entry(rng: random.Random, first_offset: int, entry_id: int) -> Entry:
    """Pulsar's non-batched form: one message whose metadata is the ``MessageMetadata``."""
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=PUBLISH_TIME_MS)
    key = rng.choice([None, *TEXTS])
    if key is not None:
        metadata.partition_key = key
    for name in rng.sample(TEXTS, rng.randrange(3)):
        metadata.properties.add(key=name, value=rng.choice(TEXTS))
    if rng.random() < 0.5:
        metadata.event_time = rng.randrange(1 << 41)
    return stored(framed(metadata, rng.randbytes(rng.randrange(30))), first_offset, 1, entry_id)


def single_metadata(*fields: bytes) -> bytes:
    """A hand-made batch item: [size u32][fields...] (the caller adds the payload)."""
    body = b"".join(fields)
    return struct.pack(">I", len(body)) + body


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key_value(name: bytes, value: bytes) -> bytes:
    inner = b"\x0a" + varint(len(name)) + name + b"\x12" + varint(len(value)) + value
    return b"\x0a" + varint(len(inner)) + inner


def random_key(rng: random.Random) -> tuple[str | None, bool]:
    roll = rng.random()
    if roll < 0.3:
        return None, False
    if roll < 0.5:
        return base64.b64encode(rng.randbytes(rng.choice([0, 1, 2, 3, 20, 120]))).decode(), True
    return rng.choice(TEXTS), False


def random_message(rng: random.Random, first: bool) -> Message:
    key, key_b64 = random_key(rng)
    null_value = rng.random() < 0.1
    return Message(
        payload=b"" if null_value else rng.randbytes(rng.choice([0, 1, 17, 100, 300])),
        key=key,
        properties={rng.choice(TEXTS): rng.choice(TEXTS) for _ in range(rng.choice([0, 0, 1, 3]))},
        event_time_ms=rng.choice([None, None, 0, rng.randrange(1 << 41), rng.randrange(INT64_MAX)]),
        sequence_id=None if first or rng.random() < 0.5 else rng.randrange(1 << 40),
        ordering_key=rng.choice([None, b"", rng.randbytes(5)]),
        key_b64_encoded=key_b64,
        null_value=null_value,
        null_key=key is None and rng.random() < 0.5,
        compacted_out=rng.random() < 0.1,
    )


def random_entries(rng: random.Random) -> list[Entry]:
    entries: list[Entry] = []
    offset = 0
    for entry_id in range(rng.randrange(1, 6)):
        if rng.random() < 0.15:
            entries.append(non_batched_entry(rng, offset, entry_id))
        else:
            count = rng.choice([1, 2, rng.randrange(1, 40), 300])
            messages = [random_message(rng, i == 0) for i in range(count)]
            entries.append(encoded_entry(messages, rng.choice(list(Compression)), offset, entry_id))
        offset = entries[-1].last_offset + 1
    return entries


# --- reading them ---------------------------------------------------------------------------


def read(entries: list[Entry], *, native: bool, offset: int = 0, max_messages: int = 100_000,
         max_bytes: int = 1 << 30, overhead: int = 0) -> Any:
    """The record batch a read builds, or the type of the error it raises."""
    try:
        columns = collect_entries(entries, offset, PARTITION, max_messages, max_bytes, native=native,
                                  message_overhead_bytes=overhead)
        return columns.record_batch(TOPIC, PARTITION)
    except Exception as exc:  # the outcome compared is the error's type
        return type(exc)


def assert_same_read(entries: list[Entry], **window: int) -> Any:
    reference = read(entries, native=False, **window)
    native = read(entries, native=True, **window)
    if isinstance(reference, type):
        assert native is reference
    else:
        assert not isinstance(native, type), f"native read raised {native.__name__}"
        native.validate(full=True)
        assert native.schema.equals(ARROW_SCHEMA)
        assert native.equals(reference)
    return native


def assert_corrupt(payload: bytes, count: int) -> None:
    entries = [batch_entry(payload, count)]
    assert read(entries, native=False) is CorruptEntry
    assert read(entries, native=True) is CorruptEntry


# --- equivalence ----------------------------------------------------------------------------


@native_only
@pytest.mark.parametrize("seed", range(EQUIVALENCE_ROUNDS))
def test_native_columns_equal_the_reference_for_random_entries_and_windows(seed: int) -> None:
    rng = random.Random(seed)
    entries = random_entries(rng)
    total = entries[-1].last_offset + 1
    offset = rng.randrange(entries[0].message_count)
    window = {"offset": offset, "max_messages": rng.choice([1, 5, total, 100_000]),
              "max_bytes": rng.choice([1, 200, 5000, 1 << 30]), "overhead": rng.choice([0, 0, 1, 64, 700])}
    batch = assert_same_read(entries, **window)
    assert batch.num_rows >= 1, f"seed {seed}"


@native_only
def test_message_ids_of_a_native_read_are_pulsars() -> None:
    messages = [Message(payload=bytes([i % 256])) for i in range(300)]
    entries = [encoded_entry(messages, Compression.NONE, 0, 9), encoded_entry(messages[:1], Compression.LZ4, 300, 10)]
    batch = assert_same_read(entries, offset=120)
    ids = batch.column("messageId").to_pylist()
    assert ids[:180] == [MessageId(LEDGER_ID, 9, PARTITION, i).to_base64() for i in range(120, 300)]
    assert ids[180] == MessageId(LEDGER_ID, 10, PARTITION).to_base64()  # a lone message has no batch index
    assert [i.decode() for i in message_ids_of_entry(LEDGER_ID, 9, PARTITION, 300, 120, 300)] == ids[:180]


@pytest.mark.parametrize("native", BOTH_PATHS)
def test_an_empty_key_is_an_empty_key_and_a_missing_one_is_null(native: bool) -> None:
    entries = [encoded_entry([Message(b"a", key=""), Message(b"b"), Message(b"c", key="", key_b64_encoded=True)],
                             Compression.NONE, 0, 0)]
    assert read(entries, native=native).column("key").to_pylist() == [b"", None, b""]


def encrypted_entry(count: int, first_offset: int, entry_id: int) -> Entry:
    """A batch of ``count`` messages, encrypted end to end (its payload is ciphertext, which
    would be a malformed batch if anything tried to split it)."""
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=PUBLISH_TIME_MS,
                                  num_messages_in_batch=count, partition_key="clear", encryption_param=b"iv")
    metadata.encryption_keys.add(key="rsa", value=b"data key")
    return stored(framed(metadata, b"\xff" * 33), first_offset, count, entry_id)


@pytest.mark.parametrize("native", BOTH_PATHS)
def test_an_encrypted_entry_reads_as_rows_its_first_one_holding_the_ciphertext(native: bool) -> None:
    messages = [Message(payload=b"plain")]
    entries = [encoded_entry(messages, Compression.NONE, 0, 0), encrypted_entry(3, 1, 1),
               encoded_entry(messages, Compression.NONE, 4, 2)]
    batch = assert_same_read(entries)
    assert batch.column("value").to_pylist() == [b"plain", b"\xff" * 33, b"", b"", b"plain"]
    assert batch.column("key").to_pylist() == [None, b"clear", b"clear", b"clear", None]
    columns = collect_entries(entries, 0, PARTITION, 100_000, 1 << 30, native=native)
    assert list(columns.encrypted) == [1] and columns.carried == {2, 3}
    resumed = collect_entries(entries[1:], 2, PARTITION, 100_000, 1 << 30, native=native)
    assert resumed.encrypted == {} and resumed.carried == {2, 3}  # the ciphertext went with offset 1


def native_decoded_entries(entries: list[Entry]) -> int:
    columns = collect_entries(entries, 0, PARTITION, 100_000, 1 << 30, native=True)
    assert isinstance(columns, NativeColumns)
    return columns.decoded_entries


@native_only
def test_ordinary_entries_never_take_the_python_decoder() -> None:
    rng = random.Random(7)
    messages = [random_message(rng, i == 0)._replace(key_b64_encoded=False) for i in range(200)]
    assert native_decoded_entries([encoded_entry(messages, Compression.ZSTD, 0, 0)]) == 0


@native_only
@pytest.mark.parametrize(("max_messages", "max_bytes", "overhead"), [
    (1 << 63, 1 << 64, 0),  # bounds past 64 bits: no read reaches them
    (3, 1 << 30, -5),  # an overhead below zero (nobody asks for one): the Python loop
    (3, 1 << 30, 1 << 40),
])
def test_bounds_outside_the_extensions_integers_read_as_the_reference_reads(
        max_messages: int, max_bytes: int, overhead: int) -> None:
    rng = random.Random(5)
    entries = [encoded_entry([random_message(rng, True)._replace(key_b64_encoded=False) for _ in range(4)],
                             Compression.NONE, 4 * i, i) for i in range(3)]
    assert_same_read(entries, max_messages=max_messages, max_bytes=max_bytes, overhead=overhead)


@native_only
def test_a_read_of_common_entries_runs_in_the_extension_and_hands_back_only_the_others() -> None:
    """The loop over a read's entries runs in ``add_entries``: an uncompressed batch of one
    message (an event as the eventsourcing recorder stores it) or of many never comes back to
    Python; a compressed or non-batched entry does, once, and the read is the reference's."""
    rng = random.Random(11)
    entries: list[Entry] = []
    for entry_id in range(40):
        first = entries[-1].last_offset + 1 if entries else 0
        count = 1 if entry_id % 2 else rng.randrange(2, 30)
        messages = [random_message(rng, i == 0)._replace(key_b64_encoded=False) for i in range(count)]
        entries.append(encoded_entry(messages, Compression.NONE, first, entry_id))
    common = collect_entries(entries, 0, PARTITION, 100_000, 1 << 30, native=True)
    assert isinstance(common, NativeColumns)
    assert (len(common), common.handed_back) == (entries[-1].last_offset + 1, 0)
    first = entries[-1].last_offset + 1
    entries += [encoded_entry([Message(b"z", key="k")], Compression.ZSTD, first, 40),
                non_batched_entry(rng, first + 1, 41)]
    mixed = collect_entries(entries, 3, PARTITION, 100_000, 1 << 30, native=True)
    assert isinstance(mixed, NativeColumns)
    assert mixed.handed_back == 2
    assert_same_read(entries, offset=3)


@native_only
@pytest.mark.parametrize(("key", "expected"), [
    ("QR==", b"A"),  # canonical with stray padding bits: the extension decodes it
    ("Q Q==", b"A"),  # not canonical: the reference skips the space
    ("QQ==QQ==", b"A"),  # not canonical: the reference stops at the first padding
    ("QQ", None),  # incorrect padding: both raise the reference's error
    ("A===", None),
])
def test_keys_marked_base64_decode_as_the_reference_does(key: str, expected: bytes | None) -> None:
    entries = [encoded_entry([Message(b"v", key=key, key_b64_encoded=True), Message(b"w")], Compression.NONE, 0, 0)]
    batch = assert_same_read(entries)
    if expected is None:
        assert isinstance(batch, type) and issubclass(batch, ValueError)
        return
    assert batch.column("key").to_pylist() == [expected, None]
    assert native_decoded_entries(entries) == (0 if key == "QR==" else 1)


@native_only
def test_repeated_property_names_keep_their_first_place_and_last_value() -> None:
    item = single_metadata(key_value(b"a", b"1"), key_value(b"b", b"2"), key_value(b"a", b"3"), b"\x18\x01") + b"x"
    entries = [batch_entry(item + item, 2)]
    batch = assert_same_read(entries)
    assert batch.column("properties").to_pylist()[0] == [("a", "3"), ("b", "2")]
    assert native_decoded_entries(entries) == 0


@native_only
def test_messages_with_more_properties_than_the_extension_keeps_take_the_reference_decoder() -> None:
    many = {f"p{i}": str(i) for i in range(PROPERTIES_PER_MESSAGE_MAX + 1)}
    entries = [encoded_entry([Message(b"v", properties=many), Message(b"w", key="k")], Compression.NONE, 0, 0)]
    batch = assert_same_read(entries)
    assert dict(batch.column("properties").to_pylist()[0]) == many
    assert native_decoded_entries(entries) == 1


@native_only
def test_event_times_past_int64_fail_as_the_reference_does() -> None:
    # Magnetar's producers refuse such event times (``encode_entry``); a foreign writer's entry
    # (protobuf's uint64 allows them) fails the same way on both paths
    items = [single_metadata(b"\x18\x01", b"\x28" + varint(event_time_ms)) + payload
             for event_time_ms, payload in ((INT64_MAX, b"v"), (INT64_MAX + 1, b"w"))]
    entries = [batch_entry(b"".join(items), 2)]
    assert read(entries, native=True, max_messages=1).column("eventTime").cast("int64").to_pylist() == [INT64_MAX]
    assert read(entries, native=False) is OverflowError
    assert read(entries, native=True) is OverflowError


# --- corruption -----------------------------------------------------------------------------


def small_payload() -> bytes:
    return batch_payload([
        Message(b"first", key="k1", properties={"a": "b", "名": "値"}, event_time_ms=1_700_000_000_000),
        Message(b"", null_value=True, key=base64.b64encode(b"\x00\xff").decode(), key_b64_encoded=True),
        Message(b"third" * 30, properties={"long" * 40: "v"}, ordering_key=b"o"),
    ])


@native_only
def test_every_truncation_of_a_batch_is_corrupt_on_both_paths() -> None:
    payload = small_payload()
    assert not isinstance(read([batch_entry(payload, 3)], native=True), type)
    for size in range(len(payload)):
        assert_corrupt(payload[:size], 3)


@native_only
@pytest.mark.parametrize("count", [-1, 0, 2, 4, 1000])
def test_a_wrong_message_count_is_corrupt_on_both_paths(count: int) -> None:
    assert_corrupt(small_payload(), count)


@native_only
@pytest.mark.parametrize("item", [
    single_metadata(b"\x18" + b"\x81" * 10 + b"\x01") + b"x",  # an 11-byte varint
    single_metadata(b"\x18" + b"\xff" * 9 + b"\x02") + b"x",  # a varint wider than 64 bits
    single_metadata(b"\x18\x81") + b"x",  # a varint cut by the metadata's end
    single_metadata(b"\x40" + b"\xff" * 9 + b"\x02", b"\x18\x01") + b"x",  # a sequence_id wider than 64 bits
    single_metadata(b"\x40" + b"\x80" * 10 + b"\x00", b"\x18\x01") + b"x",  # an 11-byte sequence_id
    single_metadata(b"\x58" + b"\xff" * 9 + b"\x7f", b"\x18\x01") + b"x",  # an unknown varint field too wide
    struct.pack(">I", 0xFFFFFFFF) + b"\x18\x01x",  # metadata size past the end
    single_metadata(b"\x18" + varint(INT64_MAX)) + b"x",  # payload past the end
    single_metadata(b"\x18" + varint((1 << 64) - 1)) + b"x",  # payload size past int64
    single_metadata(b"\x18\x02") + b"x",  # payload one byte short
    single_metadata(b"\x18\x01") + b"xy",  # a trailing byte
    single_metadata(b"\x40\x05") + b"x",  # no payload_size
    single_metadata(b"\x0a\xff\xff\x03" + b"\x18\x01") + b"x",  # a property longer than the metadata
    single_metadata(b"\x12\x05ab" + b"\x18\x01") + b"x",  # a key longer than the metadata
    single_metadata(b"\x0a\x03\x0a\x01a" + b"\x18\x01") + b"x",  # a property without a value
    single_metadata(b"\x0a\x04\x0a\x01a\x12" + b"\x18\x01") + b"x",  # a property value cut short
    single_metadata(b"\x0a\x05\x0a\x01a\x13\x01" + b"\x18\x01") + b"x",  # a group inside a property
    single_metadata(b"\x63\x00\x18\x01") + b"x",  # wire type 3 (start group)
    single_metadata(b"\x64\x00\x18\x01") + b"x",  # wire type 4 (end group)
    single_metadata(b"\x66\x00\x18\x01") + b"x",  # wire type 6
    single_metadata(b"\x67\x00\x18\x01") + b"x",  # wire type 7
    single_metadata(b"\x61\x00\x00\x00\x18\x01") + b"x",  # a fixed64 field cut short
    single_metadata(b"\x12\x01\xff\x18\x01") + b"x",  # a key that is not UTF-8
    single_metadata(b"\x12\x03\xed\xa0\x80\x18\x01") + b"x",  # a UTF-8-encoded surrogate
    single_metadata(b"\x12\x02\xc0\x80\x18\x01") + b"x",  # an overlong form
    single_metadata(b"\x12\x04\xf4\x90\x80\x80\x18\x01") + b"x",  # past U+10FFFF
    single_metadata(key_value(b"\xe2\x82", b"v") + b"\x18\x01") + b"x",  # a cut sequence in a property name
    single_metadata(key_value(b"n", b"\x80") + b"\x18\x01") + b"x",  # a lone continuation byte in a value
])
def test_malformed_batch_items_are_corrupt_on_both_paths(item: bytes) -> None:
    good = single_metadata(b"\x18\x01") + b"g"
    assert_corrupt(good + item, 2)
    assert_corrupt(item + good, 2)


@native_only
def test_unknown_and_multi_byte_tags_are_skipped_as_the_reference_skips_them() -> None:
    item = single_metadata(b"\x98\x00\x05", b"\x59" + b"\x00" * 8, b"\x5d" + b"\x00" * 4, b"\x5a\x02ab",
                           b"\x00\x07", b"\x18\x01") + b"x"
    batch = assert_same_read([batch_entry(item, 1)])
    assert batch.column("value").to_pylist() == [b"x"]


@native_only
@pytest.mark.parametrize("seed", range(4))
def test_random_mutations_give_the_same_outcome_on_both_paths(seed: int) -> None:
    rng = random.Random(seed)
    payload = small_payload()
    outcomes: set[str] = set()
    for _ in range(MUTATION_ROUNDS // 4):
        mutated = bytearray(payload)
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(mutated))
            roll = rng.random()
            if roll < 0.6:
                mutated[at] = rng.randrange(256)
            elif roll < 0.8:
                del mutated[at]
            else:
                mutated.insert(at, rng.randrange(256))
        outcome = assert_same_read([batch_entry(bytes(mutated), 3)])
        outcomes.add(outcome.__name__ if isinstance(outcome, type) else "decoded")
    assert "CorruptEntry" in outcomes


# --- the extension's own contract -----------------------------------------------------------


@native_only
def test_a_failed_or_refused_batch_leaves_the_columns_as_they_were() -> None:
    good = batch_payload([Message(b"one", key="k", properties={"p": "q"}, event_time_ms=5)])
    prefix = MessageId(1, 2, 0).to_bytes()
    columns = RangeColumns(10)
    assert columns.add_batch(good, 1, 0, 1, PUBLISH_TIME_MS, prefix)
    with pytest.raises(MalformedBatch):
        columns.add_batch(good + small_payload()[:-1], 4, 0, 4, PUBLISH_TIME_MS, prefix)
    refused = batch_payload([Message(b"two", key="Q Q==", key_b64_encoded=True, properties={"x": "y"})])
    assert not columns.add_batch(refused, 1, 0, 1, PUBLISH_TIME_MS, prefix)
    assert (columns.rows, columns.property_count, columns.value_bytes) == (1, 1, 3)
    buffers = columns.finish()
    assert buffers["value_data"] == b"one" and buffers["key_data"] == b"k"
    assert buffers["property_offsets"] == struct.pack("=2i", 0, 1)  # host order, as Arrow's buffers are
    assert buffers["offsets"] == struct.pack("=q", 10)
    assert buffers["key_validity"] is None and buffers["event_time_validity"] is None


@native_only
def test_the_extension_refuses_misuse() -> None:
    good = batch_payload([Message(b"one")])
    columns = RangeColumns(0)
    with pytest.raises(ValueError, match="skip and take"):
        columns.add_batch(good, 1, 0, 2, 0, b"")
    with pytest.raises(ValueError, match="id_prefix"):
        columns.add_batch(good, 1, 0, 1, 0, b"\x00" * 65)
    with pytest.raises(MalformedBatch):
        columns.add_batch(good, 0, 0, 0, 0, b"")
    assert issubclass(MalformedBatch, ValueError)
    columns.finish()
    with pytest.raises(RuntimeError):
        columns.add_batch(good, 1, 0, 1, 0, b"")
    with pytest.raises(RuntimeError):
        columns.finish()
    with pytest.raises(RuntimeError):
        RangeColumns.__new__(RangeColumns).add_batch(good, 1, 0, 1, 0, b"")


# --- chunked reads: the managed ledger remembers where the next one starts ------------------


@pytest.fixture
def stack(data_dir: str) -> Iterator[Stack]:
    opened = open_stack(data_dir)
    yield opened
    opened.close()


@pytest.fixture
def topic(stack: Stack) -> PersistentTopic:
    name = TopicName.parse("public/default/chunked")
    ml, cursors = stack.open(name.managed_ledger_name)
    return PersistentTopic(name, ml, cursors, stack.store, clock=stack.clock)


def publish_entries(topic: PersistentTopic, entries: int, per_entry: int) -> list[bytes]:
    payloads = []
    for entry in range(entries):
        batch = [f"{entry}-{i}".encode() for i in range(per_entry)]
        publish(topic, [Message(p) for p in batch], producer_name="p").result(timeout=10)
        payloads.extend(batch)
    return payloads


def entries_read_by_lookups(topic: PersistentTopic, stack: Stack, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """For each offset lookup from now on, how many entries it read (entry-cache lookups)."""
    reads: list[int] = []
    lookup = topic.ml.offset_to_position

    def counting(offset: int) -> tuple[Position, int]:
        before = stack.cache.statistics()
        found = lookup(offset)
        after = stack.cache.statistics()
        reads.append(after.hits + after.misses - before.hits - before.misses)
        return found

    monkeypatch.setattr(topic.ml, "offset_to_position", counting)
    return reads


@pytest.mark.parametrize("native", BOTH_PATHS)
def test_chunked_reads_find_each_next_offset_without_reading(topic: PersistentTopic, stack: Stack, native: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads of one entry each: every lookup after the first finds its offset without reading an
    entry, at the start of a ledger too (the read before it went on into that ledger, a step of
    three entries, and every entry a read held is hinted)."""
    payloads = publish_entries(topic, entries=12, per_entry=3)  # test_min ledgers roll over: several ledgers
    reads = entries_read_by_lookups(topic, stack, monkeypatch)
    offset, seen, starts = 0, [], []
    for _ in range(len(payloads)):  # bounded: each read advances
        read = read_range(topic, topic.name, offset, 3, 1 << 20, native=native)
        if not read.batch.num_rows:
            break
        starts.append(offset)
        seen.extend(read.batch.column("value").to_pylist())
        offset = read.next_offset
    assert seen == payloads
    ledger_starts = [info.first_offset for info in topic.ml.ledger_infos() if info.entries]
    assert len(ledger_starts) > 2
    assert [start for start, read in zip(starts, reads, strict=True) if read] == [0]


@pytest.mark.parametrize("native", BOTH_PATHS)
def test_a_read_of_n_messages_stored_one_an_entry_reads_n_entries(topic: PersistentTopic, stack: Stack, native: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A range read takes entries in steps no larger than it can use: a read of 4 messages
    stored one an entry reads those 4 entries (besides what its offset lookup reads), not a
    whole step of ``READ_STEP_ENTRIES_MAX`` (before: the 32 entries from its offset to the end,
    to keep 4)."""
    payloads = publish_entries(topic, entries=40, per_entry=1)
    lookups = entries_read_by_lookups(topic, stack, monkeypatch)
    before = stack.cache.statistics()
    read = read_range(topic, topic.name, 8, 4, 1 << 20, native=native)
    after = stack.cache.statistics()
    assert read.batch.column("value").to_pylist() == payloads[8:12] and read.next_offset == 12
    assert after.hits + after.misses - before.hits - before.misses - sum(lookups) == 4


def test_a_ledger_trimmed_between_two_steps_of_a_read_is_data_lost_never_a_silent_jump(
        topic: PersistentTopic, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention trims the ledger a read goes on into between two of its steps: the next step
    would start past the offsets it expects, and rows labelled with offsets they do not hold
    would follow. The read is ``DataLost`` instead (the step is made to land as after the trim)."""
    publish_entries(topic, entries=15, per_entry=1)  # test_min: ledgers of 5 entries
    ledgers = [info.ledger_id for info in topic.ml.ledger_infos() if info.entries]
    next_position = topic.ml.next_position

    def past_a_trimmed_ledger(position: Position) -> Position:
        found = next_position(position)
        return Position(ledgers[2], 0) if found.ledger_id == ledgers[1] else found

    monkeypatch.setattr(topic.ml, "next_position", past_a_trimmed_ledger)
    with pytest.raises(DataLost, match=r"offset 5 .* trimmed while read"):
        list(topic.entries_from(0, step_entries=5))


@native_only
def test_an_entrys_message_count_past_64_bits_is_refused_natively_as_reading_it_would_be() -> None:
    """The native loop works an entry's count out from its offsets (``last_offset -
    first_offset + 1``, its ``message_count``); a count past a 64-bit integer is an
    ``OverflowError``, as reading ``message_count`` as one was, never a wrapped count."""
    entry = batch_entry(small_payload(), 3)._replace(first_offset=-(2**63), last_offset=2**63 - 1)
    with pytest.raises(OverflowError):
        collect_entries([entry], 0, PARTITION, 100, 1 << 20, native=True)


def raw_framed(metadata: bytes, payload: bytes) -> bytes:
    size = struct.pack(">I", len(metadata))
    return struct.pack(">HI", 0x0E01, crc32c.crc32c(size + metadata + payload)) + size + metadata + payload


def text_field(tag: int, text: bytes) -> bytes:
    return bytes([tag]) + varint(len(text)) + text


@native_only
@pytest.mark.parametrize("producer", [b"p", "производитель".encode(), b"\xff", b"\xed\xa0\x80", b"\xc0\x80",
                                      b"\xf4\x90\x80\x80", b"ok\xe2\x82"])
@pytest.mark.parametrize("partition_key", [None, b"\xff", "ключ".encode()])
@pytest.mark.parametrize("ordering_key", [None, b"\xff\x00"])
def test_the_native_entry_check_without_texts_takes_what_the_python_check_takes(
        producer: bytes, partition_key: bytes | None, ordering_key: bytes | None) -> None:
    """The columns check each entry through ``_common_entry.c``'s capsule, which reads the
    producer name, partition key and ordering key without making them (strict UTF-8 checked in
    place): an entry ``common_batch`` takes is taken natively (none handed back), one whose
    texts are not UTF-8 is left to the Python decoder, and a read gives the same rows, or the
    same error, as the Python columns."""
    from broker.entry_format._range_columns import COMMON_ENTRY_API
    from broker.entry_format.common_entry import common_batch_of_bytes

    assert COMMON_ENTRY_API, "_range_columns.c did not load _common_entry.c's capsule"
    metadata = text_field(0x0A, producer) + b"\x10\x00\x18" + varint(PUBLISH_TIME_MS)
    if partition_key is not None:
        metadata += text_field(0x32, partition_key)
    if ordering_key is not None:  # field 18, bytes: not text
        metadata += b"\x92\x01" + varint(len(ordering_key)) + ordering_key
    entry = stored(raw_framed(metadata + b"\x58\x01", batch_payload([Message(b"value", key="k")])), 0, 1, 0)
    valid = _decodes(producer) and _decodes(partition_key or b"")
    assert (common_batch_of_bytes(entry.data) is not None) == valid
    if valid:
        columns = collect_entries([entry], 0, PARTITION, 100, 1 << 20, native=True)
        assert isinstance(columns, NativeColumns) and columns.handed_back == 0
    assert_same_read([entry])


def _decodes(text: bytes) -> bool:
    try:
        text.decode()
    except UnicodeDecodeError:
        return False
    return True
