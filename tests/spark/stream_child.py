"""A streaming query in its own process (and JVM), for the kill-and-restart test.

``python -m tests.spark.stream_child URL CHECKPOINT SOURCE TARGET MODE`` copies SOURCE into
TARGET through the Magnetar source and sink with the checkpoint CHECKPOINT. MODE ``run`` keeps
going, ``ROWS_PER_TRIGGER`` rows per micro-batch, until the process is killed (bounded by
``RUN_TIMEOUT_S`` so a forgotten child cannot live on); MODE ``finish`` uses
``Trigger(availableNow=True)`` without a row limit and exits 0 once the backlog is done.
"""

from __future__ import annotations

import sys

from tests.spark.support import source, spark_session

ROWS_PER_TRIGGER = 20
RUN_TIMEOUT_S = 300


def main(url: str, checkpoint: str, source_topic: str, target_topic: str, mode: str) -> int:
    spark = spark_session(f"magnetar-child-{mode}")
    limit = {} if mode == "finish" else {"maxOffsetsPerTrigger": ROWS_PER_TRIGGER}
    frame = source(spark, url, topic=source_topic, startingOffsets="earliest", **limit).select(
        "key", "value", "properties")
    writer = (frame.writeStream.format("magnetar").option("service.url", url).option("topic", target_topic)
              .option("checkpointLocation", checkpoint))
    query = writer.trigger(availableNow=True).start() if mode == "finish" else writer.start()
    finished = query.awaitTermination(RUN_TIMEOUT_S)
    query.stop()
    spark.stop()
    return 0 if finished and mode == "finish" else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
