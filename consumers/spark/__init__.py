"""Magnetar for Spark Structured Streaming: one data source, ``format("magnetar")``, read and write.

Register it once per session, then read and write topics as Spark reads and writes Kafka::

    from consumers.spark import MagnetarDataSource
    spark.dataSource.register(MagnetarDataSource)
    stream = (spark.readStream.format("magnetar").option("service.url", "http://localhost:8080")
              .option("topic", "orders").option("startingOffsets", "earliest").load())
    (stream.select("key", "value", "properties").writeStream.format("magnetar")
           .option("service.url", "http://localhost:8080").option("topic", "orders-copy")
           .option("checkpointLocation", "/tmp/ck").start())

Source options (as Spark's Kafka source): ``service.url``; exactly one of ``topic``, ``topics``
(comma-separated) or ``topicsPattern`` (a regex over the full topic names of one namespace,
``persistent://tenant/ns/orders-.*``); ``startingOffsets`` (``latest``, the default,
``earliest``, or JSON ``{"persistent://tenant/ns/topic-partition-0": offset}`` where -2 means
earliest, -1 latest, and unnamed partitions start at earliest); ``startingTime`` (epoch ms,
takes precedence over ``startingOffsets``); ``maxOffsetsPerTrigger``; ``failOnDataLoss``
(default true); ``readChunkMessages`` (messages per range request, default 20,000); ``token``
(a JWT sent as ``Authorization: Bearer``, for brokers with authentication on; source and sink);
for an ``https://`` ``service.url``, ``tls.trust.certs.file.path`` (the authorities that signed
the broker's certificate) and, for mutual TLS, ``tls.certificate.file.path`` and
``tls.private.key.file.path`` (source and sink).
Columns: ``key binary, value binary, topic string, partition int, offset long, messageId string,
publishTime timestamp, eventTime timestamp, properties map<string,string>``; ``topic`` is the
full name of the topic partition and ``partition`` its index (-1 for an unpartitioned topic).

Sink options: ``service.url`` and ``topic`` (or a ``topic`` column); see ``sink.py`` for the
columns and the exactly-once contract. Layering: this package talks to the broker over HTTP only.

Spark's Python workers must be able to import this package: importing it sets ``PYSPARK_PYTHON``
to this interpreter when it is unset, and registering the data source fails with what to set
when the workers' interpreter cannot import it (``interpreter.py``).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter
from pyspark.sql.types import StructType

from consumers.spark.interpreter import WorkerInterpreterError, check_worker_interpreter, use_this_interpreter
from consumers.spark.sink import MagnetarStreamWriter
from consumers.spark.source import MagnetarStreamReader

use_this_interpreter()

SOURCE_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, messageId string, "
                 "publishTime timestamp, eventTime timestamp, properties map<string,string>")


class MagnetarDataSource(DataSource):
    """``format("magnetar")``: the streaming source and the exactly-once streaming sink."""

    @classmethod
    def name(cls) -> str:
        """``magnetar``; on the driver (``spark.dataSource.register`` asks for it) this first checks
        that Spark's Python workers can import this package."""
        check_worker_interpreter()
        return "magnetar"

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 - Spark's name
        return MagnetarStreamReader(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return MagnetarStreamWriter(self.options, schema)


__all__ = ["SOURCE_SCHEMA", "MagnetarDataSource", "MagnetarStreamReader", "MagnetarStreamWriter",
           "WorkerInterpreterError"]
