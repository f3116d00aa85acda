"""The offloader against an S3 API over HTTP (moto's standalone server, tests/offload_store.py),
the same code path a user runs against S3 or MinIO.

Checks: a ledger of a few thousand entries of varied sizes, in small blocks, reads back exactly
by every run, across every block boundary and by random ranges; a REAL ledger (a
``LedgerHandle`` over an embedded bookie) offloaded and read back equals ``handle.read``; a byte
flipped in the data object (through boto3) and a deleted index object raise
``OffloadReadError`` naming the ledger; wrong credentials, a missing bucket and a stopped
server raise ``OffloadError`` naming the ledger, the driver and the bucket, without the
secret; a stopped server and a hung one (SIGSTOP) within a bounded time; ``delete`` removes
every object of the attempt; a source failing after parts were uploaded leaves no object and
no open multipart upload; credentials come from an AWS credentials file too; a copy the
filesystem driver wrote is read and deleted by an offloader now configured for S3.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.bookkeeper.bookie import BookieClient, LocalBookie
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.errors import NotAllowed, OffloadError, OffloadReadError
from broker.metadata import InMemoryMetadataStore
from broker.offload import create_offloader
from broker.offload.format import OffloadIndex
from broker.offload.settings import OffloadSettings
from storage import LedgerStorage, StorageConfig
from tests.offload_store import MotoS3, running_moto_s3
from tests.unit.test_offload_format import BytesLedger, PatternLedger, varied_entries

STOPPED_STORE_ERROR_S_MAX = 20.0
"""A stopped server is reported within this (1 retry, 1 s connect timeout, 3 s retry budget)."""


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoS3]:
    with running_moto_s3() as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        yield server


def test_a_ledger_of_thousands_of_entries_reads_back_exactly(s3: MotoS3) -> None:
    entries = varied_entries(3000)
    offloader = create_offloader(s3.settings(max_block_size_bytes=32 * 1024, read_buffer_size_bytes=64 * 1024))
    offloader.offload(BytesLedger(42, entries), "attempt-1", {"ManagedLedgerName": "public/default/t"})
    assert s3.keys() == ["42-attempt-1", "42-attempt-1-index"]
    raw_index = s3.client().get_object(Bucket=s3.bucket, Key="42-attempt-1-index")["Body"].read()
    index = OffloadIndex.decode(raw_index)
    assert len(index.blocks) > 50 and index.last_add_confirmed == 2999
    handle = offloader.open(42, "attempt-1", offloader.driver_metadata())
    assert handle.read(0, 2999) == entries
    for first in range(0, 3000, 97):
        last = min(2999, first + 96)
        assert handle.read(first, last) == entries[first:last + 1]
    for block in index.blocks[1:]:
        edge = block.first_entry_id
        assert handle.read(edge - 1, edge) == entries[edge - 1:edge + 1]
    rng = random.Random(11)
    for _ in range(100):
        first = rng.randrange(3000)
        last = min(2999, first + rng.randrange(60))
        assert handle.read(first, last) == entries[first:last + 1]
    assert offloader.statistics()["errors"] == 0 and offloader.statistics()["reads"] >= len(index.blocks)


def test_a_real_ledger_reads_back_equal_to_its_handle(s3: MotoS3, tmp_path: Path) -> None:
    storage = LedgerStorage.open(str(tmp_path / "bookie"), StorageConfig.test_min())
    try:
        manager = LedgerManager(InMemoryMetadataStore(), BookieClient([LocalBookie("local", storage)]))
        writer = manager.create()
        payloads = varied_entries(1500, seed=5)
        for start in range(0, len(payloads), 100):
            writer.append(payloads[start:start + 100]).result(timeout=10)
        writer.close()
        source = manager.open(writer.ledger_id)
        offloader = create_offloader(s3.settings())
        offloader.offload(source, "real", {})
        copy = offloader.open(source.ledger_id, "real", {})
        assert (copy.last_add_confirmed, copy.length_bytes) == (source.last_add_confirmed, source.length_bytes)
        assert copy.read(0, source.last_add_confirmed) == source.read(0, source.last_add_confirmed) == payloads
        assert copy.read(700, 900) == source.read(700, 900)
    finally:
        storage.close()


def test_a_corrupt_data_object_or_a_deleted_index_is_an_error_naming_the_ledger(s3: MotoS3) -> None:
    offloader = create_offloader(s3.settings())
    offloader.offload(BytesLedger(7, varied_entries(400)), "u", {})
    client = s3.client()
    data = bytearray(client.get_object(Bucket=s3.bucket, Key="7-u")["Body"].read())
    data[len(data) // 2] ^= 0x40
    client.put_object(Bucket=s3.bucket, Key="7-u", Body=bytes(data))
    handle = offloader.open(7, "u", {})
    with pytest.raises(OffloadReadError, match=r"ledger 7 .*object 7-u on s3 bucket offload-bucket.*checksum"):
        handle.read(0, 399)
    client.delete_object(Bucket=s3.bucket, Key="7-u-index")
    with pytest.raises(OffloadReadError, match=r"ledger 7 .*7-u-index.*does not exist"):
        offloader.open(7, "u", {})


def test_wrong_credentials_and_a_missing_bucket_are_errors_without_the_secret(s3: MotoS3,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-0123456789")
    with pytest.raises(OffloadError) as refused:
        create_offloader(s3.settings()).offload(BytesLedger(3, varied_entries(50)), "u", {})
    message = str(refused.value)
    assert "ledger 3" in message and "s3 bucket offload-bucket" in message
    assert "refused the credentials" in message and "not-the-secret" not in message
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_access_key)
    with pytest.raises(OffloadError, match=r"ledger 3 .*s3 bucket no-such-bucket.*bucket does not exist"):
        create_offloader(s3.settings(bucket="no-such-bucket")).offload(BytesLedger(3, varied_entries(50)), "u", {})
    assert s3.keys() == []


def test_a_hung_store_is_an_error_within_the_request_timeout(s3: MotoS3) -> None:
    offloader = create_offloader(s3.settings(request_timeout_ms=1500))
    offloader.offload(BytesLedger(14, varied_entries(200)), "u", {})
    handle = offloader.open(14, "u", {})
    os.kill(s3.proc.pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        with pytest.raises(OffloadReadError, match=r"ledger 14 .*store is unreachable"):
            handle.read(150, 199)
        elapsed = time.monotonic() - started
    finally:
        os.kill(s3.proc.pid, signal.SIGCONT)
    assert elapsed < STOPPED_STORE_ERROR_S_MAX, f"the error took {elapsed:.1f} s"
    assert handle.read(150, 199) == varied_entries(200)[150:]


def test_a_stopped_store_is_an_error_within_a_bounded_time(s3: MotoS3) -> None:
    offloader = create_offloader(s3.settings())
    offloader.offload(BytesLedger(12, varied_entries(200)), "u", {})
    handle = offloader.open(12, "u", {})
    s3.stop()
    started = time.monotonic()
    with pytest.raises(OffloadReadError, match=r"ledger 12 .*store is unreachable"):
        handle.read(150, 199)
    with pytest.raises(OffloadError, match=r"ledger 13 .*store is unreachable"):
        offloader.offload(BytesLedger(13, varied_entries(50)), "v", {})
    elapsed = time.monotonic() - started
    assert elapsed < STOPPED_STORE_ERROR_S_MAX, f"errors took {elapsed:.1f} s"
    assert offloader.statistics()["errors"] == 2


def test_delete_removes_every_object_of_the_attempt(s3: MotoS3) -> None:
    offloader = create_offloader(s3.settings())
    for uuid in ("old", "kept"):
        offloader.offload(BytesLedger(30, varied_entries(100)), uuid, {})
    offloader.offload(BytesLedger(300, varied_entries(10)), "other", {})
    assert offloader.list_attempts(30) == {"old": True, "kept": True}
    assert offloader.delete_orphans(30, keep_uuid="kept") == ["old"]
    offloader.delete(30, "kept", {})
    offloader.delete(30, "kept", {})
    assert s3.keys() == ["300-other", "300-other-index"]


def test_credentials_come_from_an_aws_credentials_file_and_their_absence_is_named(
        s3: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[offload]\naws_access_key_id = {s3.access_key_id}\n"
                           f"aws_secret_access_key = {s3.secret_access_key}\n")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_PROFILE", "offload")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    entries = varied_entries(100)
    offloader = create_offloader(s3.settings())
    offloader.offload(BytesLedger(61, entries), "f", {})
    assert offloader.open(61, "f", {}).read(0, 99) == entries
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    with pytest.raises(OffloadError, match=r"ledger 62 .*no credentials were found"):
        create_offloader(s3.settings()).offload(BytesLedger(62, entries), "g", {})


class FailingLedger(PatternLedger):
    """Entries of 64 KiB whose reads fail past entry ``readable_last``."""

    def __init__(self, entry_count: int, readable_last: int) -> None:
        super().__init__(entry_count, 64 * 1024)
        self.readable_last = readable_last

    def read(self, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        if last_entry_id > self.readable_last:
            raise NotAllowed(f"entry {self.ledger_id}:{last_entry_id} is unreadable")
        return super().read(first_entry_id, last_entry_id)


def test_a_source_failing_after_parts_were_uploaded_leaves_no_object_and_no_open_upload(s3: MotoS3) -> None:
    offloader = create_offloader(s3.settings(max_block_size_bytes=1024 * 1024))
    with pytest.raises(OffloadError, match=r"offload of ledger 77 stopped: .*unreadable"):
        offloader.offload(FailingLedger(400, readable_last=150), "x", {})
    assert s3.keys() == []
    assert s3.client().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []


def test_a_copy_written_by_another_driver_is_read_and_deleted_from_where_it_was_written(
        s3: MotoS3, tmp_path: Path) -> None:
    """A broker switched from the filesystem driver to S3 still reads (and deletes) the copies
    the filesystem driver wrote: the driver recorded in the copy's context picks the store, not
    today's driver."""
    entries = varied_entries(200)
    directory = tmp_path / "offloaded"
    directory.mkdir()
    before = create_offloader(OffloadSettings(driver="filesystem", file_system_uri=str(directory)))
    before.offload(BytesLedger(7, entries), "fs-attempt", {})
    now = create_offloader(s3.settings())
    assert now.open(7, "fs-attempt", before.driver_metadata(), "filesystem").read(0, 199) == entries
    now.delete(7, "fs-attempt", before.driver_metadata(), "filesystem")
    assert sorted(p.name for p in directory.iterdir()) == [] and s3.keys() == []
