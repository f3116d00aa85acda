"""The Spark source reads a topic whose closed ledgers were offloaded (filesystem driver, deletion
lag 0: the bookies hold only the current ledger) exactly as it was written: every offset and
value, in order, through a real local Spark against a real broker process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pyspark.sql import SparkSession

from tests.spark.support import collect_available_now, produce_values, read_back, source
from tests.standalone import standalone_process

pytestmark = pytest.mark.slow

TOPIC = "spark-tiered"
ADMIN = f"/admin/v2/persistent/public/default/{TOPIC}"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def tiered_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("spark-tiered")
    config = home / "standalone.conf"
    config.write_text("managedLedgerMaxEntriesPerLedger=5\nmanagedLedgerMinLedgerRolloverTimeMinutes=0\n"
                      f"managedLedgerOffloadDriver=filesystem\nfileSystemURI=file://{home}/store\n"
                      "managedLedgerOffloadDeletionLagMs=0\n")
    with standalone_process(home / "data", "--config", str(config)) as (url, _):
        yield url


def _offload_everything_closed(url: str) -> None:
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        last = http.get(f"{ADMIN}/lastMessageId").json()
        assert http.put(f"{ADMIN}/offload", json={"ledgerId": last["ledgerId"] + 1, "entryId": 0}).status_code == 204
        deadline = time.monotonic() + WAIT_S
        while http.get(f"{ADMIN}/offload").json()["status"] != "SUCCESS" and time.monotonic() < deadline:
            time.sleep(0.1)
        ledgers = http.get(f"{ADMIN}/internalStats").json()["ledgers"]
        while not all(ledger["bookkeeperDeleted"] for ledger in ledgers[:-1]) and time.monotonic() < deadline:
            time.sleep(0.2)
            ledgers = http.get(f"{ADMIN}/internalStats").json()["ledgers"]
    assert len(ledgers) >= 4 and all(ledger["offloaded"] and ledger["bookkeeperDeleted"] for ledger in ledgers[:-1])


def test_the_source_reads_offloaded_ledgers_exactly(spark: SparkSession, tiered_broker: str, tmp_path: Path) -> None:
    values = [f"tiered-{i}".encode() for i in range(23)]
    produce_values(tiered_broker, TOPIC, values, per_request=1)  # one entry each: five to a ledger
    _offload_everything_closed(tiered_broker)
    frame = source(spark, tiered_broker, topic=TOPIC, startingOffsets="earliest")
    rows = sorted(collect_available_now(frame, str(tmp_path / "ck")).rows, key=lambda r: r.offset)
    expected = read_back(tiered_broker, TOPIC)
    assert [(row.offset, row.value) for row in rows] == [(m["offset"], m["payload"]) for m in expected]
    assert [row.value for row in rows] == values
    assert [row.messageId for row in rows] == [m["messageId"] for m in expected]
