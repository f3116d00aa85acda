"""Admin v2, quotas and rate limits: Pulsar's namespace and topic policies for them.

Role: each quota is a policy with ``GET`` (JSON ``null`` while unset), ``POST`` (set; the body
is an integer, or Pulsar's ``PublishRate`` / ``DispatchRate`` object) and ``DELETE`` (unset:
the next level applies), at Pulsar's paths:

- ``/admin/v2/namespaces/{tenant}/{namespace}/`` ``maxProducersPerTopic``,
  ``maxConsumersPerTopic``, ``maxSubscriptionsPerTopic``, ``maxTopicsPerNamespace``,
  ``publishRate``, ``dispatchRate`` (stored as the namespace policies
  ``max_producers_per_topic``, …, ``publishMaxMessageRate``, ``topicDispatchRate``);
- ``/admin/v2/persistent/{tenant}/{namespace}/{topic}/`` ``maxProducers``, ``maxConsumers``,
  ``maxSubscriptionsPerTopic``, ``publishRate``, ``dispatchRate``, and ``offloadPolicies``
  (Pulsar's ``OffloadPolicies``: its thresholds and deletion lag are kept; a partitioned
  topic's apply to every partition; the topic must exist).

A topic's own policy wins over its namespace's, which wins over the broker's default
(``broker/quotas.py``); a change applies at once to open topics. The broker checks each value
against its bound (400 naming it), so every transport meets the same rule.

Authorization: tenant administrators, checked before any broker call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import StrictInt

from api.admin_namespaces import namespace_name
from api.admin_topics import topic_name
from api.auth import Authorizer, Caller
from broker import BrokerService

NAMESPACE_QUOTAS: dict[str, str] = {
    "maxProducersPerTopic": "max_producers_per_topic",
    "maxConsumersPerTopic": "max_consumers_per_topic",
    "maxSubscriptionsPerTopic": "max_subscriptions_per_topic",
    "maxTopicsPerNamespace": "max_topics_per_namespace",
}
"""Path → namespace policy key, for the quotas whose body is an integer (0: unlimited)."""
NAMESPACE_RATES: dict[str, str] = {"publishRate": "publishMaxMessageRate", "dispatchRate": "topicDispatchRate"}
TOPIC_QUOTAS = ("maxProducers", "maxConsumers", "maxSubscriptionsPerTopic")
TOPIC_RATES = ("publishRate", "dispatchRate")
TOPIC_OFFLOAD = ("offloadPolicies",)
"""Pulsar's ``OffloadPolicies`` of a topic: its thresholds and deletion lag win over the namespace's."""
RATE_EXAMPLES = {
    "offloadPolicies": {"managedLedgerOffloadThresholdInBytes": 1073741824,
                        "managedLedgerOffloadThresholdInSeconds": -1,
                        "managedLedgerOffloadDeletionLagInMillis": 14400000},
    "publishRate": {"publishThrottlingRateInMsg": 1000, "publishThrottlingRateInByte": -1},
    "dispatchRate": {"dispatchThrottlingRateInMsg": 1000, "dispatchThrottlingRateInByte": -1,
                     "ratePeriodInSecond": 1, "relativeToPublishRate": False},
}

Getter = Callable[[Any], Any]
"""Reads the policy of a level's names (``tenant/namespace`` or a ``TopicName``)."""
Setter = Callable[[Any, Any], None]


def quotas_router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter()
    for path, key in {**NAMESPACE_QUOTAS, **NAMESPACE_RATES}.items():
        _namespace_routes(routes, service, authorizer, path, key)
    for key in (*TOPIC_QUOTAS, *TOPIC_RATES, *TOPIC_OFFLOAD):
        _topic_routes(routes, service, authorizer, key)
    return routes


def _body(name: str) -> Any:
    """The ``POST`` body of policy ``name``: an integer, or a rate object."""
    if name in RATE_EXAMPLES:
        return Annotated[dict[str, Any], Body(examples=[RATE_EXAMPLES[name]])]
    return Annotated[StrictInt, Body(description="0..2^31-1 (0: unlimited)")]


def _namespace_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer, name: str, key: str) -> None:
    path = "/namespaces/{tenant}/{namespace}/" + name
    body = _body(name)

    def read(tenant: str, namespace: str, caller: Caller) -> Any:
        authorizer.require_tenant_admin(caller, tenant)
        return service.namespaces.policies(namespace_name(tenant, namespace)).get(key)

    def post(tenant: str, namespace: str, value: Any, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), key, value)

    post.__annotations__["value"] = body  # the body's shape is the policy's

    def delete(tenant: str, namespace: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), key, None)

    _add(routes, path, "namespace", name, read, post, delete)


def _topic_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer, key: str) -> None:
    path = "/persistent/{tenant}/{namespace}/{topic}/" + key
    body = _body(key)

    def read(tenant: str, namespace: str, topic: str, caller: Caller) -> Any:
        authorizer.require_tenant_admin(caller, tenant)
        return service.namespaces.topic_policies(topic_name(tenant, namespace, topic)).get(key)

    def post(tenant: str, namespace: str, topic: str, value: Any, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_topic_policy(topic_name(tenant, namespace, topic), key, value)

    post.__annotations__["value"] = body

    def delete(tenant: str, namespace: str, topic: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_topic_policy(topic_name(tenant, namespace, topic), key, None)

    _add(routes, path, "topic", key, read, post, delete)


def _add(routes: APIRouter, path: str, level: str, name: str, read: Callable[..., Any], post: Callable[..., None],
         delete: Callable[..., None]) -> None:
    bound = f"Pulsar's {name[0].upper()}{name[1:]}" if name in RATE_EXAMPLES else "0..2^31-1, 0: unlimited"
    routes.add_api_route(path, read, methods=["GET"], summary=f"Get the {level}'s {name} (null: not set)")
    routes.add_api_route(path, post, methods=["POST"], status_code=204, summary=f"Set the {level}'s {name} ({bound})")
    routes.add_api_route(path, delete, methods=["DELETE"], status_code=204,
                         summary=f"Remove the {level}'s {name} (the next level's applies)")
