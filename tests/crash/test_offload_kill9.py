"""``kill -9`` of a real ``magnetar standalone`` at each step of an offload loses and duplicates
nothing, and no interrupted attempt is trusted.

The broker SIGKILLs itself at a named step (``MAGNETAR_OFFLOAD_CRASH_AT``,
``broker/managed_ledger_offload.py``): after the attempt is saved and before the upload
(``before-upload``), with part of the copy written (``during-upload``: one block per entry,
killed at the upload's second read of the ledger), after the upload and before ``complete`` is
saved (``after-upload``), and after ``bookkeeperDeleted`` is saved and before the bookies' copy
is deleted (``during-local-delete``). After a restart every message reads back once, at its
offset; an interrupted attempt's objects are gone from the store (nothing offloaded, no file
left, not even the staging file of a multipart upload killed midway) and the next offload succeeds; a ledger marked
deleted locally is deleted from the bookies (its ledger metadata is gone once the broker
stopped) and read from the store.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from broker.bookkeeper.ledger_metadata import ledger_path
from broker.metadata import RocksDBMetadataStore
from tests.standalone import read_all, standalone_process

pytestmark = pytest.mark.crash

ADMIN = "/admin/v2/persistent/public/default/tiered-crash"
READ_PATH = "/topics/persistent/public/default/tiered-crash"
MESSAGES = 20
WAIT_S = 30.0


def _config(tmp_path: Path) -> str:
    path = tmp_path / "standalone.conf"
    path.write_text("managedLedgerMaxEntriesPerLedger=5\nmanagedLedgerMinLedgerRolloverTimeMinutes=0\n"
                    f"managedLedgerOffloadDriver=filesystem\nfileSystemURI=file://{tmp_path}/store\n"
                    "managedLedgerOffloadDeletionLagMs=0\nmanagedLedgerOffloadMaxBlockSizeInBytes=1024\n"
                    "managedLedgerOffloadReadBufferSizeInBytes=1\n")  # a block and a source read per entry
    return str(path)


def _store_files(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "store").rglob("*") if p.is_file()]


def _offload_all(http: httpx.Client) -> httpx.Response:
    last = http.get(f"{ADMIN}/lastMessageId").json()
    return http.put(f"{ADMIN}/offload", json={"ledgerId": last["ledgerId"] + 1, "entryId": 0})


def _wait_success(http: httpx.Client) -> None:
    deadline = time.monotonic() + WAIT_S
    status = {}
    while time.monotonic() < deadline:
        status = http.get(f"{ADMIN}/offload").json()
        if status["status"] == "SUCCESS":
            return
        assert status["status"] != "ERROR", status
        time.sleep(0.1)
    raise AssertionError(f"no SUCCESS within {WAIT_S} s: {status}")


def _messages(url: str) -> list[tuple[int, bytes]]:
    return [(m["offset"], m["payload"]) for m in read_all(url, READ_PATH)]


@pytest.mark.parametrize("point", ["before-upload", "during-upload", "after-upload", "during-local-delete"])
def test_kill9_during_an_offload_loses_and_duplicates_nothing(tmp_path: Path, point: str) -> None:
    config = _config(tmp_path)
    expected = [(i, f"event-{i}-".encode().ljust(600, b".")) for i in range(MESSAGES)]
    with standalone_process(tmp_path / "data", "--config", config,
                            env={"MAGNETAR_OFFLOAD_CRASH_AT": point}) as (url, proc):
        with httpx.Client(base_url=url, timeout=WAIT_S) as http:
            for _, payload in expected:
                assert http.post(READ_PATH, json={"messages": [{"payload": payload.decode()}]}).status_code == 200
            _offload_all(http)
        assert proc.wait(WAIT_S) == -9
    if point == "after-upload":
        assert _store_files(tmp_path), "the interrupted attempt's copy is in the store"
    with standalone_process(tmp_path / "data", "--config", config) as (url, _), \
            httpx.Client(base_url=url, timeout=WAIT_S) as http:
        assert _messages(url) == expected
        ledgers = http.get(f"{ADMIN}/internalStats").json()["ledgers"]
        marked = [ledger["ledgerId"] for ledger in ledgers if ledger["bookkeeperDeleted"]]
        if point == "during-local-delete":
            assert marked and all(ledger["offloaded"] for ledger in ledgers if ledger["bookkeeperDeleted"])
        else:  # the interrupted attempt is not trusted, and its objects are gone
            assert not any(ledger["offloaded"] for ledger in ledgers)
            assert [p.name for p in _store_files(tmp_path) if point != "during-upload" or "#" not in p.name] == []
        assert _offload_all(http).status_code == 204
        _wait_success(http)
        assert _messages(url) == expected
    store = RocksDBMetadataStore(str(tmp_path / "data" / "metadata"))
    try:  # the ledgers marked deleted before the kill are gone from the bookies too
        assert [ledger_id for ledger_id in marked if store.get(ledger_path(ledger_id)) is not None] == []
    finally:
        store.close()


def test_kill9_during_an_upload_leaves_no_staging_file(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with standalone_process(tmp_path / "data", "--config", config,
                            env={"MAGNETAR_OFFLOAD_CRASH_AT": "during-upload"}) as (url, proc):
        with httpx.Client(base_url=url, timeout=WAIT_S) as http:
            for i in range(MESSAGES):
                assert http.post(READ_PATH, json={"messages": [{"payload": "x" * 600 + str(i)}]}).status_code == 200
            _offload_all(http)
        assert proc.wait(WAIT_S) == -9
    with standalone_process(tmp_path / "data", "--config", config) as (url, _):
        assert len(_messages(url)) == MESSAGES
    assert _store_files(tmp_path) == []
