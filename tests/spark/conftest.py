"""The Spark tier's shared fixtures: one local SparkSession and one real broker process.

Both are session-scoped because a SparkSession costs seconds to start: ``local[2]``, two shuffle
partitions, no UI, UTC session time. The broker is ``magnetar standalone`` in a child process on
127.0.0.1 and free ports, HTTP and binary protocol (stopped by PID at the end). Executors run ``consumers.spark`` from
the editable install, under this interpreter (``PYSPARK_PYTHON``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tests.spark.support import spark_session
from tests.standalone import free_port, standalone_process


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("magnetar-tests")
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


@pytest.fixture(scope="session")
def spark_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(HTTP URL, ``pulsar://`` URL) of the broker the Spark tests share."""
    port = free_port()
    with standalone_process(tmp_path_factory.mktemp("spark-broker") / "data", "--pulsar-port", str(port)) as (url, _):
        yield url, f"pulsar://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def broker_url(spark_broker: tuple[str, str]) -> str:
    return spark_broker[0]
