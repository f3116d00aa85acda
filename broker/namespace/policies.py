"""Namespace policy values: what each may hold, and the one check every transport relies on.

Role: a namespace's policies document (``broker/namespace/namespaces.py``) is changed one key at a time
(``NamespaceService.set_policy``) or given whole when the namespace is created; every value passes
:func:`checked_policy` first, which returns it in its stored form or raises ``InvalidRequest``
(400) with a message that states the bound. The bounds (the README's "Namespace policies" table):

========================== ==================================================================
``retention_policies``     null (the broker's default retention) or ``retentionTimeInMinutes``
                           -1 (unlimited) or 0..2^31-1 (Pulsar's ``int``) and
                           ``retentionSizeInMB`` -1 (unlimited) or 0..2^43-1 (so the size in
                           bytes fits a signed 64-bit integer)
``message_ttl_in_seconds`` null (none) or 0..2^31-1 (0: none; Pulsar's ``Integer``, ~68 years)
``deduplicationEnabled``   null (the broker's default), true or false
``auth_policies``          ``namespace_auth``: at most ``GRANTED_ROLES_MAX`` roles of 1..256
                           characters, each granted a subset of ``NAMESPACE_ACTIONS``; Pulsar's
                           ``destination_auth`` and ``subscription_auth_roles`` only empty
                           (topic and subscription grants are not kept)
``replication_clusters``   null or a list of at most ``CLUSTERS_MAX`` cluster names (the
                           admin API checks that they exist)
``persistence``            null or ``broker/namespace/persistence.py``'s quorum rule and bounds
``bundles``                null or ``boundaries`` (hexadecimal, strictly increasing from
                           0x00000000 to 0xffffffff) or ``numBundles``, at most 1024 bundles
                           (``broker/namespace/bundles.py``)
``max_producers_per_topic`` null (the broker's default) or 0..2^31-1 (0: unlimited); likewise
                           ``max_consumers_per_topic``, ``max_subscriptions_per_topic`` and
                           ``max_topics_per_namespace`` (``broker/quotas.py``)
``publishMaxMessageRate``  null or Pulsar's ``PublishRate`` of each topic:
                           ``publishThrottlingRateInMsg`` and ``publishThrottlingRateInByte``,
                           each -1 (unlimited) or 0..2^31-1 messages / 0..2^63-1 bytes per second
``topicDispatchRate``      null or Pulsar's ``DispatchRate`` of each topic:
                           ``dispatchThrottlingRateInMsg``, ``dispatchThrottlingRateInByte`` (as
                           above, per period), ``ratePeriodInSecond`` 1..86400,
                           ``relativeToPublishRate``
``schema_compatibility_strategy`` null or one of Pulsar's ``SchemaCompatibilityStrategy`` values
                           (UNDEFINED: the broker's ``schemaCompatibilityStrategy`` applies;
                           ``broker/schema_compatibility.py``)
``is_allow_auto_update_schema`` null (the broker's ``isAllowAutoUpdateSchemaEnabled``), true
                           or false; likewise ``schema_validation_enforced``
                           (``isSchemaValidationEnforced``)
``offload_threshold``      null (the broker's ``managedLedgerOffloadThresholdInBytes``) or
                           -1 (off), 0 (every closed ledger) .. 2^63-1 bytes kept on the
                           bookies; likewise ``offload_threshold_in_seconds`` (-1 off, else
                           seconds) and ``offload_deletion_lag_ms`` (0..2^63-1 ms)
========================== ==================================================================

Invariant: a key not in ``POLICY_KEYS`` is refused, so nothing unchecked reaches the document.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from broker.errors import InvalidRequest
from broker.limits import (
    BUNDLES_MAX,
    CLUSTERS_MAX,
    GRANTED_ROLES_MAX,
    MESSAGE_TTL_SECONDS_MAX,
    RETENTION_SIZE_MB_MAX,
    RETENTION_TIME_MINUTES_MAX,
    ROLE_NAME_CHARS_MAX,
)
from broker.namespace.bundles import POLICY_KEY as BUNDLES_KEY
from broker.namespace.bundles import NamespaceBundles
from broker.namespace.persistence import POLICY_KEY as PERSISTENCE_KEY
from broker.namespace.persistence import PersistencePolicy, check_bounds
from broker.quotas import checked_dispatch_rate, checked_publish_rate, count_limit
from broker.schema_compatibility import checked_strategy

NAMESPACE_ACTIONS = frozenset({"produce", "consume"})
"""What a namespace grant may allow (Pulsar also knows functions, sources, sinks and packages)."""
UNLIMITED = -1
UNKEPT_GRANTS = ("destination_auth", "subscription_auth_roles")
"""Pulsar's topic and subscription grants: accepted empty (as ``pulsar-admin`` sends them), not kept."""


def _bounded(name: str, value: Any, low: int, high: int, bound: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be {bound}, not {value!r}", field=name)
    return value


def _retention(value: Any) -> dict[str, int] | None:
    if value is None:  # no policy of its own: the broker's default retention applies
        return None
    if not isinstance(value, Mapping):
        raise InvalidRequest("retention_policies must be an object with retentionTimeInMinutes and retentionSizeInMB")
    return {"retentionTimeInMinutes": _bounded(
                "retentionTimeInMinutes", value.get("retentionTimeInMinutes"), UNLIMITED, RETENTION_TIME_MINUTES_MAX,
                f"-1 (unlimited) or 0..{RETENTION_TIME_MINUTES_MAX} minutes"),
            "retentionSizeInMB": _bounded(
                "retentionSizeInMB", value.get("retentionSizeInMB"), UNLIMITED, RETENTION_SIZE_MB_MAX,
                f"-1 (unlimited) or 0..{RETENTION_SIZE_MB_MAX} MB")}


def _message_ttl(value: Any) -> int | None:
    if value is None:
        return None
    return _bounded("messageTTL", value, 0, MESSAGE_TTL_SECONDS_MAX, f"0..{MESSAGE_TTL_SECONDS_MAX} seconds (0: none)")


def _long_or_off(name: str, low: int) -> Callable[[Any], int | None]:
    """An offload policy: null (the broker's setting) or ``low``..2^63-1 (Pulsar's ``long``)."""
    def check(value: Any) -> int | None:
        return None if value is None else _bounded(name, value, low, 2**63 - 1, f"{low}..2^63-1 or null")
    return check


OFFLOAD_POLICY_FIELDS = {"managedLedgerOffloadThresholdInBytes": ("offload_threshold_bytes", -1),
                         "managedLedgerOffloadThresholdInSeconds": ("offload_threshold_seconds", -1),
                         "managedLedgerOffloadDeletionLagInMillis": ("offload_deletion_lag_ms", 0)}
"""Pulsar's ``OffloadPolicies`` fields a topic may set: field → (managed ledger setting, lowest value)."""


def checked_offload_policies(value: Any) -> dict[str, int] | None:
    """A topic's ``offloadPolicies``: null, or Pulsar's ``OffloadPolicies`` of which the
    thresholds and the deletion lag are kept (the store is the broker's: its driver fields are
    not kept); each -1 (off; the lag 0) .. 2^63-1, or null (the namespace's applies)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidRequest("offloadPolicies must be an object (Pulsar's OffloadPolicies)", field="offloadPolicies")
    return {field: _bounded(field, value[field], low, 2**63 - 1, f"{low}..2^63-1 or null")
            for field, (_, low) in OFFLOAD_POLICY_FIELDS.items() if value.get(field) is not None}


def _deduplication(value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"deduplicationEnabled must be true, false or null, not {value!r}")
    return value


def _flag(key: str) -> Callable[[Any], bool | None]:
    def check(value: Any) -> bool | None:
        if value is not None and not isinstance(value, bool):
            raise InvalidRequest(f"{key} must be true, false or null, not {value!r}")
        return value
    return check


def check_role(role: Any) -> str:
    if not isinstance(role, str) or not role.strip() or len(role) > ROLE_NAME_CHARS_MAX:
        raise InvalidRequest(f"a role name must be 1..{ROLE_NAME_CHARS_MAX} characters and not blank", field="role")
    return role


def _actions(actions: Any) -> list[str]:
    if not isinstance(actions, list | tuple) or not all(isinstance(a, str) for a in actions):
        raise InvalidRequest(f"actions must be a list of names, not {actions!r}", field="actions")
    unknown = sorted(set(actions) - NAMESPACE_ACTIONS)
    if unknown:
        raise InvalidRequest(f"unknown actions {unknown}: grant any of {sorted(NAMESPACE_ACTIONS)}", field="actions")
    return sorted(set(actions))


def _grants(value: Any) -> dict[str, list[str]]:
    if not isinstance(value, Mapping):
        raise InvalidRequest("namespace_auth must map roles to lists of actions")
    if len(value) > GRANTED_ROLES_MAX:
        raise InvalidRequest(f"a namespace grants actions to at most {GRANTED_ROLES_MAX} roles, not {len(value)}")
    return {check_role(role): _actions(actions) for role, actions in value.items()}


def _auth(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping) or set(value) - {"namespace_auth", *UNKEPT_GRANTS}:
        raise InvalidRequest("auth_policies must be an object holding namespace_auth "
                             f"(and {' and '.join(UNKEPT_GRANTS)} empty)")
    kept = [key for key in UNKEPT_GRANTS if value.get(key)]
    if kept:
        raise InvalidRequest(f"{', '.join(kept)}: topic and subscription grants are not supported; grant on the "
                             "namespace (namespace_auth)")
    return {"namespace_auth": _grants(value.get("namespace_auth", {}))}


def _clusters(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(isinstance(c, str) and c for c in value) \
            or len(value) > CLUSTERS_MAX:
        raise InvalidRequest(f"replication_clusters must be a list of at most {CLUSTERS_MAX} cluster names",
                             field="replication_clusters")
    return sorted(set(value))


def _persistence(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        policy = PersistencePolicy.from_json(value)
    except (KeyError, TypeError, ValueError):
        raise InvalidRequest("persistence must hold integer bookkeeperEnsemble, bookkeeperWriteQuorum and "
                             "bookkeeperAckQuorum") from None
    return check_bounds(policy).to_json()


def _bundles(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, dict) and isinstance(value.get("boundaries"), list) \
            and len(value["boundaries"]) > BUNDLES_MAX + 1:
        raise InvalidRequest(f"a namespace has at most {BUNDLES_MAX} bundles")
    return NamespaceBundles.from_policy("the namespace", value).to_policy()


POLICY_KEYS: dict[str, Callable[[Any], Any]] = {
    "retention_policies": _retention,
    "message_ttl_in_seconds": _message_ttl,
    "deduplicationEnabled": _deduplication,
    "auth_policies": _auth,
    "replication_clusters": _clusters,
    PERSISTENCE_KEY: _persistence,
    BUNDLES_KEY: _bundles,
    "max_producers_per_topic": count_limit("maxProducersPerTopic"),
    "max_consumers_per_topic": count_limit("maxConsumersPerTopic"),
    "max_subscriptions_per_topic": count_limit("maxSubscriptionsPerTopic"),
    "max_topics_per_namespace": count_limit("maxTopicsPerNamespace"),
    "publishMaxMessageRate": checked_publish_rate,
    "topicDispatchRate": checked_dispatch_rate,
    "schema_compatibility_strategy": checked_strategy,
    "is_allow_auto_update_schema": _flag("isAllowAutoUpdateSchema"),
    "schema_validation_enforced": _flag("schemaValidationEnforced"),
    "encryption_required": _flag("encryption_required"),
    "offload_threshold": _long_or_off("offloadThreshold", -1),
    "offload_threshold_in_seconds": _long_or_off("offloadThresholdInSeconds", -1),
    "offload_deletion_lag_ms": _long_or_off("offloadDeletionLagMs", 0),
}
"""Each policy key and the check its values pass."""


def checked_policy(key: str, value: Any) -> Any:
    """``value`` in its stored form, if ``key`` may hold it; otherwise ``InvalidRequest``."""
    check = POLICY_KEYS.get(key)
    if check is None:
        raise InvalidRequest(f"unknown namespace policy {key!r}; known: {sorted(POLICY_KEYS)}")
    return check(value)


def checked_policies(policies: Mapping[str, Any]) -> dict[str, Any]:
    """Every given policy, checked (a namespace created with some of them)."""
    return {key: checked_policy(key, value) for key, value in policies.items()}
