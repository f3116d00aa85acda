"""The commands the broker sends, built once here, and the one mapping of errors onto them.

Role: the session decides what to answer; this module knows how each answer is spelled in
Pulsar's protocol (which ``BaseCommand`` field, which ``ServerError``). ``server_error`` is the
only place where the broker's error hierarchy (``MagnetarError.code``, storage errors included)
becomes a Pulsar ``ServerError``: a request is answered with ``ERROR``, a send with
``SEND_ERROR``, a lookup with its own ``Failed`` response, all from the same table.
"""

from __future__ import annotations

from collections.abc import Sequence

from api.limits import ERROR_MESSAGE_CHARS_MAX
from api.pulsar.framing import command_frame
from api.pulsar.hot_commands import message_command, send_receipt_command
from api.pulsar.proto import pulsar_api_pb2 as pb
from broker import MagnetarError

T = pb.BaseCommand.Type
E = pb.ServerError

_ERRORS: dict[str, int] = {
    "not_found": E.TopicNotFound,
    "invalid_request": E.NotAllowedError,
    "consumer_busy": E.ConsumerBusy,
    "producer_busy": E.ProducerBusy,
    "producer_fenced": E.ProducerFenced,
    "topic_terminated": E.TopicTerminatedError,
    "unauthorized": E.AuthenticationError,
    "forbidden": E.AuthorizationError,
    "not_allowed": E.NotAllowedError,
    "quota_exceeded": E.NotAllowedError,  # maxTopicsPerNamespace, maxSubscriptionsPerTopic, as Pulsar answers
    "incompatible_schema": E.IncompatibleSchema,
    "corrupt_entry": E.ChecksumError,
    "message_too_large": E.NotAllowedError,
    "duplicate_in_flight": E.ServiceNotReady,
    "topic_redirect": E.ServiceNotReady,
    "service_unit_not_ready": E.ServiceNotReady,
    "ledger_fenced": E.ServiceNotReady,  # another broker recovered the topic: look it up again
    "too_many_requests": E.TooManyRequests,
    "encryption_required": E.MetadataError,  # Pulsar's answer to a producer that does not encrypt there
}
"""``MagnetarError.code`` → ``ServerError`` (``_unlisted`` for the rest). A request the broker
refuses as given, a malformed topic, tenant, namespace or subscription name included, is
``NotAllowedError``: final for every official client (Pulsar's C++ client, under the Python
one, retries ``UnknownError`` and even ``InvalidTopicName`` until its operation timeout, at the
lookup, the PRODUCER and the SUBSCRIBE alike; Pulsar's own broker never meets such names, the
clients refuse them before sending). A topic this broker does not serve (``TopicNotOwned``),
whose bundle is between owners, or whose ledger another broker fenced while recovering it is
``ServiceNotReady``, as Pulsar's broker answers it: the client looks the topic up again and goes
to the owner. ARCHITECTURE.md ("Refusals on the binary protocol") lists the table."""


def server_error(error: BaseException) -> tuple[int, str]:
    """The ``ServerError`` and message text for ``error``."""
    text = str(error)[:ERROR_MESSAGE_CHARS_MAX]
    if isinstance(error, MagnetarError):
        code = _ERRORS.get(error.code)
        if code is None:
            code = _unlisted(error)
        return code, text or error.code
    return E.UnknownError, text or type(error).__name__


def _unlisted(error: MagnetarError) -> int:
    """A code not in ``_ERRORS``: a storage failure (5xx) is ``PersistenceError`` and a refusal
    worth retrying ``UnknownError`` (both retried by the client); any other refusal is final,
    ``NotAllowedError``."""
    if error.http_status >= 500:
        return E.PersistenceError
    return E.UnknownError if error.retriable else E.NotAllowedError


def _frame(kind: int, field: str, **values: object) -> bytes:
    command = pb.BaseCommand(type=kind)  # type: ignore[arg-type]
    getattr(command, field).SetInParent()
    for name, value in values.items():
        if value is not None:
            setattr(getattr(command, field), name, value)
    return command_frame(command)


def connected(server_version: str, protocol_version: int, max_message_size: int) -> bytes:
    command = pb.BaseCommand(type=T.CONNECTED)
    command.connected.server_version = server_version
    command.connected.protocol_version = protocol_version
    command.connected.max_message_size = max_message_size
    command.connected.feature_flags.supports_topic_watchers = True
    return command_frame(command)


REFRESH_AUTH_DATA = b"PulsarAuthRefresh"
"""What Pulsar's broker puts in an AUTH_CHALLENGE that asks for fresh credentials."""


def auth_challenge(server_version: str, protocol_version: int, method: str) -> bytes:
    command = pb.BaseCommand(type=T.AUTH_CHALLENGE)
    body = command.authChallenge
    body.server_version = server_version
    body.protocol_version = protocol_version
    body.challenge.auth_method_name = method
    body.challenge.auth_data = REFRESH_AUTH_DATA
    return command_frame(command)


def ping() -> bytes:
    return _frame(T.PING, "ping")


def pong() -> bytes:
    return _frame(T.PONG, "pong")


def success(request_id: int) -> bytes:
    return _frame(T.SUCCESS, "success", request_id=request_id)


def error(request_id: int, failure: BaseException) -> bytes:
    code, text = server_error(failure)
    return error_of(request_id, code, text)


def error_of(request_id: int, code: int, text: str) -> bytes:
    return _frame(T.ERROR, "error", request_id=request_id, error=code, message=text)


def partitioned_metadata(request_id: int, partitions: int) -> bytes:
    return _frame(T.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse", request_id=request_id,
                  partitions=partitions, response=pb.CommandPartitionedTopicMetadataResponse.Success)


def partitioned_metadata_failed(request_id: int, failure: BaseException) -> bytes:
    code, text = server_error(failure)
    return _frame(T.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse", request_id=request_id,
                  response=pb.CommandPartitionedTopicMetadataResponse.Failed, error=code, message=text)


def lookup(request_id: int, service_url: str, service_url_tls: str | None, *, redirect: bool,
           authoritative: bool) -> bytes:
    """Connect (this broker serves the topic: produce and consume here) or Redirect (ask the
    named broker, which will answer Connect); never through the service URL (no proxy)."""
    kind = pb.CommandLookupTopicResponse.Redirect if redirect else pb.CommandLookupTopicResponse.Connect
    return _frame(T.LOOKUP_RESPONSE, "lookupTopicResponse", request_id=request_id, brokerServiceUrl=service_url,
                  brokerServiceUrlTls=service_url_tls or None, response=kind, authoritative=authoritative,
                  proxy_through_service_url=False)


def lookup_failed(request_id: int, failure: BaseException) -> bytes:
    code, text = server_error(failure)
    return _frame(T.LOOKUP_RESPONSE, "lookupTopicResponse", request_id=request_id,
                  response=pb.CommandLookupTopicResponse.Failed, error=code, message=text)


def producer_success(request_id: int, producer_name: str, last_sequence_id: int,
                     schema_version: bytes | None, topic_epoch: int | None, *, ready: bool = True) -> bytes:
    return _frame(T.PRODUCER_SUCCESS, "producer_success", request_id=request_id, producer_name=producer_name,
                  last_sequence_id=last_sequence_id, schema_version=schema_version, topic_epoch=topic_epoch,
                  producer_ready=ready)


def send_receipt(producer_id: int, sequence_id: int, highest_sequence_id: int, ledger_id: int,
                 entry_id: int, partition: int) -> bytes:
    """Spelled by hand (one per message): the bytes protobuf would write."""
    return send_receipt_command(producer_id, sequence_id, highest_sequence_id, ledger_id, entry_id, partition)


def send_error(producer_id: int, sequence_id: int, failure: BaseException) -> bytes:
    code, text = server_error(failure)
    return _frame(T.SEND_ERROR, "send_error", producer_id=producer_id, sequence_id=sequence_id, error=code,
                  message=text)


def message(consumer_id: int, ledger_id: int, entry_id: int, partition: int, redelivery_count: int,
            ack_set: Sequence[int], payload: memoryview) -> tuple[bytes, bytes | memoryview]:
    return message_command(consumer_id, ledger_id, entry_id, partition, redelivery_count, ack_set, payload)


def ack_response(consumer_id: int, request_id: int, failure: BaseException | None = None) -> bytes:
    if failure is None:
        return _frame(T.ACK_RESPONSE, "ackResponse", consumer_id=consumer_id, request_id=request_id)
    code, text = server_error(failure)
    return _frame(T.ACK_RESPONSE, "ackResponse", consumer_id=consumer_id, request_id=request_id, error=code,
                  message=text)


def close_producer(producer_id: int, request_id: int) -> bytes:
    return _frame(T.CLOSE_PRODUCER, "close_producer", producer_id=producer_id, request_id=request_id)


def close_consumer(consumer_id: int, request_id: int) -> bytes:
    return _frame(T.CLOSE_CONSUMER, "close_consumer", consumer_id=consumer_id, request_id=request_id)


def reached_end_of_topic(consumer_id: int) -> bytes:
    return _frame(T.REACHED_END_OF_TOPIC, "reachedEndOfTopic", consumer_id=consumer_id)


def active_consumer_change(consumer_id: int, is_active: bool) -> bytes:
    return _frame(T.ACTIVE_CONSUMER_CHANGE, "active_consumer_change", consumer_id=consumer_id, is_active=is_active)


def last_message_id(request_id: int, ledger_id: int, entry_id: int, partition: int, batch_index: int,
                    mark_delete: tuple[int, int] | None) -> bytes:
    command = pb.BaseCommand(type=T.GET_LAST_MESSAGE_ID_RESPONSE)
    body = command.getLastMessageIdResponse
    body.request_id = request_id
    body.last_message_id.ledgerId = ledger_id % (1 << 64)
    body.last_message_id.entryId = entry_id % (1 << 64)
    if partition >= 0:
        body.last_message_id.partition = partition
    if batch_index >= 0:
        body.last_message_id.batch_index = batch_index
    if mark_delete is not None:
        body.consumer_mark_delete_position.ledgerId = mark_delete[0] % (1 << 64)
        body.consumer_mark_delete_position.entryId = mark_delete[1] % (1 << 64)
    return command_frame(command)


def topics_of_namespace(request_id: int, topics: Sequence[str], *, filtered: bool, topics_hash: str,
                        changed: bool) -> bytes:
    command = pb.BaseCommand(type=T.GET_TOPICS_OF_NAMESPACE_RESPONSE)
    body = command.getTopicsOfNamespaceResponse
    body.request_id = request_id
    body.topics.extend(topics)
    body.filtered = filtered
    body.topics_hash = topics_hash
    body.changed = changed
    return command_frame(command)


def watch_topic_list_success(request_id: int, watcher_id: int, topics: Sequence[str], topics_hash: str) -> bytes:
    command = pb.BaseCommand(type=T.WATCH_TOPIC_LIST_SUCCESS)
    body = command.watchTopicListSuccess
    body.request_id = request_id
    body.watcher_id = watcher_id
    body.topic.extend(topics)
    body.topics_hash = topics_hash
    return command_frame(command)


def watch_topic_update(watcher_id: int, new_topics: Sequence[str], deleted_topics: Sequence[str],
                       topics_hash: str) -> bytes:
    command = pb.BaseCommand(type=T.WATCH_TOPIC_UPDATE)
    body = command.watchTopicUpdate
    body.watcher_id = watcher_id
    body.new_topics.extend(new_topics)
    body.deleted_topics.extend(deleted_topics)
    body.topics_hash = topics_hash
    return command_frame(command)


def schema_response(request_id: int, schema: pb.Schema | None, version: bytes | None,
                    failure: BaseException | None = None) -> bytes:
    command = pb.BaseCommand(type=T.GET_SCHEMA_RESPONSE)
    body = command.getSchemaResponse
    body.request_id = request_id
    _schema_failure(body, failure)
    if schema is not None:
        body.schema.CopyFrom(schema)
    if version is not None:
        body.schema_version = version
    return command_frame(command)


def get_or_create_schema_response(request_id: int, version: bytes | None,
                                  failure: BaseException | None = None) -> bytes:
    command = pb.BaseCommand(type=T.GET_OR_CREATE_SCHEMA_RESPONSE)
    body = command.getOrCreateSchemaResponse
    body.request_id = request_id
    _schema_failure(body, failure)
    if version is not None:
        body.schema_version = version
    return command_frame(command)


def _schema_failure(body: pb.CommandGetSchemaResponse | pb.CommandGetOrCreateSchemaResponse,
                    failure: BaseException | None) -> None:
    """A schema answer's error code and message, when it failed."""
    if failure is not None:
        code, text = server_error(failure)
        body.error_code = code  # type: ignore[assignment]
        body.error_message = text


def consumer_stats(request_id: int, name: str, permits: int, unacked: int, blocked: bool, sub_type: str,
                   backlog: int) -> bytes:
    return _frame(T.CONSUMER_STATS_RESPONSE, "consumerStatsResponse", request_id=request_id, consumerName=name,
                  availablePermits=max(permits, 0), unackedMessages=unacked, blockedConsumerOnUnackedMsgs=blocked,
                  type=sub_type, msgBacklog=backlog)
