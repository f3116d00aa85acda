"""What a binary LOOKUP answers (``api/pulsar/lookups.py``): Connect here, Redirect to the owner,
or ServiceNotReady, from the broker's lookup result; and how the answers are spelled on the wire."""

from __future__ import annotations

import asyncio

import pytest

from api.pulsar import commands
from api.pulsar.framing import FrameDecoder
from api.pulsar.lookups import Listener, LookupAnswer, LookupRunner, lookup_answer
from api.pulsar.proto import pulsar_api_pb2 as pb
from broker import AdvertisedListener, BrokerAddress, LookupResult, ServiceUnitNotReady, TopicNotOwned
from broker.errors import LedgerFenced
from broker.namespace.lookup import listeners_of

TOPIC = "persistent://public/default/t"
BUNDLE = "public/default/0x00000000_0x40000000"
HERE = Listener("pulsar://10.0.0.1:6650", None)
HERE_WITH_TLS = Listener("pulsar://10.0.0.1:6650", "pulsar+ssl://10.0.0.1:6651")
OTHER = BrokerAddress("10.0.0.2:8080", "http://10.0.0.2:8080", "pulsar://10.0.0.2:6650")
LookupType = pb.CommandLookupTopicResponse


def _found(owner: BrokerAddress, *, local: bool) -> LookupResult:
    return LookupResult(TOPIC, BUNDLE, owner, local)


def test_a_topic_served_here_is_answered_connect_with_this_brokers_listeners() -> None:
    standalone = LookupResult(TOPIC, "", BrokerAddress("", ""), True)
    assert lookup_answer(standalone, HERE, tls=False) == LookupAnswer("pulsar://10.0.0.1:6650", "", redirect=False)
    assert lookup_answer(_found(OTHER, local=True), HERE_WITH_TLS, tls=True) == \
        LookupAnswer("pulsar://10.0.0.1:6650", "pulsar+ssl://10.0.0.1:6651", redirect=False)


def test_a_topic_owned_elsewhere_is_connect_to_the_owner_and_a_fresh_assignment_a_redirect() -> None:
    """As Pulsar's broker: an owned bundle is answered with its owner's URLs (Connect); only a
    broker just chosen to take an unowned bundle is a Redirect (the client asks it, it takes it)."""
    owned = lookup_answer(_found(OTHER, local=False), HERE, tls=False)
    assert owned == LookupAnswer("pulsar://10.0.0.2:6650", "", redirect=False)
    assigned = LookupResult(TOPIC, BUNDLE, OTHER, False, assigned=True)
    assert lookup_answer(assigned, HERE, tls=False) == \
        LookupAnswer("pulsar://10.0.0.2:6650", "", redirect=True, authoritative=True)
    secure = BrokerAddress("b:8080", "http://b:8080", "pulsar://b:6650", "pulsar+ssl://b:6651")
    assert lookup_answer(_found(secure, local=False), HERE, tls=True) == \
        LookupAnswer("pulsar://b:6650", "pulsar+ssl://b:6651", redirect=False)


def test_an_owner_without_a_binary_listener_of_the_clients_kind_is_not_ready() -> None:
    http_only = BrokerAddress("10.0.0.3:8080", "http://10.0.0.3:8080")
    with pytest.raises(ServiceUnitNotReady, match=r"broker 10\.0\.0\.3:8080, which has no pulsar:// listener"):
        lookup_answer(_found(http_only, local=False), HERE, tls=False)
    with pytest.raises(ServiceUnitNotReady, match="no pulsar\\+ssl:// listener"):
        lookup_answer(_found(OTHER, local=False), HERE, tls=True)
    with pytest.raises(ServiceUnitNotReady, match="this broker"):
        lookup_answer(_found(OTHER, local=True), HERE, tls=True)


def test_a_client_naming_a_listener_is_answered_the_owners_url_of_that_listener() -> None:
    """In a cluster, the listeners travel in the owner's address (ownership node, load report):
    another broker answers the named listener's URLs of the owner, or Pulsar's refusal."""
    listeners = (AdvertisedListener("internal", "pulsar://10.0.0.2:6650"),
                 AdvertisedListener("external", "pulsar://b.example.com:6650", "pulsar+ssl://b.example.com:6651"))
    owner = BrokerAddress("10.0.0.2:8080", "http://10.0.0.2:8080", "pulsar://10.0.0.2:6650", "", listeners)
    assert listeners_of(owner.listeners_json()) == listeners  # as read back from ZooKeeper
    assert lookup_answer(_found(owner, local=False), HERE, tls=True, listener="external") == \
        LookupAnswer("pulsar://b.example.com:6650", "pulsar+ssl://b.example.com:6651", redirect=False)
    assigned = LookupResult(TOPIC, BUNDLE, owner, False, assigned=True)
    assert lookup_answer(assigned, HERE, tls=False, listener="external").service_url == "pulsar://b.example.com:6650"
    assert lookup_answer(_found(owner, local=False), HERE, tls=False).service_url == "pulsar://10.0.0.2:6650"
    with pytest.raises(ServiceUnitNotReady, match=r"^the broker do not have elsewhere listener$"):
        lookup_answer(_found(owner, local=False), HERE, tls=False, listener="elsewhere")
    with pytest.raises(ServiceUnitNotReady, match=r"^the broker do not have external listener$"):
        lookup_answer(_found(OTHER, local=False), HERE, tls=False, listener="external")


def _decoded(frame: bytes) -> pb.BaseCommand:
    (only,) = FrameDecoder(1 << 20).feed(frame)
    return only.command


def test_lookup_answers_on_the_wire() -> None:
    redirect = _decoded(commands.lookup(7, "pulsar://b:6650", "", redirect=True, authoritative=True))
    body = redirect.lookupTopicResponse
    assert redirect.type == pb.BaseCommand.LOOKUP_RESPONSE and body.request_id == 7
    assert body.response == LookupType.Redirect and body.brokerServiceUrl == "pulsar://b:6650"
    assert body.authoritative and not body.HasField("brokerServiceUrlTls")
    assert body.HasField("proxy_through_service_url") and not body.proxy_through_service_url
    connect = _decoded(commands.lookup(8, "pulsar://a:6650", "pulsar+ssl://a:6651", redirect=False,
                                       authoritative=True)).lookupTopicResponse
    assert connect.response == LookupType.Connect and connect.brokerServiceUrlTls == "pulsar+ssl://a:6651"


def test_not_owned_not_ready_and_fenced_are_service_not_ready_so_clients_look_up_again() -> None:
    not_owned = TopicNotOwned(f"{TOPIC} is served by b:8080", owner_url="http://b:8080", owner_broker="b:8080")
    assert commands.server_error(not_owned) == (pb.ServiceNotReady, f"{TOPIC} is served by b:8080")
    assert commands.server_error(ServiceUnitNotReady("moving"))[0] == pb.ServiceNotReady
    assert commands.server_error(LedgerFenced("another broker recovered the topic"))[0] == pb.ServiceNotReady
    failed = _decoded(commands.lookup_failed(9, ServiceUnitNotReady("no listener"))).lookupTopicResponse
    assert failed.response == LookupType.Failed and failed.error == pb.ServiceNotReady
    assert failed.message == "no listener"


def test_the_runner_answers_off_the_loop_and_refuses_beyond_its_bound() -> None:
    async def scenario() -> tuple[list[bytes], int]:
        loop = asyncio.get_running_loop()
        runner = LookupRunner(loop, threads=2, pending_max=2, inline=False)
        replies: list[bytes] = []
        done = asyncio.Event()
        threads: set[str] = set()

        def work(n: int) -> bytes:
            import threading
            threads.add(threading.current_thread().name)
            return f"answer-{n}".encode()

        def reply(frame: bytes) -> None:
            replies.append(frame)
            if len(replies) == 3:
                done.set()

        for n in range(3):  # the third finds two in flight: refused at once
            runner.run(lambda n=n: work(n), reply, lambda: b"refused")  # type: ignore[misc]
        await asyncio.wait_for(done.wait(), 30)
        runner.close()
        assert all(name.startswith("magnetar-lookup") for name in threads)
        return replies, runner.in_flight

    replies, in_flight = asyncio.run(scenario())
    assert replies[0] == b"refused" and sorted(replies[1:]) == [b"answer-0", b"answer-1"]
    assert in_flight == 0


def test_a_standalone_runner_answers_at_once() -> None:
    async def scenario() -> list[bytes]:
        runner = LookupRunner(asyncio.get_running_loop(), threads=1, pending_max=0, inline=True)
        replies: list[bytes] = []
        runner.run(lambda: b"now", replies.append, lambda: b"refused")
        return replies

    assert asyncio.run(scenario()) == [b"now"]
