"""``storage/_entry_records.c`` reads an entry log's records ahead exactly as ``entry_log.py``
does: the same records from random chunks (several ledgers, cut short anywhere, bytes flipped
anywhere), the same CRC32C as the ``crc32c`` package for every length, and the same stop before
the first record it cannot vouch for."""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator

import crc32c
import pytest

from storage import entry_log
from storage.entry_log import EntryLogger, record_crc

ROUNDS = 400


def native_built() -> None:
    assert entry_log.NATIVE_RECORDS, "the native record reader was not built (setup.py needs a C compiler)"


def record(ledger_id: int, entry_id: int, data: bytes) -> bytes:
    return struct.pack(">IQQI", len(data), ledger_id, entry_id, record_crc(ledger_id, entry_id, data)) + data


def random_chunk(rng: random.Random) -> tuple[bytes, int]:
    """Records of mostly one ledger after a first record's bytes (its end is returned)."""
    first = rng.randbytes(rng.randrange(0, 40))
    parts = [first]
    for entry_id in range(rng.randrange(0, 12)):
        ledger_id = 7 if rng.random() < 0.9 else rng.choice([8, 2**64 - 1])
        parts.append(record(ledger_id, entry_id, rng.randbytes(rng.choice([0, 1, 7, 8, 9, 63, 64, 65, 300]))))
    return b"".join(parts), len(first)


@pytest.fixture(params=["instruction", "package"])
def crc_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test once with the processor's CRC32C instruction (where it has one) and once
    through the crc32c package."""
    native_built()
    from storage._entry_records import use_crc_instruction

    used = use_crc_instruction(request.param == "instruction")
    if request.param == "package":
        assert not used
    try:
        yield request.param
    finally:
        use_crc_instruction(True)


@pytest.mark.parametrize("seed", range(ROUNDS))
def test_the_native_reader_returns_what_the_python_reader_returns(seed: int, crc_path: str) -> None:
    from storage._entry_records import parse_records

    rng = random.Random(seed)
    chunk, start = random_chunk(rng)
    mutated = bytearray(chunk)
    for _ in range(rng.choice([0, 0, 1, 2])):
        if mutated:
            mutated[rng.randrange(len(mutated))] ^= 1 << rng.randrange(8)
    cut = bytes(mutated[: len(mutated) - rng.choice([0, 0, 1, 5, 30])])
    limit = rng.choice([0, 1, 3, 100])
    assert parse_records(cut, start, 7, limit) == EntryLogger._parse_ahead(cut, start, 7, limit)


def test_the_native_crc_is_the_crc32c_packages_for_every_length(crc_path: str) -> None:
    from storage._entry_records import parse_records

    rng = random.Random(3)
    for size in range(0, 200):
        data = rng.randbytes(size)
        crc = crc32c.crc32c(data, crc32c.crc32c(struct.pack(">QQ", 5, size)))
        good = struct.pack(">IQQI", size, 5, size, crc) + data
        bad = struct.pack(">IQQI", size, 5, size, crc ^ 1) + data
        assert parse_records(good, 0, 5, 1) == [(size, data)]
        assert parse_records(bad, 0, 5, 1) == []


def test_the_native_reader_refuses_what_is_not_a_chunk() -> None:
    native_built()
    from storage._entry_records import parse_records

    with pytest.raises(TypeError):
        parse_records(bytearray(30), 0, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        parse_records(b"", -1, 1, 1)
    assert parse_records(b"", 10, 1, 1) == []  # a position past the end reads nothing
