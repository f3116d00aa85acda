"""The broker's face: everything a transport (REST, WebSocket, the console's calls, a binary
protocol) may use, and nothing else.

Transports import from this package only, never from its modules (``tests/unit/test_layering.py``
enforces it), so the broker can change its insides without any edge noticing. The face:

- ``BrokerService``: the root object (lifecycle, health, statistics, policy and unload
  listeners) and its parts, one concept each: ``service.namespaces`` (tenants, namespace and
  topic policies, ``lookup``, ``check_served_here``, bundles), ``service.topics`` (the topic
  registry: topics and partitioned topics, ``route``, ``producer``), ``service.subscriptions``
  (``subscribe``/``subscribe_many``/``subscribe_pattern``, ``reader``, ``unsubscribe``,
  ``move_cursor``, ``watch_topics``), ``service.streams`` (``read_range`` and the event-stream
  reads), ``service.compactions``, ``service.maintenance`` and ``service.admin``, a
  ``TopicAdmin`` for subscriptions, cursor moves, single messages, statistics and
  acknowledgements by id;
- the values those hand out: ``Producer`` and ``PublishResult``, ``Consumer`` and
  ``MultiConsumer`` and the ``EntryRun``s they hand out (an entry or part of it: the binary
  protocol writes it as it is, with Pulsar's ack set; the other edges split it into
  ``Delivery``s), ``Reader``, statistics views, the broker-wide byte budgets
  (``service.reads_in_flight``, ``service.publish_buffer``: a ``ByteBudget`` each),
  ``StoredMessage``, ``RangeRead``; for event streams ``StreamInfo``, ``StreamRead`` and
  ``KeyReader`` (``service.streams``: ``stream_info``, ``read_stream``, ``stream_reader``); for
  dynamic consistency boundaries ``DcbEvent``, ``DcbQueryItem``, ``DcbRead`` (``service.streams.dcb``:
  ``read``, ``append``);
- topics' schemas (``SchemaRegistry``, ``service.schemas``: versions and Pulsar's compatibility
  strategies);
- the one way to build what is appended (``PreparedEntry``: ``entry_of_messages`` for a batch,
  ``entries_of_messages`` for a message per entry, ``entry_of_client`` for a binary client's
  own checked bytes), appended as a group with ``Producer.append``; Pulsar's ack sets
  (``ack_set_of``, ``cleared_indexes``);
- the one place each rule lives: names (``TopicName``, ``check_subscription_name``), message
  ids (``MessageId``), a produce request's fields (``message_of`` and friends), times
  (``iso_time``, ``parse_time_ms``), namespace policy bounds (``RETENTION_TIME_MINUTES_MAX``
  and friends, from ``broker/limits.py``, enforced by ``service.namespaces.set_policy``), topic quotas and rate limits
  (``QuotaDefaults`` and its standalone.conf keys ``QUOTA_CONFIG_KEYS``; the policies are set
  with ``set_policy`` and ``set_topic_policy``, ``TOPIC_POLICY_KEYS``);
- where a topic is served (``service.namespaces.lookup``, a ``LookupResult``; on a cluster
  broker a topic owned elsewhere raises ``TopicNotOwned``, which each transport turns into its
  redirect);
- the error hierarchy, mapped once per transport.
"""

from broker.bookkeeper.bookie import QuorumConfig
from broker.byte_budget import ByteBudget, ByteBudgetStats
from broker.compaction import CompactionStatus
from broker.consumer import Consumer, ConsumerConfig
from broker.dcb import DcbEvent, DcbRead
from broker.dcb import QueryItem as DcbQueryItem
from broker.delivery import Delivery, EntryRun
from broker.entry_builder import PreparedEntry, entries_of_messages, entry_of_client, entry_of_messages
from broker.entry_format import Compression, EncryptionContext, Message
from broker.entry_frames import ack_set_of, cleared_indexes
from broker.errors import (
    AlreadyExists,
    BrokerError,
    ConsumerBusy,
    CorruptEntry,
    DataLost,
    EncryptionRequired,
    Forbidden,
    IncompatibleSchema,
    InvalidRequest,
    KeyVersionMismatch,
    MagnetarError,
    NoSuchEntry,
    NotAllowed,
    NotFound,
    OffsetMismatch,
    PreconditionFailed,
    ProducerBusy,
    ProducerFenced,
    QuotaExceeded,
    ServiceUnitNotReady,
    TopicNotOwned,
    TopicTerminated,
    Unauthorized,
)
from broker.event_streams import KEY_VERSION_COLUMN, KeyReader, StreamInfo, StreamRead
from broker.key_index import KeyIndexStats
from broker.limits import (
    BUNDLES_MAX,
    DCB_READ_EVENTS_MAX,
    EXPECTED_KEYS_MAX,
    KEY_BYTES_MAX,
    MESSAGE_ID_TEXT_CHARS_MAX,
    MESSAGE_TTL_SECONDS_MAX,
    QUOTA_CONFIG_VALUE_MAX,
    RETENTION_SIZE_MB_MAX,
    RETENTION_TIME_MINUTES_MAX,
)
from broker.managed_ledger_config import ManagedLedgerConfig
from broker.message_fields import (
    MESSAGE_FIELDS,
    OFFSET_MAX,
    PAYLOAD_ENCODINGS,
    SEQUENCE_ID_MAX,
    VERSION_MAX,
    ExpectedVersion,
    ProducedMessage,
    build_message,
    check_fields,
    check_key,
    deliver_at_ms,
    expected_key_versions_of,
    integer_of,
    latest_delivery,
    message_of,
    payload_of,
)
from broker.message_id import MessageId, Position, message_id_bytes
from broker.namespace.lookup import AdvertisedListener, BrokerAddress, LookupResult
from broker.namespace.persistence import PersistencePolicy
from broker.namespace.topic_policies import TOPIC_POLICY_KEYS
from broker.producer import ROUTING_MODES, Producer, entry_result
from broker.producer_access import AccessHolder, AccessMode, ProducerAccess
from broker.quotas import CONFIG_KEYS as QUOTA_CONFIG_KEYS
from broker.quotas import QuotaDefaults
from broker.range_read import RangeRead
from broker.reader import Reader, StartPosition
from broker.routing import MultiConsumer
from broker.schema_compatibility import STRATEGIES as SCHEMA_STRATEGIES
from broker.schema_registry import TYPES as SCHEMA_TYPES
from broker.schema_registry import SchemaInfo, SchemaRegistry, version_bytes, version_of
from broker.service import BrokerConfig, BrokerService, BrokerStats, Health, check_offload_settings
from broker.subscription_stats import ConsumerStats, SubscriptionStats
from broker.subscription_type import SubscriptionType
from broker.time_format import TIME_MS_MAX, iso_time, parse_time_ms
from broker.topic import PublishResult
from broker.topic_admin import InitialPosition, MessagePosition, StoredMessage, TopicAdmin
from broker.topic_name import TopicName, check_namespace, check_subscription_name
from broker.topic_pattern import TopicPattern
from broker.topic_stats import CursorView, InternalStats, LedgerView, TopicStats
from storage import LatencyHistogram, LatencySnapshot, StorageStats

__all__ = [
    "BUNDLES_MAX",
    "MESSAGE_ID_TEXT_CHARS_MAX",
    "EXPECTED_KEYS_MAX",
    "KEY_BYTES_MAX",
    "KEY_VERSION_COLUMN",
    "MESSAGE_FIELDS",
    "MESSAGE_TTL_SECONDS_MAX",
    "OFFSET_MAX",
    "PAYLOAD_ENCODINGS",
    "RETENTION_SIZE_MB_MAX",
    "RETENTION_TIME_MINUTES_MAX",
    "ROUTING_MODES",
    "SCHEMA_STRATEGIES",
    "SCHEMA_TYPES",
    "SEQUENCE_ID_MAX",
    "TIME_MS_MAX",
    "VERSION_MAX",
    "AccessHolder",
    "AccessMode",
    "AdvertisedListener",
    "AlreadyExists",
    "BrokerAddress",
    "BrokerConfig",
    "check_offload_settings",
    "ManagedLedgerConfig",
    "BrokerError",
    "BrokerService",
    "BrokerStats",
    "ByteBudget",
    "ByteBudgetStats",
    "CompactionStatus",
    "Compression",
    "Consumer",
    "ConsumerBusy",
    "ConsumerConfig",
    "ConsumerStats",
    "CorruptEntry",
    "CursorView",
    "DataLost",
    "EncryptionRequired",
    "Delivery",
    "EncryptionContext",
    "EntryRun",
    "ExpectedVersion",
    "Forbidden",
    "Health",
    "IncompatibleSchema",
    "InitialPosition",
    "InternalStats",
    "InvalidRequest",
    "KeyIndexStats",
    "KeyReader",
    "KeyVersionMismatch",
    "LedgerView",
    "LookupResult",
    "MagnetarError",
    "Message",
    "MessageId",
    "MessagePosition",
    "MultiConsumer",
    "NoSuchEntry",
    "NotAllowed",
    "NotFound",
    "OffsetMismatch",
    "PersistencePolicy",
    "Position",
    "PreconditionFailed",
    "PreparedEntry",
    "QuotaExceeded",
    "QUOTA_CONFIG_KEYS",
    "QUOTA_CONFIG_VALUE_MAX",
    "QuotaDefaults",
    "TOPIC_POLICY_KEYS",
    "ProducedMessage",
    "Producer",
    "ProducerAccess",
    "ProducerBusy",
    "ProducerFenced",
    "LatencyHistogram",
    "LatencySnapshot",
    "PublishResult",
    "QuorumConfig",
    "RangeRead",
    "Reader",
    "ServiceUnitNotReady",
    "SchemaInfo",
    "SchemaRegistry",
    "StartPosition",
    "StorageStats",
    "StoredMessage",
    "StreamInfo",
    "StreamRead",
    "DcbEvent",
    "DcbQueryItem",
    "DcbRead",
    "DCB_READ_EVENTS_MAX",
    "SubscriptionType",
    "SubscriptionStats",
    "TopicAdmin",
    "TopicName",
    "TopicNotOwned",
    "TopicPattern",
    "TopicStats",
    "TopicTerminated",
    "Unauthorized",
    "ack_set_of",
    "build_message",
    "check_fields",
    "check_key",
    "check_namespace",
    "check_subscription_name",
    "cleared_indexes",
    "deliver_at_ms",
    "entries_of_messages",
    "entry_result",
    "entry_of_client",
    "entry_of_messages",
    "expected_key_versions_of",
    "integer_of",
    "iso_time",
    "latest_delivery",
    "message_id_bytes",
    "message_of",
    "parse_time_ms",
    "payload_of",
    "version_bytes",
    "version_of",
]
