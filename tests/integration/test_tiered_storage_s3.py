"""Tiered storage over an S3 API served over HTTP (moto's standalone server, started on a free port by
``tests/offload_store.py``: the code path a user runs against S3 or MinIO), through a real
``magnetar standalone`` with the ``aws-s3`` driver.

Checks: every transport reads the same before an offload, while its upload is held (the server
stopped with SIGSTOP) and after it with the local copies deleted; an offload by the admin call
stores a data and an index object per ledger, and after a restart every transport reads exactly what
was written, same ids and offsets; with the store stopped, with credentials it refuses, or with a
bucket that does not exist, an offload ends in ERROR with a ``lastError`` naming the store (never
the secret), ``/metrics`` says the topic's offload fails, nothing is marked offloaded or left in the
bucket, and the local data stays readable.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

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
from tests.offload_store import running_moto_s3


def _s3_config(tmp_path: Path, moto: Any) -> str:
    return offload_config(tmp_path, managedLedgerOffloadDriver="aws-s3", s3ManagedLedgerOffloadBucket=moto.bucket,
                   s3ManagedLedgerOffloadRegion="us-east-1", s3ManagedLedgerOffloadServiceEndpoint=moto.endpoint,
                   managedLedgerOffloadDeletionLagMs="0")


def test_s3_offload_against_moto_then_every_transport_reads_the_same(tmp_path: Path) -> None:
    with running_moto_s3() as moto:
        config = _s3_config(tmp_path, moto)
        with binary_broker(tmp_path / "data", "--config", config, env=moto.env()) as (url, pulsar_url, _):
            sent = produce_messages(pulsar_url)
            with httpx.Client(base_url=url, timeout=WAIT_S) as http:
                start_offload_of_everything(http)
                assert wait_offload_status(http)["status"] == "SUCCESS"
        assert len(moto.keys()) >= 2 * (MESSAGES // 5 - 1)  # a data and an index object per ledger
        with binary_broker(tmp_path / "data", "--config", config, env=moto.env()) as (url, pulsar_url, _):
            ledgers = httpx.get(f"{url}{ADMIN}/internalStats", timeout=WAIT_S).json()["ledgers"]
            assert sum(ledger["offloaded"] for ledger in ledgers) >= MESSAGES // 5 - 1
            check_every_transport(url, pulsar_url, sent)


def test_a_stopped_store_gives_error_and_the_local_data_stays_readable(tmp_path: Path) -> None:
    with running_moto_s3() as moto:
        config = _s3_config(tmp_path, moto)
        with binary_broker(tmp_path / "data", "--config", config, env=moto.env()) as (url, pulsar_url, _):
            sent = produce_messages(pulsar_url)
            moto.stop()
            with httpx.Client(base_url=url, timeout=WAIT_S) as http:
                start_offload_of_everything(http)
                status = wait_offload_status(http)
                assert status["status"] == "ERROR", status
                assert moto.endpoint in status["lastError"] or moto.bucket in status["lastError"], status
                internal = http.get(f"{ADMIN}/internalStats").json()  # what the console's topic page shows
                assert not any(ledger["offloaded"] for ledger in internal["ledgers"])
                assert internal["offload"]["status"] == "ERROR" and internal["offload"]["lastError"]
                assert "magnetar_topic_offload_failing{" in http.get("/metrics").text
            check_every_transport(url, pulsar_url, sent)


def test_refused_credentials_give_error_and_the_local_data_stays_readable(tmp_path: Path) -> None:
    with running_moto_s3() as moto:
        config = _s3_config(tmp_path, moto)
        wrong = {"AWS_ACCESS_KEY_ID": moto.access_key_id, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
        with binary_broker(tmp_path / "data", "--config", config, env=wrong) as (url, pulsar_url, _):
            sent = produce_messages(pulsar_url)
            with httpx.Client(base_url=url, timeout=WAIT_S) as http:
                start_offload_of_everything(http)
                status = wait_offload_status(http)
                assert status["status"] == "ERROR" and moto.bucket in status["lastError"], status
                assert "not-the-secret" not in status["lastError"]
            check_every_transport(url, pulsar_url, sent)
        assert moto.keys() == []


def test_a_missing_bucket_gives_error_naming_it_and_the_local_data_stays_readable(tmp_path: Path) -> None:
    with running_moto_s3() as moto:
        config = offload_config(tmp_path, managedLedgerOffloadDriver="aws-s3",
                                s3ManagedLedgerOffloadBucket="no-such-bucket", s3ManagedLedgerOffloadRegion="us-east-1",
                                s3ManagedLedgerOffloadServiceEndpoint=moto.endpoint)
        with binary_broker(tmp_path / "data", "--config", config, env=moto.env()) as (url, pulsar_url, _):
            sent = produce_messages(pulsar_url)
            with httpx.Client(base_url=url, timeout=WAIT_S) as http:
                start_offload_of_everything(http)
                status = wait_offload_status(http)
                assert status["status"] == "ERROR", status
                assert "no-such-bucket" in status["lastError"] and "does not exist" in status["lastError"], status
                assert not any(ledger["offloaded"] for ledger in http.get(f"{ADMIN}/internalStats").json()["ledgers"])
                assert "magnetar_topic_offload_failing{" in http.get("/metrics").text
            check_every_transport(url, pulsar_url, sent)


def test_every_transport_reads_the_same_before_during_and_after_an_offload(tmp_path: Path) -> None:
    """Before the offload, while its upload is held (the S3 server stopped with SIGSTOP: the
    offload is RUNNING), and after it completed and the bookies' copies went (lag 0), every
    transport reads the same messages with the same ids and offsets, without a restart."""
    import os
    import signal

    with running_moto_s3() as moto:
        config = _s3_config(tmp_path, moto)
        with binary_broker(tmp_path / "data", "--config", config, env=moto.env()) as (url, pulsar_url, _):
            sent = produce_messages(pulsar_url)
            check_every_transport(url, pulsar_url, sent)
            with httpx.Client(base_url=url, timeout=WAIT_S) as http:
                os.kill(moto.proc.pid, signal.SIGSTOP)
                try:
                    start_offload_of_everything(http)  # the broker's own answers: the store is not asked
                    assert http.get(f"{ADMIN}/offload").json()["status"] == "RUNNING"
                    check_every_transport(url, pulsar_url, sent)
                    assert http.get(f"{ADMIN}/offload").json()["status"] == "RUNNING"  # it was read during it
                finally:
                    os.kill(moto.proc.pid, signal.SIGCONT)
                assert wait_offload_status(http)["status"] == "SUCCESS"
                deadline = time.monotonic() + WAIT_S
                while not all(ledger["bookkeeperDeleted"] for ledger in
                              http.get(f"{ADMIN}/internalStats").json()["ledgers"][:-1]):
                    assert time.monotonic() < deadline, "the bookies' copies were not deleted"
                    time.sleep(0.1)
            check_every_transport(url, pulsar_url, sent)
