"""The namespace persistence policy (Pulsar's ``/admin/v2/namespaces/{t}/{ns}/persistence``)
against a real standalone server, whose one embedded bookie bounds the ensemble at 1.

Checks: unset it reads ``null`` and topics use the broker's default (1/1/1); a valid policy
round-trips and reaches open topics' next ledgers; ``E < Qw``, ``Qw < Qa``, zero quorums and an
ensemble larger than the bookies available are 400s that change nothing; DELETE returns to the
default.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.bookkeeper.bookie import QuorumConfig
from broker.service import BrokerService
from broker.topic_name import TopicName
from tests.integration.server import running_server

URL = "/admin/v2/namespaces/public/default/persistence"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[httpx.Client, BrokerService]]:
    with running_server(str(tmp_path / "data")) as (url, service), httpx.Client(base_url=url, timeout=30) as client:
        yield client, service


def test_persistence_policy_round_trip_and_validation(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    topic = service.topics.topic(TopicName.parse("public/default/t"))
    assert client.get(URL).json() is None
    assert topic.ml.config.quorum == QuorumConfig(1, 1, 1)
    policy = {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1,
              "managedLedgerMaxMarkDeleteRate": 0.5}
    assert client.post(URL, json=policy).status_code == 204
    assert client.get(URL).json() == policy
    for bad in ({"bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2},  # > bookies
                {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 1},  # E < Qw
                {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 2},  # Qw < Qa
                {"bookkeeperEnsemble": 0, "bookkeeperWriteQuorum": 0, "bookkeeperAckQuorum": 0},
                {"bookkeeperEnsemble": "1", "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1},
                {"bookkeeperEnsemble": 1}):
        response = client.post(URL, json=bad)
        assert response.status_code == 400, (bad, response.text)
        assert "code" in response.json() or "detail" in response.json()
    assert client.get(URL).json() == policy  # nothing changed
    assert client.delete(URL).status_code == 204
    assert client.get(URL).json() is None
    assert client.get("/admin/v2/namespaces/public/nowhere/persistence").status_code == 404
