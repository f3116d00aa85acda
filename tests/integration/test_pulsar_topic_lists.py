"""A namespace's topic list on the binary protocol, against a real ``magnetar standalone``.

Checks, on the wire (Pulsar's Python client never watches, Java's does when the broker offers
it): CONNECTED offers topic-list watches; GET_TOPICS_OF_NAMESPACE filters by pattern, says so,
and answers "unchanged" to a client holding the same hash; WATCH_TOPIC_LIST announces the
matching topics, then each matching topic created or deleted, never a topic that does not
match, and nothing after WATCH_TOPIC_LIST_CLOSE.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import crc32c
import httpx
import pytest

from api.pulsar.topic_lists import topics_hash
from tests.integration.pulsar_support import binary_broker
from tests.integration.pulsar_wire import RawConnection, T, command

NS = "public/default"
PREFIX = f"persistent://{NS}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    with binary_broker(tmp_path_factory.mktemp("topic-lists")) as (http_url, pulsar_url, _):
        yield http_url, int(pulsar_url.rsplit(":", 1)[1])


def create(http_url: str, local: str) -> None:
    response = httpx.put(f"{http_url}/admin/v2/persistent/{NS}/{local}", timeout=30)
    assert response.status_code in (200, 204), response.text


def delete(http_url: str, local: str) -> None:
    response = httpx.delete(f"{http_url}/admin/v2/persistent/{NS}/{local}", timeout=30)
    assert response.status_code in (200, 204), response.text


def test_the_hash_of_a_topic_list_is_pulsars() -> None:
    """CRC32C of the sorted names joined, its bytes little-endian in hex (Guava's HashCode)."""
    topics = ["persistent://public/default/b", "persistent://public/default/a"]
    expected = struct.pack("<I", crc32c.crc32c(b"persistent://public/default/apersistent://public/default/b")).hex()
    assert topics_hash(topics) == expected
    assert topics_hash([]) == "00000000"


def test_listing_filters_by_pattern_and_answers_unchanged_to_the_same_hash(broker: tuple[str, int]) -> None:
    http_url, port = broker
    for local in ("list-a", "list-b", "other-c"):
        create(http_url, local)
    with RawConnection(port) as conn:
        assert conn.connect().connected.feature_flags.supports_topic_watchers
        conn.send_command(command(T.GET_TOPICS_OF_NAMESPACE, getTopicsOfNamespace={
            "request_id": 1, "namespace": NS, "topics_pattern": f"{PREFIX}/list-.*"}))
        listed = conn.expect(T.GET_TOPICS_OF_NAMESPACE_RESPONSE).getTopicsOfNamespaceResponse
        assert list(listed.topics) == [f"{PREFIX}/list-a", f"{PREFIX}/list-b"]
        assert listed.filtered and listed.changed and listed.topics_hash == topics_hash(listed.topics)
        conn.send_command(command(T.GET_TOPICS_OF_NAMESPACE, getTopicsOfNamespace={
            "request_id": 2, "namespace": NS, "topics_pattern": f"{PREFIX}/list-.*",
            "topics_hash": listed.topics_hash}))
        again = conn.expect(T.GET_TOPICS_OF_NAMESPACE_RESPONSE).getTopicsOfNamespaceResponse
        assert not again.changed and list(again.topics) == []
        conn.send_command(command(T.GET_TOPICS_OF_NAMESPACE, getTopicsOfNamespace={
            "request_id": 3, "namespace": "public/missing"}))
        assert conn.expect(T.ERROR).error.request_id == 3


def test_a_watch_announces_matching_topics_as_they_come_and_go(broker: tuple[str, int]) -> None:
    http_url, port = broker
    create(http_url, "watched-1")
    with RawConnection(port) as conn:
        conn.connect()
        conn.send_command(command(T.WATCH_TOPIC_LIST, watchTopicList={
            "request_id": 1, "watcher_id": 7, "namespace": NS, "topics_pattern": f"{PREFIX}/watched-.*"}))
        success = conn.expect(T.WATCH_TOPIC_LIST_SUCCESS).watchTopicListSuccess
        assert (success.watcher_id, list(success.topic)) == (7, [f"{PREFIX}/watched-1"])
        create(http_url, "unwatched-2")  # does not match: no update
        create(http_url, "watched-2")
        update = conn.expect(T.WATCH_TOPIC_UPDATE).watchTopicUpdate
        assert (update.watcher_id, list(update.new_topics), list(update.deleted_topics)) == (
            7, [f"{PREFIX}/watched-2"], [])
        assert update.topics_hash == topics_hash([f"{PREFIX}/watched-1", f"{PREFIX}/watched-2"])
        delete(http_url, "watched-1")
        gone = conn.expect(T.WATCH_TOPIC_UPDATE).watchTopicUpdate
        assert (list(gone.new_topics), list(gone.deleted_topics)) == ([], [f"{PREFIX}/watched-1"])
        conn.send_command(command(T.WATCH_TOPIC_LIST_CLOSE, watchTopicListClose={"request_id": 2, "watcher_id": 7}))
        assert conn.expect(T.SUCCESS).success.request_id == 2
        create(http_url, "watched-3")
        conn.send_command(command(T.PING, ping={}))
        assert conn.expect(T.PONG, T.WATCH_TOPIC_UPDATE).type == T.PONG  # nothing came before the answer
