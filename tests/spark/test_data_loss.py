"""``failOnDataLoss`` when retention removed messages a query still had to read.

For a deterministic trim the broker runs in this process (``running_server`` with
``BrokerConfig.test_min()``: a ledger rolls over every 5 entries) and the test trims through the
service: no subscription and a retention of nothing on the namespace (Pulsar's default; the
broker's own keeps everything), then a maintenance pass deletes every closed ledger. The query
then starts at offset 0, which is gone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from broker.service import BrokerConfig
from broker.topic_name import TopicName
from tests.integration.server import running_server
from tests.spark.support import collect_available_now, full_name, produce_values, source

pytestmark = pytest.mark.slow

TOPIC = "trimmed"
ENTRIES = 12
KEEP_NOTHING = {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}


@pytest.fixture(scope="module")
def trimmed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A broker whose topic lost its first ledgers: (url, first retained offset)."""
    with running_server(str(tmp_path_factory.mktemp("trim") / "data"), BrokerConfig.test_min()) as (url, service):
        service.namespaces.set_policy("public/default", "retention_policies", KEEP_NOTHING)
        produce_values(url, TOPIC, [f"m{i}".encode() for i in range(ENTRIES)], per_request=1)
        service.maintenance.run()
        first = service.topics.topic(TopicName.parse(TOPIC)).ml.first_offset
        assert 0 < first < ENTRIES
        yield url, first


def test_fail_on_data_loss_fails_the_query_naming_the_lost_offsets(spark: SparkSession, trimmed: tuple[str, int],
                                                                   tmp_path: Path) -> None:
    url, first = trimmed
    frame = source(spark, url, topic=TOPIC, startingOffsets=json.dumps({full_name(TOPIC): 0}))
    with pytest.raises(StreamingQueryException) as failure:
        collect_available_now(frame, str(tmp_path / "ck"))
    assert f"{full_name(TOPIC)}: offsets [0, {first}) were lost" in str(failure.value)
    assert "failOnDataLoss=false" in str(failure.value)


def test_without_fail_on_data_loss_the_query_skips_to_the_first_retained_offset(
        spark: SparkSession, trimmed: tuple[str, int], tmp_path: Path) -> None:
    url, first = trimmed
    frame = source(spark, url, topic=TOPIC, startingOffsets=json.dumps({full_name(TOPIC): 0}),
                   failOnDataLoss="false")
    rows = collect_available_now(frame, str(tmp_path / "ck")).rows
    assert sorted(r.offset for r in rows) == list(range(first, ENTRIES))
    assert sorted(r.value for r in rows) == sorted(f"m{i}".encode() for i in range(first, ENTRIES))
