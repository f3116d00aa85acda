"""The entry format's C modules return and refuse exactly what its Python code does.

Checks, each property-tested against the Python twin (and each asserting the module was built):
``_varint.c`` writes and reads varints; ``_batch_encoder.c`` writes batch payloads and leaves
what it does not take to the Python checks; ``_batch_decoder.c`` splits them and leaves what it
cannot vouch for to the Python decoder; ``_common_entry.c`` checks a common stored entry, on
entries changed byte by byte, cut short and made by hand with protobuf.
"""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.entry_format import (
    MAGIC_CRC32C,
    Compression,
    DecodedMessage,
    Message,
    as_unbatched,
    encode_entry,
    with_broker_entry_metadata,
)
from broker.errors import CorruptEntry, InvalidRequest
from broker.proto import pulsar_entry_pb2 as pb
from tests.unit.entry_format_support import PUBLISH_MS, UINT64_MAX, encode, messages_strategy, texts


@settings(max_examples=500, deadline=None)
@given(value=st.integers(min_value=-(1 << 70), max_value=1 << 70))
def test_the_native_varint_writes_the_python_encoders_bytes(value: int) -> None:
    """Both encoders give the same bytes for every int, and refuse the same ones alike."""
    from broker.entry_format import wire

    assert wire.NATIVE_VARINT, "the native varint encoder was not built (setup.py needs a C compiler)"
    try:
        expected: bytes | type[BaseException] = wire._python_encode_varint(value)
    except ValueError:
        expected = ValueError
    if expected is ValueError:
        with pytest.raises(ValueError):
            wire.encode_varint(value)
    else:
        assert wire.encode_varint(value) == expected


@settings(max_examples=1000, deadline=None)
@given(buf=st.binary(max_size=24) | st.integers(min_value=0, max_value=(1 << 70)).map(
           lambda v: __import__("broker.entry_format.wire", fromlist=["x"])._python_encode_varint(v) + b"\x01"),
       pos=st.integers(min_value=-3, max_value=26), as_bytearray=st.booleans())
def test_the_native_varint_reader_reads_what_the_python_reader_reads(buf: bytes, pos: int, as_bytearray: bool) -> None:
    """The same value and next position for every buffer and position, the same error otherwise
    (running past the end, longer than 10 bytes, wider than 64 bits)."""
    from broker.entry_format import wire

    assert wire.NATIVE_VARINT
    data: bytes | bytearray = bytearray(buf) if as_bytearray else buf
    try:
        expected: object = wire._python_read_varint(data, pos)  # type: ignore[arg-type]
    except (IndexError, CorruptEntry) as exc:
        with pytest.raises(type(exc)) as raised:
            wire.read_varint(data, pos)  # type: ignore[arg-type]
        assert str(raised.value) == str(exc)
        return
    assert wire.read_varint(data, pos) == expected  # type: ignore[arg-type]


odd_messages = st.builds(
    Message,
    payload=st.binary(max_size=50) | st.text(max_size=5) | st.just(bytearray(b"ba")),
    key=st.none() | st.text(max_size=8) | st.just("\ud800") | st.just(b"k"),
    properties=st.dictionaries(st.text(max_size=6) | st.just("\udfff"), st.text(max_size=6) | st.just(7), max_size=3)
    | st.just({}),
    event_time_ms=st.none() | st.integers(min_value=-2, max_value=(1 << 64)) | st.just(True),
    sequence_id=st.none() | st.integers(min_value=-1, max_value=(1 << 64) + 1),
    ordering_key=st.none() | st.binary(max_size=4) | st.just("ok"),
    key_b64_encoded=st.booleans() | st.just(1),
    null_value=st.booleans(),
    null_key=st.booleans() | st.just(0),
    compacted_out=st.booleans(),
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(messages_strategy | odd_messages, min_size=1, max_size=5),
       sequence_id=st.integers(min_value=-1, max_value=UINT64_MAX) | st.just("3"),
       compression=st.sampled_from(list(Compression)))
def test_the_native_batch_encoder_writes_and_refuses_what_the_python_encoder_does(
        messages: list[Message], sequence_id: int, compression: Compression) -> None:
    """encode_entry gives the same bytes, or the same refusal, with the native batch encoder and
    without it, for well-formed and odd messages alike."""
    from broker.entry_format import batch

    assert batch.NATIVE_BATCH_ENCODER, "the native batch encoder was not built (setup.py needs a C compiler)"

    def encoded() -> bytes | str:
        try:
            return encode_entry(messages, producer_name="p", sequence_id=sequence_id, publish_time_ms=1,
                                compression=compression)
        except InvalidRequest as exc:
            return f"refused: {exc}"

    native = encoded()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batch, "NATIVE_BATCH_ENCODER", False)
        python = encoded()
    assert native == python


def _python_split(buf: bytes, count: int, first_offset: int | None, base: int) -> list[DecodedMessage] | str:
    from broker.entry_format import batch

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batch, "NATIVE_BATCH_DECODER", False)
        try:
            return batch.decode_batch(buf, count, first_offset, base)
        except CorruptEntry as exc:
            return f"refused: {exc}"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(messages_strategy, min_size=1, max_size=6),
       sequence_ids=st.lists(st.none() | st.integers(min_value=0, max_value=UINT64_MAX), min_size=6, max_size=6),
       first_offset=st.none() | st.integers(min_value=-3, max_value=1 << 62),
       base=st.integers(min_value=-2, max_value=UINT64_MAX + 5), count_shift=st.integers(min_value=-1, max_value=1),
       damage=st.none() | st.tuples(st.integers(min_value=0, max_value=2000), st.integers(min_value=1, max_value=255))
       | st.integers(min_value=1, max_value=40))
def test_the_native_batch_decoder_splits_what_the_python_decoder_splits(
        messages: list[Message], sequence_ids: list[int | None], first_offset: int | None, base: int,
        count_shift: int, damage: tuple[int, int] | int | None) -> None:
    """Whatever the native decoder returns is exactly the Python decoder's list (a batch's
    messages with every field); everything else (a damaged, cut or miscounted batch, fields
    it does not read) it leaves to the Python decoder, which then returns or refuses as ever.
    A clean batch of the messages Magnetar's edges and Pulsar's clients write is read natively."""
    from broker.entry_format import batch
    from broker.entry_format.batch import encode_single_metadata
    from broker.entry_format.wire import U32

    assert batch.NATIVE_BATCH_DECODER, "the native batch decoder was not built (setup.py needs a C compiler)"
    from broker.entry_format._batch_decoder import decode_batch as native_decode_batch
    parts = []
    for message, sequence_id in zip(messages, sequence_ids, strict=False):
        single = encode_single_metadata(message, 0 if sequence_id is None else sequence_id)
        if sequence_id is None and single.endswith(b"\x40\x00"):  # drop the field: numbered from the base
            single = single[:-2]
        parts += [U32.pack(len(single)), single, message.payload]
    buf = b"".join(parts)
    count = len(messages) + count_shift
    if isinstance(damage, tuple):
        damaged = bytearray(buf)
        damaged[damage[0] % len(damaged)] ^= damage[1]
        buf = bytes(damaged)
    elif isinstance(damage, int):
        buf = buf[: max(0, len(buf) - damage)]
    expected = _python_split(buf, count, first_offset, base)
    native = native_decode_batch(buf, count, first_offset, base)
    if native is not None:
        assert native == expected
        assert all(type(m) is DecodedMessage for m in native)
    clean = damage is None and count_shift == 0 and (first_offset is None or first_offset >= 0)
    if clean and all(len(k.encode()) < 0x80 and len(v.encode()) < 0x80 for m in messages
                     for k, v in m.properties.items()):
        assert native is not None, "a clean batch was left to the Python decoder"


def test_the_native_batch_decoder_leaves_a_repeated_key_to_the_python_decoder() -> None:
    """A message whose key appears twice, the first not UTF-8: the Python decoder refuses it
    (it decodes every occurrence), so the native one must not answer for it."""
    from broker.entry_format import batch
    from broker.entry_format.wire import U32

    assert batch.NATIVE_BATCH_DECODER, "the native batch decoder was not built (setup.py needs a C compiler)"
    from broker.entry_format._batch_decoder import decode_batch as native_decode_batch

    metadata = b"\x12\x01\xff\x12\x01a\x18\x01"
    buf = U32.pack(len(metadata)) + metadata + b"x"
    assert native_decode_batch(buf, 1, 0, 0) is None
    with pytest.raises(CorruptEntry):
        batch.decode_batch(buf, 1, 0, 0)
    valid = b"\x12\x01b\x12\x01a\x18\x01"  # both UTF-8: the last key wins, whoever decodes
    buf = U32.pack(len(valid)) + valid + b"x"
    assert batch.decode_batch(buf, 1, 0, 0)[0].key == "a"


def _with_fixed_checksum(data: bytearray) -> bytearray:
    """``data`` with its 0x0e01 checksum recomputed (when its headers are still readable), so a
    change inside the metadata reaches the field parser instead of failing the checksum."""
    if len(data) >= 6 and data[:2] == b"\x0e\x02":
        start = 6 + struct.unpack_from(">I", data, 2)[0]
        if start + 10 <= len(data) and data[start:start + 2] == b"\x0e\x01":
            struct.pack_into(">I", data, start + 2, crc32c.crc32c(bytes(data[start + 6:])))
    return data


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=st.lists(st.none() | texts, min_size=1, max_size=3), batched=st.booleans(),
       properties=st.booleans(), compressed=st.booleans(), key_b64=st.booleans(),
       event_time=st.none() | st.integers(min_value=0, max_value=UINT64_MAX),
       ordering_key=st.none() | st.binary(max_size=4),
       deliver_at=st.none() | st.integers(min_value=0, max_value=(1 << 63) - 1),
       sequence_id=st.integers(min_value=0, max_value=UINT64_MAX - 3),
       index=st.integers(min_value=0, max_value=UINT64_MAX),
       edits=st.lists(st.tuples(st.integers(min_value=0, max_value=400), st.integers(min_value=0, max_value=255)),
                      max_size=3),
       cut=st.none() | st.integers(min_value=0, max_value=400), fix_checksum=st.booleans(),
       client_form=st.booleans(), crc_instruction=st.booleans())
def test_the_native_common_entry_check_returns_what_the_python_check_returns(
        keys: list[str | None], batched: bool, properties: bool, compressed: bool, key_b64: bool,
        event_time: int | None, ordering_key: bytes | None, deliver_at: int | None, sequence_id: int, index: int,
        edits: list[tuple[int, int]], cut: int | None, fix_checksum: bool, client_form: bool,
        crc_instruction: bool) -> None:
    """``_common_entry.c`` against ``_python_common_batch`` and ``_python_parse_common_metadata`` on
    the entries the broker stores (batched or as Pulsar's clients send one message, with and
    without the fields that leave an entry to the general decoder), stored or as a client sends
    them (no broker prefix), and on those entries changed byte by byte and cut short, with the
    checksum recomputed or not, its CRC32C computed by the processor's instruction or by the
    ``crc32c`` package: the same tuple, or None for both."""
    from broker.entry_format import common_entry

    assert common_entry.NATIVE_COMMON_ENTRY, "the native common-entry check was not built (setup.py needs a C compiler)"
    from broker.entry_format._common_entry import use_crc_instruction

    use_crc_instruction(crc_instruction)
    try:
        _check_common_entry(keys, batched, properties, compressed, key_b64, event_time, ordering_key, deliver_at,
                            sequence_id, index, edits, cut, fix_checksum, client_form)
    finally:
        use_crc_instruction(True)


def _check_common_entry(keys: list[str | None], batched: bool, properties: bool, compressed: bool, key_b64: bool,
                        event_time: int | None, ordering_key: bytes | None, deliver_at: int | None, sequence_id: int,
                        index: int, edits: list[tuple[int, int]], cut: int | None, fix_checksum: bool,
                        client_form: bool) -> None:
    from broker.entry_format import common_entry
    from broker.entry_format._common_entry import common_batch as native_common_batch
    from broker.entry_format._common_entry import common_metadata as native_common_metadata

    messages = [Message(b"payload-%d" % i, key=key, properties={"p": "v"} if properties else {},
                        key_b64_encoded=key_b64 and key is not None, event_time_ms=event_time,
                        ordering_key=ordering_key) for i, key in enumerate(keys)]
    if event_time is not None and event_time >= 1 << 63:
        messages = [m._replace(event_time_ms=None) for m in messages]
    entry = encode(messages, sequence_id=sequence_id, deliver_at_time_ms=deliver_at,
                   compression=Compression.ZLIB if compressed else Compression.NONE)
    if not batched and len(messages) == 1:
        entry = as_unbatched(entry) or entry
    data = bytearray(entry if client_form else with_broker_entry_metadata(entry, 9, index))
    for position, value in edits:
        data[position % len(data)] = value
    if cut is not None:
        del data[cut:]
    if fix_checksum:
        data = _with_fixed_checksum(data)
    stored = bytes(data)
    assert native_common_batch(stored) == common_entry._python_common_batch(stored)
    metadata_at = 0 if client_form or len(stored) < 6 else 6 + struct.unpack_from(">I", stored, 2)[0]
    assert native_common_metadata(stored, metadata_at) == _python_metadata_or_none(stored, metadata_at)


def _python_metadata_or_none(data: bytes, start: int) -> object:
    """``_python_parse_common_metadata``, with what it raises for a malformed entry as None (what
    its callers make of it)."""
    from broker.entry_format import common_entry

    try:
        return common_entry._python_parse_common_metadata(data, start)
    except (IndexError, ValueError, CorruptEntry, struct.error):
        return None


@settings(max_examples=1000, deadline=None)
@given(body=st.binary(max_size=80), fix_checksum=st.booleans())
def test_the_native_common_entry_check_refuses_what_the_python_check_refuses(body: bytes, fix_checksum: bool) -> None:
    """Arbitrary bytes after a broker prefix's magic: both checks agree on each."""
    from broker.entry_format import common_entry

    assert common_entry.NATIVE_COMMON_ENTRY, "the native common-entry check was not built (setup.py needs a C compiler)"
    from broker.entry_format._common_entry import common_batch as native_common_batch
    from broker.entry_format._common_entry import common_metadata as native_common_metadata

    data = bytes(_with_fixed_checksum(bytearray(b"\x0e\x02" + body))) if fix_checksum else b"\x0e\x02" + body
    assert native_common_batch(data) == common_entry._python_common_batch(data)
    client = bytearray(b"\x0e\x01" + body)
    if fix_checksum and len(client) >= 10:
        struct.pack_into(">I", client, 2, crc32c.crc32c(bytes(client[6:])))
    assert native_common_metadata(bytes(client), 0) == _python_metadata_or_none(bytes(client), 0)


@pytest.mark.parametrize(("fields", "index"), [
    ({"deliver_at_time": -5}, 9),  # int64 below zero: ten bytes on the wire, read back signed
    ({"deliver_at_time": (1 << 62) + 7}, 9),
    ({"num_messages_in_batch": -1}, UINT64_MAX),  # a count past int32 (as its varint says)
    ({"num_messages_in_batch": 3}, 1),  # more messages than the index allows
    ({"event_time": UINT64_MAX, "partition_key": "k", "ordering_key": b"o", "partition_key_b64_encoded": True}, 9),
    ({"schema_version": b"\x00\x01", "highest_sequence_id": 12}, 9),
])
def test_the_native_common_entry_check_agrees_on_hand_made_metadata(fields: dict[str, Any], index: int) -> None:
    """Metadata no encoder here writes, made with protobuf itself: both checks agree, field by field."""
    from broker.entry_format import common_entry

    assert common_entry.NATIVE_COMMON_ENTRY, "the native common-entry check was not built (setup.py needs a C compiler)"
    from broker.entry_format._common_entry import common_batch as native_common_batch
    from broker.entry_format._common_entry import common_metadata as native_common_metadata

    metadata = pb.MessageMetadata(producer_name="p", sequence_id=4, publish_time=PUBLISH_MS, **fields)
    body = metadata.SerializeToString()
    rest = struct.pack(">I", len(body)) + body + b"payload"
    entry = struct.pack(">HI", MAGIC_CRC32C, crc32c.crc32c(rest)) + rest
    data = with_broker_entry_metadata(entry, 9, index)
    expected = common_entry._python_common_batch(data)
    assert native_common_batch(data) == expected
    assert native_common_metadata(entry, 0) == _python_metadata_or_none(entry, 0)
    if fields.get("deliver_at_time") == -5:
        assert expected is not None and expected[4] == -5


@pytest.mark.parametrize("last_byte", [0x00, 0x01, 0x02, 0x7F, 0x81])
def test_the_native_readers_take_a_ten_byte_varint_as_the_python_reader_does(last_byte: int) -> None:
    """A sequence id written in ten bytes: up to 2^64 - 1 it is read, wider (or longer) it is
    refused, by the native check (``_wire.h``) exactly as by wire.py's reader."""
    from broker.entry_format import common_entry

    assert common_entry.NATIVE_COMMON_ENTRY, "the native common-entry check was not built (setup.py needs a C compiler)"
    from broker.entry_format._common_entry import common_metadata as native_common_metadata

    body = b"\x0a\x01p" + b"\x10" + b"\xff" * 9 + bytes([last_byte]) + b"\x18\x01"
    rest = struct.pack(">I", len(body)) + body + b"payload"
    entry = struct.pack(">HI", MAGIC_CRC32C, crc32c.crc32c(rest)) + rest
    expected = _python_metadata_or_none(entry, 0)
    assert native_common_metadata(entry, 0) == expected
    assert (expected is not None) == (last_byte <= 0x01)


@pytest.mark.parametrize("fields", [
    b"\x08\x07\x10\x09",  # the broker's own order
    b"\x10\x09\x08\x07",  # the other order
    b"\x08\x07\x10\x09\x10\x0b",  # a repeated field: the last one wins
    b"\x08\x07",  # no index: corrupt
    b"\x08\x07\x10\x09\x18\x01",  # an unknown field: the Python parser skips it
    b"\x08" + b"\xff" * 9 + b"\x01\x10\x09",  # a ten-byte varint, 2^64 - 1
    b"\x08" + b"\xff" * 9 + b"\x02\x10\x09",  # past 2^64: corrupt
    b"\x08\x07\x10",  # cut inside the index's varint
])
def test_the_native_broker_prefix_reads_what_the_python_parser_reads(fields: bytes) -> None:
    """``_common_entry.broker_prefix`` reads the usual prefix (both fields, in either order, the
    last of each winning) and leaves every other one to the Python parser, which then gives the
    same metadata or the same ``CorruptEntry``; ``prefix_fields`` (the read path's) agrees."""
    from broker.entry_format import broker_metadata

    assert broker_metadata.NATIVE_BROKER_PREFIX, "the native prefix reader was not built (setup.py needs a C compiler)"
    from broker.entry_format._common_entry import broker_prefix as native_broker_prefix

    data = struct.pack(">HI", 0x0E02, len(fields)) + fields + b"\x0e\x01rest of the entry"
    try:
        expected = broker_metadata._split_prefix_general(data)
    except CorruptEntry:
        assert native_broker_prefix(data) is None
        with pytest.raises(CorruptEntry):
            broker_metadata.prefix_fields(data)
        return
    meta, end = expected
    assert meta is not None
    native = native_broker_prefix(data)
    assert native is None or native == (meta.broker_timestamp_ms, meta.index, end)
    assert (native is None) == (b"\x18" in fields)
    assert broker_metadata.split_prefix(data) == expected
    assert broker_metadata.prefix_fields(data) == (meta.broker_timestamp_ms, meta.index)


def test_an_entry_without_a_prefix_has_no_prefix_fields() -> None:
    from broker.entry_format import broker_metadata

    with pytest.raises(CorruptEntry, match="no broker entry metadata"):
        broker_metadata.prefix_fields(b"\x0e\x01" + b"\x00" * 12)


class _Payloads:
    """A ledger handle that answers any range with the same payloads."""

    def __init__(self, payloads: list[Any]) -> None:
        self.payloads = payloads

    def read(self, first: int, last: int) -> list[Any]:
        return self.payloads[:last - first + 1]


def _stored(index: int, fields: bytes = b"", timestamp: int = 1_700_000_000_000) -> bytes:
    from broker.entry_format.broker_metadata import broker_prefix

    prefix = broker_prefix(timestamp, index)
    if fields:  # another shape of prefix: the usual fields, then these
        body = prefix[6:] + fields
        prefix = struct.pack(">HI", 0x0E02, len(body)) + body
    return prefix + b"\x0e\x01rest of the entry"


@pytest.mark.parametrize("payloads", [
    [_stored(i) for i in range(50, 60)],
    [_stored(52), _stored(53), _stored(56, b"\x18\x01"), _stored(57), _stored(58)],  # a field the C reader leaves
    [_stored(52), bytearray(_stored(53)), _stored(54)],  # not bytes
    [_stored(52), _stored(2**63 + 5), _stored(2**63 + 6)],  # an index past a signed 64-bit offset
    [_stored(60, timestamp=2**64 - 1)],
    [],
])
def test_a_runs_entries_made_natively_are_the_entries_the_python_loop_makes(
        payloads: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """``_common_entry.stored_entries`` makes a run's entries (``LedgerReads._read_run``) as the
    Python loop does: the same ``Entry`` and ``Position`` values and types, each first offset
    the index before + 1, stopping at an entry it leaves to the loop, which goes on from there."""
    from broker import managed_ledger_reads
    from broker.entry import Entry
    from broker.managed_ledger_reads import LedgerReads
    from broker.message_id import Position
    from broker.offset_index import LedgerInfo

    assert managed_ledger_reads.NATIVE_STORED_ENTRIES, "the native run reader was not built (needs a C compiler)"
    info = LedgerInfo(7, first_offset=0, entries=1000, size_bytes=1000 * 40)
    handle = _Payloads(payloads)
    native = LedgerReads._read_run(None, handle, info, 100, 100 + len(payloads) - 1, 50, None)  # type: ignore[arg-type]
    monkeypatch.setattr(managed_ledger_reads, "NATIVE_STORED_ENTRIES", False)
    python = LedgerReads._read_run(None, handle, info, 100, 100 + len(payloads) - 1, 50, None)  # type: ignore[arg-type]
    assert native == python and len(native) == len(payloads)
    assert all(type(e) is Entry and type(e.position) is Position for e in native)
    assert [hash(e.position) for e in native] == [hash(Position(7, 100 + i)) for i in range(len(payloads))]
    assert [e.first_offset for e in native] == ([50] + [e.last_offset + 1 for e in native[:-1]] if native else [])


def test_the_native_run_reader_stops_at_a_corrupt_entry_and_refuses_what_is_not_its_arguments() -> None:
    from broker.entry import Entry
    from broker.entry_format._common_entry import stored_entries
    from broker.message_id import Position

    made = stored_entries([_stored(52), b"\x0e\x01no prefix", _stored(54)], 7, 100, 52, Entry, Position)
    assert made == [Entry(Position(7, 100), _stored(52), 52, 52, 1_700_000_000_000)]  # the loop says it is corrupt
    with pytest.raises(TypeError):
        stored_entries((_stored(52),), 7, 100, 52, Entry, Position)  # type: ignore[arg-type]  # a tuple
    with pytest.raises(TypeError):
        stored_entries([_stored(52)], 7, 100, 52, dict, Position)  # not a tuple type
    with pytest.raises(AttributeError):
        stored_entries([_stored(52)], 7, 100, 52, Entry, Entry)  # no attributes of those names

    class Unslotted:
        ledger_id = entry_id = 0

    with pytest.raises(TypeError, match="slot"):
        stored_entries([_stored(52)], 7, 100, 52, Entry, Unslotted)
    with pytest.raises(OverflowError):
        stored_entries([_stored(52)], 2**64, 100, 52, Entry, Position)
