"""The source and the sink against a broker that serves only HTTPS (``tls.*`` options).

The broker runs in this process on one HTTPS listener, its certificate signed by the test's own
CA. A query given the CA as ``tls.trust.certs.file.path`` copies a topic from ``https://`` to
``https://``; without it the query fails, naming the certificate it could not verify.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from api.tls import TlsConfig
from broker.entry_format import Message
from broker.service import BrokerConfig, BrokerService
from tests.integration.server import running_server, stored
from tests.publishing import publish_to
from tests.spark.support import collect_available_now, source, write_available_now
from tests.tls_material import TlsMaterial, make_material

pytestmark = pytest.mark.slow

KEEP_FOREVER = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BrokerService, TlsMaterial]]:
    material = make_material(tmp_path_factory.mktemp("certs"))
    tls = TlsConfig(str(material.server.cert), str(material.server.key))
    with running_server(str(tmp_path_factory.mktemp("tls") / "data"), BrokerConfig.test_min(), tls=tls) as found:
        url, service = found
        assert url.startswith("https://")
        service.namespaces.set_policy("public/default", "retention_policies", KEEP_FOREVER)
        publish_to(service, "public/default/tls-in", [Message(payload=f"m{i}".encode()) for i in range(5)],
                        producer_name="setup")
        yield url, service, material


def test_https_reads_and_writes_with_a_trust_file(spark: SparkSession,
                                                  secured: tuple[str, BrokerService, TlsMaterial],
                                                  tmp_path: Path) -> None:
    url, service, material = secured
    trust = {"tls.trust.certs.file.path": str(material.ca.cert)}
    frame = source(spark, url, topic="tls-in", startingOffsets="earliest", **trust).select("value")
    write_available_now(frame, str(tmp_path / "ck"), url, topic="tls-out", **trust)
    assert stored(service, "public/default/tls-out") == [f"m{i}".encode() for i in range(5)]


def test_without_the_trust_file_the_query_fails(spark: SparkSession, secured: tuple[str, BrokerService, TlsMaterial],
                                                tmp_path: Path) -> None:
    url, _, _ = secured
    with pytest.raises(StreamingQueryException, match="CERTIFICATE_VERIFY_FAILED"):
        collect_available_now(source(spark, url, topic="tls-in", startingOffsets="earliest"), str(tmp_path / "ck"))
