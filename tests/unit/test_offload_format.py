"""The offloaded format over a real store (the filesystem driver: obstore's LocalStore on a
temporary directory), from an in-memory ledger.

Checks: a ledger of entries of varied sizes (empty ones and ones larger than a block among
them) reads back exactly, by every single entry, every run across block boundaries and random
ranges, with the ids the ledger had; objects are ``{ledger}-{uuid}`` and ``{ledger}-{uuid}-index``;
a sequential reader fetches each block once; a flipped byte, a truncated data object, a
garbled or missing index each raise ``OffloadReadError`` naming the ledger and the object, and
the blocks that are intact still read; a source that fails mid-offload leaves no index; delete
and delete_orphans remove attempts; offloading 128 MiB raises the process's peak RSS by far
less than the ledger's size; Pulsar's keys parse, and bad settings fail in one line; every
driver builds its store (GCS and Azure only that far: no server of theirs runs here) and a
missing Azure account or an unreadable GCS key file is named; a copy is opened and deleted
where its recorded driver metadata says, even after the settings changed.
"""

from __future__ import annotations

import random
import resource
import tracemalloc
from pathlib import Path

import pytest

from broker.errors import ERRORS_BY_CODE, NoSuchEntry, NotAllowed, OffloadConfigError, OffloadError, OffloadReadError
from broker.limits import OFFLOAD_UPLOAD_CHUNK_BYTES, OFFLOAD_UPLOAD_PART_BYTES, KiB, MiB
from broker.offload import BlobStoreOffloader, OffloadSettings, create_offloader
from broker.offload.format import BLOCK_HEADER_BYTES, ENTRY_HEADER_BYTES, OffloadIndex
from broker.offload.stores import open_store

BLOCK_BYTES = 4096


class BytesLedger:
    """A closed ledger held in memory: the ``ReadHandle`` face of a ``LedgerHandle``."""

    def __init__(self, ledger_id: int, entries: list[bytes], *, fail_at: int | None = None) -> None:
        self.ledger_id = ledger_id
        self.entries = entries
        self.fail_at = fail_at
        self.reads: list[tuple[int, int]] = []

    @property
    def last_add_confirmed(self) -> int:
        return len(self.entries) - 1

    @property
    def length_bytes(self) -> int:
        return sum(len(e) for e in self.entries)

    def read(self, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        self.reads.append((first_entry_id, last_entry_id))
        if self.fail_at is not None and first_entry_id <= self.fail_at <= last_entry_id:
            raise NotAllowed(f"entry {self.ledger_id}:{self.fail_at} is unreadable")
        return self.entries[first_entry_id:last_entry_id + 1]


def varied_entries(count: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    sizes = [0, 1, BLOCK_BYTES * 3] + [rng.choice([0, 5, 100, 700, 1500, 3000]) for _ in range(count - 3)]
    return [rng.randbytes(size) for size in sizes]


def fs_offloader(root: Path, **overrides: object) -> BlobStoreOffloader:
    fields: dict[str, object] = {"driver": "filesystem", "file_system_uri": f"file://{root}",
                                 "max_block_size_bytes": BLOCK_BYTES, "read_buffer_size_bytes": 3 * BLOCK_BYTES}
    return create_offloader(OffloadSettings(**{**fields, **overrides}))  # type: ignore[arg-type]


def test_a_ledger_reads_back_exactly_by_entry_by_run_and_by_random_range(tmp_path: Path) -> None:
    entries = varied_entries(600)
    offloader = fs_offloader(tmp_path / "store")
    offloader.offload(BytesLedger(17, entries), "u1", {"ManagedLedgerName": "t/ns/x"})
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["17-u1", "17-u1-index"]
    handle = offloader.open(17, "u1", offloader.driver_metadata())
    assert (handle.ledger_id, handle.last_add_confirmed, handle.length_bytes) == (17, 599, sum(map(len, entries)))
    index = OffloadIndex.decode((tmp_path / "store" / "17-u1-index").read_bytes())
    assert len(index.blocks) > 50 and index.extra_metadata == {"ManagedLedgerName": "t/ns/x"}
    assert all(b.length <= BLOCK_BYTES or b.length == BLOCK_HEADER_BYTES + ENTRY_HEADER_BYTES + BLOCK_BYTES * 3
               for b in index.blocks)
    assert handle.read(0, 599) == entries
    assert [handle.read(i, i)[0] for i in range(600)] == entries
    for block in index.blocks[1:]:
        edge = block.first_entry_id
        assert handle.read(edge - 1, min(599, edge + 1)) == entries[edge - 1:edge + 2]
    rng = random.Random(3)
    for _ in range(300):
        first = rng.randrange(600)
        last = rng.randrange(first, 600)
        assert handle.read(first, last) == entries[first:last + 1], (first, last)
    with pytest.raises(NoSuchEntry):
        handle.read(599, 600)


def test_a_sequential_reader_fetches_each_block_once(tmp_path: Path) -> None:
    entries = varied_entries(400)
    offloader = fs_offloader(tmp_path / "store")
    offloader.offload(BytesLedger(3, entries), "u", {})
    handle = offloader.open(3, "u", {})
    assert [handle.read(i, i)[0] for i in range(400)] == entries
    blocks = len(OffloadIndex.decode((tmp_path / "store" / "3-u-index").read_bytes()).blocks)
    stats = offloader.statistics()
    assert stats["reads"] == blocks and stats["errors"] == 0
    assert stats["offloads"] == 1 and stats["objects_written"] == 2
    assert stats["bytes_written"] == sum(p.stat().st_size for p in (tmp_path / "store").iterdir())


def test_an_empty_ledger_offloads_and_opens_with_nothing_to_read(tmp_path: Path) -> None:
    offloader = fs_offloader(tmp_path / "store")
    offloader.offload(BytesLedger(4, []), "u", {})
    handle = offloader.open(4, "u", {})
    assert handle.last_add_confirmed == -1
    with pytest.raises(NoSuchEntry):
        handle.read(0, 0)


def test_a_flipped_byte_or_a_truncated_data_object_is_an_error_naming_the_ledger(tmp_path: Path) -> None:
    entries = varied_entries(300)
    offloader = fs_offloader(tmp_path / "store")
    offloader.offload(BytesLedger(21, entries), "u", {})
    data = tmp_path / "store" / "21-u"
    raw = bytearray(data.read_bytes())
    index = OffloadIndex.decode((tmp_path / "store" / "21-u-index").read_bytes())
    target = index.blocks[5]
    raw[target.offset + target.length - 1] ^= 0x01
    data.write_bytes(bytes(raw))
    handle = offloader.open(21, "u", {})
    assert handle.read(0, target.first_entry_id - 1) == entries[:target.first_entry_id]
    with pytest.raises(OffloadReadError, match=r"ledger 21 .*object 21-u .*checksum mismatch"):
        handle.read(target.first_entry_id, target.first_entry_id)
    data.write_bytes(bytes(raw[:index.blocks[-1].offset + 10]))
    with pytest.raises(OffloadReadError, match=r"ledger 21 .*21-u.*truncated"):
        fs_offloader(tmp_path / "store").open(21, "u", {}).read(299, 299)
    assert offloader.statistics()["errors"] == 1 and "ledger 21" in offloader.statistics()["last_error"]


def test_a_garbled_or_missing_index_is_an_error_naming_the_ledger(tmp_path: Path) -> None:
    offloader = fs_offloader(tmp_path / "store")
    offloader.offload(BytesLedger(8, varied_entries(50)), "u", {})
    index = tmp_path / "store" / "8-u-index"
    raw = bytearray(index.read_bytes())
    raw[20] ^= 0xFF
    index.write_bytes(bytes(raw))
    with pytest.raises(OffloadReadError, match=r"ledger 8 .*8-u-index.*checksum mismatch"):
        offloader.open(8, "u", {})
    index.unlink()
    with pytest.raises(OffloadReadError, match=r"ledger 8 .*8-u-index.*does not exist"):
        offloader.open(8, "u", {})


def test_a_source_failing_mid_offload_leaves_no_index(tmp_path: Path) -> None:
    offloader = fs_offloader(tmp_path / "store")
    with pytest.raises(OffloadError, match=r"ledger 9 .*entry 9:250 is unreadable"):
        offloader.offload(BytesLedger(9, varied_entries(400), fail_at=250), "u", {})
    names = [p.name for p in (tmp_path / "store").iterdir()]
    assert "9-u-index" not in names
    with pytest.raises(OffloadReadError):
        offloader.open(9, "u", {})


def test_delete_and_delete_orphans_remove_attempts(tmp_path: Path) -> None:
    offloader = fs_offloader(tmp_path / "store")
    for uuid in ("a", "b", "c"):
        offloader.offload(BytesLedger(5, varied_entries(20)), uuid, {})
    offloader.offload(BytesLedger(50, varied_entries(20)), "z", {})
    (tmp_path / "store" / "5-c-index").unlink()
    assert offloader.list_attempts(5) == {"a": True, "b": True, "c": False}
    assert sorted(offloader.delete_orphans(5, keep_uuid="b")) == ["a", "c"]
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["5-b", "5-b-index", "50-z", "50-z-index"]
    offloader.delete(5, "b", {})
    offloader.delete(5, "b", {})
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["50-z", "50-z-index"]


class PatternLedger:
    """A large ledger generated on demand: ``entry_count`` entries of ``entry_bytes`` each."""

    def __init__(self, entry_count: int, entry_bytes: int) -> None:
        self.ledger_id = 77
        self.entry_count = entry_count
        self.entry_bytes = entry_bytes

    @property
    def last_add_confirmed(self) -> int:
        return self.entry_count - 1

    @property
    def length_bytes(self) -> int:
        return self.entry_count * self.entry_bytes

    def entry(self, entry_id: int) -> bytes:
        return entry_id.to_bytes(8, "big") * (self.entry_bytes // 8)

    def read(self, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        return [self.entry(i) for i in range(first_entry_id, last_entry_id + 1)]


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_offloading_128_mib_holds_a_bounded_number_of_bytes(tmp_path: Path) -> None:
    """The peak RSS of this process may grow by the offload's bound (one 1 MiB block, one run,
    three 5 MiB upload parts, the store's own buffers), not by the ledger's 128 MiB."""
    source = PatternLedger(entry_count=2048, entry_bytes=64 * 1024)
    offloader = fs_offloader(tmp_path / "store", max_block_size_bytes=1024 * 1024,
                             read_buffer_size_bytes=1024 * 1024)
    before = _peak_rss_bytes()
    offloader.offload(source, "big", {})
    grown = _peak_rss_bytes() - before
    assert (tmp_path / "store" / "77-big").stat().st_size > source.length_bytes
    assert grown < 48 * 1024 * 1024, f"peak RSS grew by {grown / 2**20:.1f} MiB"
    handle = offloader.open(77, "big", {})
    for entry_id in (0, 1, 1023, 2047):
        assert handle.read(entry_id, entry_id) == [source.entry(entry_id)]


def test_pulsar_keys_parse_and_bad_settings_fail_in_one_line() -> None:
    s3 = OffloadSettings.from_config({
        "managedLedgerOffloadDriver": "aws-s3", "s3ManagedLedgerOffloadBucket": "b1",
        "s3ManagedLedgerOffloadRegion": "eu-west-1", "s3ManagedLedgerOffloadServiceEndpoint": "http://minio:9000",
        "s3ManagedLedgerOffloadMaxBlockSizeInBytes": "8388608", "managedLedgerOffloadReadBufferSizeInBytes": "2048",
        "managedLedgerOffloadBucket": "ignored-for-s3"})
    assert (s3.driver, s3.bucket, s3.region, s3.service_endpoint) == ("aws-s3", "b1", "eu-west-1",
                                                                     "http://minio:9000")
    assert (s3.max_block_size_bytes, s3.read_buffer_size_bytes) == (8388608, 2048)
    gcs = OffloadSettings.from_config({
        "managedLedgerOffloadDriver": "google-cloud-storage", "gcsManagedLedgerOffloadBucket": "g",
        "gcsManagedLedgerOffloadRegion": "europe-west3",
        "gcsManagedLedgerOffloadServiceAccountKeyFile": "/etc/gcs.json"})
    assert (gcs.bucket, gcs.region, gcs.gcs_service_account_key_file, gcs.max_block_size_bytes) == (
        "g", "europe-west3", "/etc/gcs.json", 64 * 1024 * 1024)
    fs = OffloadSettings.from_config({"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": "file:///x"})
    assert fs.file_system_uri == "file:///x" and fs.read_buffer_size_bytes == 1024 * 1024
    assert not OffloadSettings.from_config({}).enabled
    for config, message in [
        ({"managedLedgerOffloadDriver": "jclouds"},
         "managedLedgerOffloadDriver 'jclouds' is not one of aws-s3, s3, google-cloud-storage, azureblob, "
         "filesystem"),
        ({"managedLedgerOffloadDriver": "s3"}, "needs a bucket (s3ManagedLedgerOffloadBucket)"),
        ({"managedLedgerOffloadDriver": "filesystem"}, "needs fileSystemURI"),
        ({"managedLedgerOffloadDriver": "s3", "s3ManagedLedgerOffloadBucket": "b",
          "s3ManagedLedgerOffloadMaxBlockSizeInBytes": "64MB"}, "s3ManagedLedgerOffloadMaxBlockSizeInBytes '64MB'"),
        ({"managedLedgerOffloadDriver": "s3", "s3ManagedLedgerOffloadBucket": "b",
          "s3ManagedLedgerOffloadMaxBlockSizeInBytes": "10"}, "max block size 10 is outside"),
    ]:
        with pytest.raises(OffloadConfigError) as caught:
            OffloadSettings.from_config(config)
        assert message in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(OffloadConfigError, match="only a local directory or a file:// URI"):
        create_offloader(OffloadSettings(driver="filesystem", file_system_uri="hdfs://nn:8020/offload"))


def test_offload_errors_are_registered_with_their_codes() -> None:
    assert ERRORS_BY_CODE["offload_error"] is OffloadError
    assert ERRORS_BY_CODE["offload_read_error"] is OffloadReadError
    assert ERRORS_BY_CODE["offload_config_error"] is OffloadConfigError
    assert OffloadReadError("x").http_status == 503


def test_every_driver_builds_its_store_and_names_what_is_missing(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Construction only: GCS and Azure have no server here to offload to."""
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT", raising=False)
    s3 = create_offloader(OffloadSettings(driver="aws-s3", bucket="b", region="eu-west-1"))
    assert s3.driver_metadata() == {"bucket": "b", "region": "eu-west-1"}
    assert create_offloader(OffloadSettings(driver="google-cloud-storage", bucket="g")).driver_name == \
        "google-cloud-storage"
    (tmp_path / "key.json").write_text('{"client_email": ""}')
    with pytest.raises(OffloadConfigError, match="gcsManagedLedgerOffloadServiceAccountKeyFile"):
        create_offloader(OffloadSettings(driver="google-cloud-storage", bucket="g",
                                         gcs_service_account_key_file=str(tmp_path / "key.json")))
    with pytest.raises(OffloadConfigError, match=r"azureblob offload store \(bucket c\).*AZURE_STORAGE_ACCOUNT"):
        create_offloader(OffloadSettings(driver="azureblob", bucket="c"))
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "account")
    monkeypatch.setenv("AZURE_STORAGE_ACCESS_KEY", "c2VjcmV0LWtleQ==")
    azure = create_offloader(OffloadSettings(driver="azureblob", bucket="c"))
    assert azure.driver_metadata() == {"bucket": "c"}


def test_a_copy_reads_and_deletes_where_its_driver_metadata_says(tmp_path: Path) -> None:
    """Settings changed since the offload (another directory): the recorded place still serves."""
    entries = varied_entries(80)
    before = fs_offloader(tmp_path / "then")
    before.offload(BytesLedger(90, entries), "u", {})
    recorded = before.driver_metadata()
    now = fs_offloader(tmp_path / "now")
    assert now.open(90, "u", recorded).read(0, 79) == entries
    with pytest.raises(OffloadReadError, match=r"ledger 90 .*file://.*/now"):
        now.open(90, "u", now.driver_metadata())
    now.delete(90, "u", recorded)
    assert list((tmp_path / "then").iterdir()) == []


def test_fetched_blocks_are_bounded_for_all_copies_together(tmp_path: Path) -> None:
    """Blocks read from many offloaded copies are held in one cache bounded in bytes for them
    all (before: each open copy kept up to a block of its own, so 8 open copies held 8 blocks
    and more), and every copy still reads back exactly."""
    settings = OffloadSettings(driver="filesystem", file_system_uri=f"file://{tmp_path}",
                               max_block_size_bytes=BLOCK_BYTES, read_buffer_size_bytes=3 * BLOCK_BYTES)
    capacity = 2 * BLOCK_BYTES
    offloader = BlobStoreOffloader(settings, open_store(settings), block_cache_bytes=capacity)
    copies = []
    for ledger_id in range(1, 9):
        offloader.offload(BytesLedger(ledger_id, [bytes([ledger_id]) * 1000] * 40), f"u{ledger_id}", {})
        copies.append(offloader.open(ledger_id, f"u{ledger_id}", {}))
    for copy in copies:
        assert copy.read(0, copy.last_add_confirmed) == [bytes([copy.ledger_id]) * 1000] * 40
        assert 0 < offloader.blocks.size_bytes <= capacity + BLOCK_BYTES


def test_a_block_of_small_entries_holds_about_its_own_bytes_while_it_is_built(tmp_path: Path) -> None:
    """A ledger of 24-byte entries (36 bytes each in a block) in 2 MiB blocks: the offload's
    Python objects peak at about one block, the upload part being filled
    (``OFFLOAD_UPLOAD_PART_BYTES``) and a chunk or two being joined, not at an object per entry
    and per entry header kept until its block is sealed, nor at two blocks (before: 16.4 MiB
    here, 21.2 MiB with 4 MiB blocks; after: 7.0 MiB for both)."""
    block_bytes = 2 * MiB
    source = PatternLedger(entry_count=5 * block_bytes // (2 * (ENTRY_HEADER_BYTES + 24)), entry_bytes=24)
    offloader = fs_offloader(tmp_path / "store", max_block_size_bytes=block_bytes, read_buffer_size_bytes=64 * KiB)
    tracemalloc.start()
    try:
        offloader.offload(source, "small", {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    bound = block_bytes + OFFLOAD_UPLOAD_PART_BYTES + 2 * OFFLOAD_UPLOAD_CHUNK_BYTES
    assert peak < bound, f"the offload held {peak / MiB:.1f} MiB for blocks of {block_bytes / MiB:.0f} MiB"
    handle = offloader.open(77, "small", {})
    for entry_id in (0, 1, source.entry_count // 2, source.entry_count - 1):
        assert handle.read(entry_id, entry_id) == [source.entry(entry_id)]
