"""Admin v2, non-persistent topics: ``/admin/v2/non-persistent/{tenant}/{namespace}/...``.

Role: Pulsar's ``NonPersistentTopics`` resource over the live non-persistent topics
(``service.topics.non_persistent``, ``broker/non_persistent_topic.py``): list the namespace's
topics (the live ones, and the partitions of its partitioned ones), partitioned topics (create,
grow, read, delete: their partition count in the metadata store, as for persistent ones), a
topic's subscriptions and its statistics in Pulsar's ``NonPersistentTopicStats`` shape
(``msgDropRate`` per subscription and summed, ``publishers``, no backlog), summed over the live
partitions of a partitioned one (``partitioned-stats``).

Invariants: every route but the partitioned metadata checks that the caller administers the
tenant first (the metadata needs only produce or consume there, as the persistent one); a topic
with neither producer nor subscription does not exist (``NotFound``), and one that has them is
not deleted (``PreconditionFailed``, as Pulsar refuses a topic with connected clients).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import StrictInt

from api.admin_namespaces import namespace_name
from api.auth import Authorizer, Caller
from broker import BrokerService, NotFound, PreconditionFailed, TopicName

DOMAIN = "non-persistent"
_SUMMED = ("msgRateIn", "msgThroughputIn", "msgInCounter", "bytesInCounter", "msgRateOut", "msgOutCounter",
           "msgDropRate")


def non_persistent_name(tenant: str, namespace: str, topic: str) -> TopicName:
    return TopicName.of(tenant, namespace, topic, DOMAIN)


def non_persistent_router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(prefix=f"/{DOMAIN}")
    _topic_routes(routes, service, authorizer)
    _partitioned_routes(routes, service, authorizer)
    return routes


def _topic_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}", summary="List the namespace's live non-persistent topics")
    def list_topics(tenant: str, namespace: str, caller: Caller) -> list[str]:
        authorizer.require_tenant_admin(caller, tenant)
        name = namespace_name(tenant, namespace)
        service.namespaces.policies(name)  # NotFound for an unknown namespace
        names = set(service.topics.non_persistent.names(name))
        for partitioned in service.topics.partitioned_names(name, DOMAIN):
            names.update(p.full_name for p in service.topics.expand_partitions(TopicName.parse(partitioned)))
        return sorted(names)

    @routes.get("/{tenant}/{namespace}/{topic}/stats", summary="Statistics (Pulsar's NonPersistentTopicStats)")
    def stats(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        return service.topics.non_persistent.get(non_persistent_name(tenant, namespace, topic)).stats()

    @routes.get("/{tenant}/{namespace}/{topic}/partitioned-stats",
                summary="Statistics summed over a partitioned topic's live partitions (perPartition: each too)")
    def partitioned_stats(tenant: str, namespace: str, topic: str, caller: Caller,
                          perPartition: bool = True) -> dict[str, Any]:  # noqa: N803 - Pulsar's parameter
        authorizer.require_tenant_admin(caller, tenant)
        name = non_persistent_name(tenant, namespace, topic)
        count = service.admin.partitions(name)
        if count == 0:
            raise NotFound(f"partitioned topic {name} does not exist")
        parts = {p.full_name: t.stats() for p in service.topics.expand_partitions(name)
                 if (t := service.topics.non_persistent.live(p)) is not None}
        body: dict[str, Any] = {field: sum(part[field] for part in parts.values()) for field in _SUMMED}
        body["metadata"] = {"partitions": count}
        body["partitions"] = parts if perPartition else {}
        return body

    @routes.get("/{tenant}/{namespace}/{topic}/subscriptions", summary="List the topic's subscriptions")
    def list_subscriptions(tenant: str, namespace: str, topic: str, caller: Caller) -> list[str]:
        authorizer.require_tenant_admin(caller, tenant)
        topic_live = service.topics.non_persistent.get(non_persistent_name(tenant, namespace, topic))
        return sorted(s.name for s in topic_live.subscriptions())

    @routes.delete("/{tenant}/{namespace}/{topic}", status_code=204,
                   summary="Delete a topic (refused while it has producers or consumers)")
    def delete_topic(tenant: str, namespace: str, topic: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        name = non_persistent_name(tenant, namespace, topic)
        service.topics.non_persistent.get(name)  # NotFound when it is not live
        raise PreconditionFailed(f"topic {name} has connected producers or consumers")


def _partitioned_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}/partitioned", summary="List the namespace's partitioned topics")
    def list_partitioned(tenant: str, namespace: str, caller: Caller) -> list[str]:
        authorizer.require_tenant_admin(caller, tenant)
        name = namespace_name(tenant, namespace)
        service.namespaces.policies(name)
        return service.topics.partitioned_names(name, DOMAIN)

    @routes.put("/{tenant}/{namespace}/{topic}/partitions", status_code=204,
                summary="Create a partitioned topic (body: the number of partitions)")
    def create_partitioned(tenant: str, namespace: str, topic: str, partitions: Annotated[StrictInt, Body()],
                           caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.topics.create_partitioned(non_persistent_name(tenant, namespace, topic), partitions)

    @routes.post("/{tenant}/{namespace}/{topic}/partitions", status_code=204,
                 summary="Increase a partitioned topic's partitions (body: the new number)")
    def update_partitioned(tenant: str, namespace: str, topic: str, partitions: Annotated[StrictInt, Body()],
                           caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.topics.update_partitioned(non_persistent_name(tenant, namespace, topic), partitions)

    @routes.get("/{tenant}/{namespace}/{topic}/partitions",
                summary="Get the number of partitions (0 for a non-partitioned topic)")
    def get_partitions(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, int]:
        name = non_persistent_name(tenant, namespace, topic)
        authorizer.require_lookup(caller, name)
        return {"partitions": service.admin.partitions(name)}

    @routes.delete("/{tenant}/{namespace}/{topic}/partitions", status_code=204,
                   summary="Delete a partitioned topic")
    def delete_partitioned(tenant: str, namespace: str, topic: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.topics.delete_partitioned(non_persistent_name(tenant, namespace, topic))
