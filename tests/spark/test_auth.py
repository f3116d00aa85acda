"""The source and the sink against a broker with token authentication on (the ``token`` option).

The broker runs in this process with authentication enabled; the role ``spark`` may consume
and produce in ``public/default``. A query with the role's token copies a topic; without a token
it fails with the broker's 401.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from api.auth import AuthConfig
from broker.entry_format import Message
from broker.reader import StartPosition
from broker.service import BrokerConfig, BrokerService
from consumers.cli.tokens import create_token
from tests.integration.server import running_server
from tests.publishing import publish_to
from tests.spark.support import collect_available_now, source, write_available_now

pytestmark = pytest.mark.slow

SECRET = b"spark-connector-test-secret-32-bytes!"
KEEP_FOREVER = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BrokerService]]:
    auth = AuthConfig(enabled=True, secret_key=SECRET)
    with running_server(str(tmp_path_factory.mktemp("auth") / "data"), BrokerConfig.test_min(), auth=auth) as found:
        _, service = found
        service.namespaces.set_policy("public/default", "retention_policies", KEEP_FOREVER)
        service.namespaces.set_policy("public/default", "auth_policies",
                                      {"namespace_auth": {"spark": ["produce", "consume"]}})
        publish_to(service, "public/default/secured-in", [Message(payload=f"m{i}".encode()) for i in range(5)],
                        producer_name="setup")
        yield found


def test_token_reads_and_writes(spark: SparkSession, secured: tuple[str, BrokerService], tmp_path: Path) -> None:
    url, service = secured
    token = create_token("spark", secret_key=SECRET)
    frame = source(spark, url, topic="secured-in", startingOffsets="earliest", token=token).select("value")
    write_available_now(frame, str(tmp_path / "ck"), url, topic="secured-out", token=token)
    reader = service.subscriptions.reader("public/default/secured-out", StartPosition.earliest())
    copied = []
    while (delivery := reader.read_next()) is not None:
        copied.append(delivery.message.payload)
    assert copied == [f"m{i}".encode() for i in range(5)]


def test_without_a_token_the_query_fails_with_401(spark: SparkSession, secured: tuple[str, BrokerService],
                                                  tmp_path: Path) -> None:
    url, _ = secured
    with pytest.raises(StreamingQueryException, match="401 unauthorized"):
        collect_available_now(source(spark, url, topic="secured-in", startingOffsets="earliest"),
                              str(tmp_path / "ck"))
