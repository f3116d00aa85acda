"""Namespace policy values are bounded in the broker (``broker/namespace/policies.py``), whatever the transport.

Checks: every key's values at their bound are stored in their stored form and one step beyond is
refused with ``InvalidRequest`` naming the bound; booleans do not pass for integers; an unknown
key is refused; grants are bounded in roles, role names and actions; a refused change leaves the
stored policies as they were; the actions a grant may name are the ones the edge authorizes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from api.auth import Action
from broker.errors import AlreadyExists, InvalidRequest
from broker.limits import (
    GRANTED_ROLES_MAX,
    MESSAGE_TTL_SECONDS_MAX,
    RETENTION_SIZE_MB_MAX,
    RETENTION_TIME_MINUTES_MAX,
    ROLE_NAME_CHARS_MAX,
)
from broker.namespace.policies import NAMESPACE_ACTIONS, checked_policy
from broker.service import BrokerConfig, BrokerService

QUORUM = {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1}


@pytest.fixture
def service(data_dir: str) -> Iterator[BrokerService]:
    opened = BrokerService(data_dir, BrokerConfig.test_min())
    opened.start()
    yield opened
    opened.close()


ACCEPTED: list[tuple[str, Any, Any]] = [
    ("retention_policies", {"retentionTimeInMinutes": RETENTION_TIME_MINUTES_MAX, "retentionSizeInMB": -1},
     {"retentionTimeInMinutes": RETENTION_TIME_MINUTES_MAX, "retentionSizeInMB": -1}),
    ("retention_policies", {"retentionTimeInMinutes": -1, "retentionSizeInMB": RETENTION_SIZE_MB_MAX, "x": 1},
     {"retentionTimeInMinutes": -1, "retentionSizeInMB": RETENTION_SIZE_MB_MAX}),
    ("message_ttl_in_seconds", MESSAGE_TTL_SECONDS_MAX, MESSAGE_TTL_SECONDS_MAX),
    ("message_ttl_in_seconds", None, None),
    ("deduplicationEnabled", False, False),
    ("deduplicationEnabled", None, None),
    ("auth_policies", {"namespace_auth": {"r" * ROLE_NAME_CHARS_MAX: ["produce", "consume", "produce"]}},
     {"namespace_auth": {"r" * ROLE_NAME_CHARS_MAX: ["consume", "produce"]}}),
    ("auth_policies", {}, {"namespace_auth": {}}),
    ("persistence", {**QUORUM, "managedLedgerMaxMarkDeleteRate": 1e6},
     {**QUORUM, "managedLedgerMaxMarkDeleteRate": 1e6}),
    ("persistence", None, None),
]

REFUSED: list[tuple[str, Any, str]] = [
    ("retention_policies", {"retentionTimeInMinutes": RETENTION_TIME_MINUTES_MAX + 1, "retentionSizeInMB": 0},
     "retentionTimeInMinutes must be -1 (unlimited) or 0..2147483647 minutes"),
    ("retention_policies", {"retentionTimeInMinutes": 0, "retentionSizeInMB": -2}, "retentionSizeInMB must be"),
    ("retention_policies", {"retentionTimeInMinutes": 0}, "retentionSizeInMB must be"),
    ("retention_policies", [1, 2], "must be an object"),
    ("message_ttl_in_seconds", MESSAGE_TTL_SECONDS_MAX + 1, "messageTTL must be 0..2147483647 seconds"),
    ("message_ttl_in_seconds", True, "messageTTL must be"),
    ("message_ttl_in_seconds", 1.5, "messageTTL must be"),
    ("deduplicationEnabled", "yes", "true, false or null"),
    ("auth_policies", {"namespace_auth": {"": ["consume"]}}, "1..256 characters"),
    ("auth_policies", {"namespace_auth": {"r" * (ROLE_NAME_CHARS_MAX + 1): ["consume"]}}, "1..256 characters"),
    ("auth_policies", {"namespace_auth": {"app": ["fly"]}}, "unknown actions ['fly']"),
    ("auth_policies", {"namespace_auth": {"app": "consume"}}, "a list of names"),
    ("auth_policies", {"namespace_auth": {f"r{i}": ["consume"] for i in range(GRANTED_ROLES_MAX + 1)}},
     f"at most {GRANTED_ROLES_MAX} roles"),
    ("auth_policies", {"other": {}}, "holding namespace_auth (and destination_auth"),
    ("auth_policies", {"destination_auth": {"persistent://public/default/t": {"r": ["produce"]}}},
     "topic and subscription grants are not supported"),
    ("replication_clusters", ["standalone", ""], "at most 64 cluster names"),
    ("replication_clusters", "standalone", "at most 64 cluster names"),
    ("persistence", {**QUORUM, "managedLedgerMaxMarkDeleteRate": math.inf}, "managedLedgerMaxMarkDeleteRate"),
    ("persistence", {**QUORUM, "managedLedgerMaxMarkDeleteRate": math.nan}, "managedLedgerMaxMarkDeleteRate"),
    ("persistence", {**QUORUM, "bookkeeperAckQuorum": 2}, "AckQuorum (2) >= 1 must hold"),
    ("persistence", {"bookkeeperEnsemble": 1}, "must hold integer"),
    ("compaction-threshold", 1, "unknown namespace policy 'compaction-threshold'"),
]


@pytest.mark.parametrize(("key", "value", "stored"), ACCEPTED)
def test_values_within_their_bound_are_stored_in_their_stored_form(
        service: BrokerService, key: str, value: Any, stored: Any) -> None:
    assert checked_policy(key, value) == stored
    service.namespaces.set_policy("public/default", key, value)
    assert service.namespaces.policies("public/default")[key] == stored


@pytest.mark.parametrize(("key", "value", "message"), REFUSED)
def test_values_beyond_their_bound_are_refused_with_the_bound(
        service: BrokerService, key: str, value: Any, message: str) -> None:
    before = service.namespaces.policies("public/default")
    with pytest.raises(InvalidRequest) as refused:
        service.namespaces.set_policy("public/default", key, value)
    assert message in str(refused.value)
    assert service.namespaces.policies("public/default") == before
    with pytest.raises(InvalidRequest):
        service.namespaces.create_namespace("public/refused", {key: value})
    assert "public/refused" not in service.namespaces.namespaces("public")


def test_grants_name_exactly_the_actions_the_edge_authorizes() -> None:
    assert {action.value for action in Action} == NAMESPACE_ACTIONS


def test_a_namespace_bundles_policy_is_checked_and_stored_as_boundaries() -> None:
    from broker.namespace.policies import checked_policy

    stored = checked_policy("bundles", {"numBundles": 4})
    assert stored == {"boundaries": ["0x00000000", "0x40000000", "0x80000000", "0xc0000000", "0xffffffff"],
                      "numBundles": 4}
    assert checked_policy("bundles", None) is None
    for bad in ({"numBundles": 5000}, {"numBundles": "4"}, {"boundaries": ["0x10", "0x00000000"]},
                {"boundaries": [f"0x{i:08x}" for i in range(2000)]}, ["0x0"]):
        with pytest.raises(InvalidRequest):
            checked_policy("bundles", bad)


def test_the_brokers_own_public_default_is_replaced_once_by_an_administrators_create(
        service: BrokerService) -> None:
    grants = {"namespace_auth": {"anonymous": ["consume", "produce"]}}
    service.namespaces.create_tenant("public", {"adminRoles": ["anonymous"]})
    service.namespaces.create_namespace("public/default", {"auth_policies": grants,
                                                           "replication_clusters": ["standalone"]})
    assert service.namespaces.tenant_info("public")["adminRoles"] == ["anonymous"]
    policies = service.namespaces.policies("public/default")
    assert policies["auth_policies"] == grants and policies["replication_clusters"] == ["standalone"]
    with pytest.raises(AlreadyExists):
        service.namespaces.create_tenant("public", {})
    with pytest.raises(AlreadyExists):
        service.namespaces.create_namespace("public/default", {})
    assert service.namespaces.policies("public/default")["auth_policies"] == grants


def test_a_change_claims_the_brokers_own_namespace(service: BrokerService) -> None:
    service.namespaces.set_policy("public/default", "message_ttl_in_seconds", 60)
    with pytest.raises(AlreadyExists):
        service.namespaces.create_namespace("public/default", {})
    assert service.namespaces.policies("public/default")["message_ttl_in_seconds"] == 60


def test_the_schema_compatibility_strategy_is_a_policy_of_known_strategies() -> None:
    """``PUT .../schemaCompatibilityStrategy`` stores it: once refused as an unknown policy."""
    assert checked_policy("schema_compatibility_strategy", "always_compatible") == "ALWAYS_COMPATIBLE"
    assert checked_policy("schema_compatibility_strategy", None) is None
    with pytest.raises(InvalidRequest, match="use one of UNDEFINED, ALWAYS_INCOMPATIBLE"):
        checked_policy("schema_compatibility_strategy", "SOMETIMES")
