"""Magnetar's Python client: producers, consumers and readers over Pulsar's WebSocket API, REST
produce (PIP-64) and admin calls over HTTP, with token authentication; an ``https://`` service
URL goes over TLS (HTTPS and WSS) with Pulsar's client options ``tls_trust_certs_file_path`` and,
for mutual TLS, ``tls_certificate_file_path`` and ``tls_private_key_file_path``
(``consumers/tls.py``).

``AsyncClient`` (asyncio) holds the one implementation; ``Client`` is its blocking face, driving
it from a background event-loop thread. Every wait is bounded or explicitly asked for
(``receive(timeout_ms=None)``), every buffer is bounded, and every broker error arrives as a
``ClientError`` carrying the broker's ``code`` and ``message``. Reconnection is not attempted:
a lost connection fails pending calls with ``ConnectionClosed``. A consumer subscribed with
``retry_enable=True`` hands messages back for a later try with ``reconsume_later`` (Pulsar's
retry-letter topic policy, ``_retry.py``).

    with Client("http://127.0.0.1:8080") as client:
        producer = client.create_producer("orders")
        producer.send(b"hello", key="k1")
        consumer = client.subscribe("orders", "sub", initial_position="earliest")
        message = consumer.receive(timeout_ms=5000)
        consumer.acknowledge(message)
        client.append("orders", "order-7", [b"created"], expected_version=-1)  # an event stream
        client.dcb_append("courses", [DcbEvent("Joined", b"", ["course-1"])],   # a DCB event, on a condition
                          [DcbQueryItem(tags=["course-1"])], after=0)
"""

from consumers.client._async import DEFAULT_SERVICE_URL, AsyncClient
from consumers.client._calls import HttpRequest
from consumers.client._consumer import AsyncConsumer, AsyncReader
from consumers.client._dcb import DcbConditionFailed, DcbEvent, DcbQueryItem, DcbReadResult, DcbSequencedEvent
from consumers.client._http_call import PendingGet
from consumers.client._producer import AsyncProducer
from consumers.client._streams import AsyncStreamReader
from consumers.client._sync import Client, Consumer, Producer, Reader
from consumers.client.errors import (
    ClientError,
    ConnectError,
    ConnectionClosed,
    ConsumerError,
    HttpError,
    KeyVersionMismatch,
    ReceiveTimeout,
    SendError,
    SendTimeout,
)
from consumers.client.types import AppendResult, Message, MessageIdParts, SendResult, StreamBatch, StreamInfo, Topic

__all__ = [
    "DEFAULT_SERVICE_URL",
    "AppendResult",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncReader",
    "AsyncStreamReader",
    "Client",
    "ClientError",
    "ConnectError",
    "ConnectionClosed",
    "Consumer",
    "ConsumerError",
    "DcbConditionFailed",
    "DcbEvent",
    "DcbQueryItem",
    "DcbReadResult",
    "DcbSequencedEvent",
    "HttpError",
    "HttpRequest",
    "KeyVersionMismatch",
    "Message",
    "MessageIdParts",
    "PendingGet",
    "Producer",
    "Reader",
    "ReceiveTimeout",
    "SendError",
    "SendResult",
    "SendTimeout",
    "StreamBatch",
    "StreamInfo",
    "Topic",
]
