"""The ``azureblob`` driver against Azurite (Microsoft's Azure Storage emulator, started on a free
port by ``tests/offload_store.py``), the Azure Blob API a user's broker speaks to Azure.

Checks: a ledger of thousands of entries offloaded in small blocks reads back exactly by every
run and across block boundaries, and ``delete`` removes both objects; a flipped byte in the data
blob is an ``OffloadReadError`` naming the ledger; a key the account refuses and a container
that does not exist are ``OffloadError``s naming the ledger, the driver and the container,
without the key, and leave nothing behind; a real ``magnetar standalone`` with Pulsar's Azure
keys (``managedLedgerOffloadDriver=azureblob``, ``managedLedgerOffloadBucket``,
``AZURE_STORAGE_ACCOUNT`` / ``AZURE_STORAGE_ACCESS_KEY``) offloads by the admin call, and after
a restart every transport reads exactly what was written.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.errors import OffloadError, OffloadReadError
from broker.offload import create_offloader
from tests.integration.pulsar_support import binary_broker
from tests.integration.test_tiered_storage import (
    ADMIN,
    MESSAGES,
    WAIT_S,
    check_every_transport,
    offload_config,
    produce_messages,
    start_offload_of_everything,
    wait_offload_status,
)
from tests.offload_store import Azurite, running_azurite
from tests.unit.test_offload_format import BytesLedger, varied_entries


@pytest.fixture
def azurite(monkeypatch: pytest.MonkeyPatch) -> Iterator[Azurite]:
    with running_azurite() as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        yield server


def test_a_ledger_of_thousands_of_entries_reads_back_exactly_and_deletes_whole(azurite: Azurite) -> None:
    entries = varied_entries(2000)
    offloader = create_offloader(azurite.settings(max_block_size_bytes=32 * 1024))
    offloader.offload(BytesLedger(42, entries), "attempt-1", {"ManagedLedgerName": "public/default/t"})
    assert azurite.names() == ["42-attempt-1", "42-attempt-1-index"]
    handle = offloader.open(42, "attempt-1", offloader.driver_metadata(), "azureblob")
    assert handle.read(0, 1999) == entries
    for first in range(0, 2000, 97):
        last = min(1999, first + 96)
        assert handle.read(first, last) == entries[first:last + 1]
    assert offloader.list_attempts(42) == {"attempt-1": True}
    offloader.delete(42, "attempt-1", offloader.driver_metadata(), "azureblob")
    assert azurite.names() == []


def test_a_corrupt_blob_is_an_error_naming_the_ledger(azurite: Azurite) -> None:
    offloader = create_offloader(azurite.settings())
    offloader.offload(BytesLedger(7, varied_entries(400)), "u", {})
    blob = azurite.container_client().get_blob_client("7-u")
    data = bytearray(blob.download_blob().readall())
    data[len(data) // 2] ^= 0x40
    blob.upload_blob(bytes(data), overwrite=True)
    with pytest.raises(OffloadReadError,
                       match=r"ledger 7 .*object 7-u on azureblob bucket offload-container.*checksum"):
        offloader.open(7, "u", {}).read(0, 399)


def test_a_refused_key_and_a_missing_container_are_errors_without_the_key(azurite: Azurite,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    wrong_key = base64.b64encode(secrets.token_bytes(64)).decode()
    monkeypatch.setenv("AZURE_STORAGE_ACCESS_KEY", wrong_key)
    with pytest.raises(OffloadError) as refused:
        create_offloader(azurite.settings()).offload(BytesLedger(3, varied_entries(50)), "u", {})
    message = str(refused.value)
    assert "ledger 3" in message and "azureblob bucket offload-container" in message, message
    assert "refused the credentials" in message and wrong_key not in message and azurite.key not in message
    monkeypatch.setenv("AZURE_STORAGE_ACCESS_KEY", azurite.key)
    with pytest.raises(OffloadError, match=r"ledger 3 .*azureblob bucket no-such-container.*does not exist"):
        create_offloader(azurite.settings(bucket="no-such-container")).offload(BytesLedger(3, varied_entries(50)),
                                                                              "u", {})
    assert azurite.names() == []


def test_a_broker_offloads_to_azure_blob_and_every_transport_reads_the_same(tmp_path: Path) -> None:
    with running_azurite() as azurite:
        config = offload_config(tmp_path, managedLedgerOffloadDriver="azureblob",
                                managedLedgerOffloadBucket=azurite.container,
                                managedLedgerOffloadServiceEndpoint=azurite.endpoint,
                                managedLedgerOffloadDeletionLagMs="0")
        with binary_broker(tmp_path / "data", "--config", config, env=azurite.env()) as (url, pulsar_url, _):
            sent = produce_messages(pulsar_url)
            with httpx.Client(base_url=url, timeout=WAIT_S) as http:
                start_offload_of_everything(http)
                assert wait_offload_status(http)["status"] == "SUCCESS"
        assert len(azurite.names()) >= 2 * (MESSAGES // 5 - 1)  # a data and an index blob per ledger
        with binary_broker(tmp_path / "data", "--config", config, env=azurite.env()) as (url, pulsar_url, _):
            ledgers = httpx.get(f"{url}{ADMIN}/internalStats", timeout=WAIT_S).json()["ledgers"]
            assert sum(ledger["offloaded"] and ledger["bookkeeperDeleted"] for ledger in ledgers) >= MESSAGES // 5 - 1
            check_every_transport(url, pulsar_url, sent)
