"""A topic's epoch is durable (``broker/producer_access.py``): it grows with each exclusive
producer, is stored with the topic (its managed ledger's ``__topicEpoch`` property, as
Pulsar's), so after a broker restart an exclusive producer presenting an older epoch is fenced
(ProducerFenced) and a new one gets a larger epoch than any given before.

Before the epoch was stored, it lived in the binary front end's memory only: after a restart
it started again at 0, a producer presenting the stale epoch 1 was answered PRODUCER_SUCCESS,
and a new exclusive producer was given epoch 1 again.
"""

from __future__ import annotations

from pathlib import Path

from api.pulsar.proto import pulsar_api_pb2 as pb
from tests.integration.pulsar_support import binary_broker
from tests.integration.pulsar_wire import RawConnection, T, command

TOPIC = "persistent://public/default/epoch"
EXCLUSIVE = pb.ProducerAccessMode.Exclusive


def _port(pulsar_url: str) -> int:
    return int(pulsar_url.rsplit(":", 1)[1])


def _open_exclusive(conn: RawConnection, producer_id: int, epoch: int | None = None) -> pb.BaseCommand:
    body: dict[str, object] = {"topic": TOPIC, "producer_id": producer_id, "request_id": producer_id,
                               "producer_access_mode": EXCLUSIVE}
    if epoch is not None:
        body["topic_epoch"] = epoch
    conn.send_command(command(T.PRODUCER, producer=body))
    return conn.expect(T.PRODUCER_SUCCESS, T.ERROR)


def _close(conn: RawConnection, producer_id: int) -> None:
    conn.send_command(command(T.CLOSE_PRODUCER, close_producer={"producer_id": producer_id, "request_id": 100}))
    assert conn.expect(T.SUCCESS).success.request_id == 100


def test_an_older_epoch_is_fenced_after_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with binary_broker(data) as (_, pulsar_url, _), RawConnection(_port(pulsar_url)) as conn:
        conn.connect()
        first = _open_exclusive(conn, 1).producer_success.topic_epoch
        _close(conn, 1)
        second = _open_exclusive(conn, 2).producer_success.topic_epoch
        assert second > first
        _close(conn, 2)
    with binary_broker(data) as (_, pulsar_url, _), RawConnection(_port(pulsar_url)) as conn:
        conn.connect()
        stale = _open_exclusive(conn, 1, epoch=first)
        assert stale.type == T.ERROR and stale.error.error == pb.ProducerFenced, stale
        assert f"moved to {second}" in stale.error.message
        fresh = _open_exclusive(conn, 2)
        assert fresh.type == T.PRODUCER_SUCCESS and fresh.producer_success.topic_epoch > second

