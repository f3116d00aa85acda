"""The Spark tier's shared fixtures: one local SparkSession and one real broker process.

Both are session-scoped because a SparkSession costs seconds to start: ``local[2]``, two shuffle
partitions, no UI, UTC session time. The broker is ``magnetar standalone`` in a child process on
127.0.0.1 and a free port (stopped by PID at the end). Executors run ``consumers.spark`` from
the editable install, under this interpreter (``PYSPARK_PYTHON``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tests.spark.support import spark_session
from tests.standalone import standalone_process


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
def broker_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with standalone_process(tmp_path_factory.mktemp("spark-broker") / "data") as (url, _):
        yield url
