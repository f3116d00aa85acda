"""Admin v2 schemas: ``/admin/v2/schemas/{tenant}/{namespace}/{topic}/...`` and the
``schemaCompatibilityStrategy`` of a namespace and of a topic, in Pulsar's shapes, over the
broker's ``SchemaRegistry``.

Role: the same registry the binary protocol's producers and consumers go through, so a schema
uploaded here is the one a Pulsar client is checked against and vice versa. Shapes:
``GetSchemaResponse`` ``{"version", "type", "timestamp", "data", "properties"}`` (``data`` is the
definition as text), ``PostSchemaPayload`` ``{"type", "schema", "properties"}`` answered with
``{"version"}``, ``/compatibility`` answered with ``{"isCompatible", "schemaCompatibilityStrategy"}``.
A strategy is PUT as a bare JSON string (``"BACKWARD"``) and answered so: a namespace's GET says
UNDEFINED when it sets none, a topic's GET null (with ``applied=true``: the strategy in force,
topic's, else namespace's, else the broker's ``schemaCompatibilityStrategy``); DELETE removes a
topic's. ``isAllowAutoUpdateSchema`` and ``schemaValidationEnforced`` are POSTed as bare JSON
booleans; their GETs answer the namespace's value (the first, unset, the broker's setting; the
second with ``applied=true``, the one in force).

Authorization: reading a schema needs the right to produce or consume on the topic; uploading,
deleting and the namespace's strategy need its tenant's administration.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from api.admin_namespaces import namespace_name
from api.auth import Action, Authorizer, Caller, Principal
from broker import (
    SCHEMA_STRATEGIES,
    SCHEMA_TYPES,
    BrokerService,
    Forbidden,
    IncompatibleSchema,
    InvalidRequest,
    SchemaInfo,
    TopicName,
)

STRATEGY_KEY = "schema_compatibility_strategy"
TOPIC_STRATEGY_KEY = "schemaCompatibilityStrategy"
AUTO_UPDATE_KEY = "is_allow_auto_update_schema"
ENFORCED_KEY = "schema_validation_enforced"


class PostSchemaPayload(BaseModel):
    """Pulsar's ``PostSchemaPayload``."""

    model_config = ConfigDict(extra="forbid")
    type: StrictStr
    schema_: StrictStr = Field(alias="schema")
    properties: dict[str, str] = Field(default_factory=dict)

    def info(self) -> SchemaInfo:
        kind = self.type.upper()
        if kind not in SCHEMA_TYPES:
            raise InvalidRequest(f"unknown schema type {self.type!r}", field="type")
        return SchemaInfo(kind, self.schema_.encode(), dict(self.properties))


def _response(info: SchemaInfo, version: int) -> dict[str, Any]:
    return {"version": version, "type": info.type, "timestamp": info.timestamp_ms,
            "data": info.data.decode(errors="replace"), "properties": info.properties}


def schemas_router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter()
    base = "/schemas/{tenant}/{namespace}/{topic}"

    def topic_of(tenant: str, namespace: str, topic: str) -> TopicName:
        return TopicName.parse(f"persistent://{tenant}/{namespace}/{topic}")

    def may_read(caller: Principal, name: TopicName) -> None:
        try:
            authorizer.require(caller, Action.CONSUME, name)
        except Forbidden:
            authorizer.require(caller, Action.PRODUCE, name)

    @routes.get(base + "/schema", summary="The topic's latest schema")
    def latest(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        name = topic_of(tenant, namespace, topic)
        may_read(caller, name)
        return _response(*service.schemas.get(name))

    @routes.get(base + "/schema/{version}", summary="One version of the topic's schema")
    def one(tenant: str, namespace: str, topic: str, version: int, caller: Caller) -> dict[str, Any]:
        name = topic_of(tenant, namespace, topic)
        may_read(caller, name)
        return _response(*service.schemas.get(name, version))

    @routes.get(base + "/schemas", summary="Every version of the topic's schema")
    def every(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        name = topic_of(tenant, namespace, topic)
        may_read(caller, name)
        versions = service.schemas.versions(name)
        return {"getSchemaResponses": [_response(info, index) for index, info in enumerate(versions)]}

    @routes.post(base + "/schema", summary="Upload a schema (a new version when compatible)")
    def upload(tenant: str, namespace: str, topic: str, body: Annotated[PostSchemaPayload, Body()],
               caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        return {"version": service.schemas.admit(topic_of(tenant, namespace, topic), body.info())}

    @routes.delete(base + "/schema", summary="Delete every version of the topic's schema")
    def delete(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        name = topic_of(tenant, namespace, topic)
        count = len(service.schemas.versions(name))
        service.schemas.delete(name)
        return {"version": count}

    @routes.post(base + "/compatibility", summary="Whether a schema may follow the topic's")
    def compatibility(tenant: str, namespace: str, topic: str, body: Annotated[PostSchemaPayload, Body()],
                      caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        name = topic_of(tenant, namespace, topic)
        try:
            service.schemas.check_compatible(name, body.info())
            compatible = True
        except IncompatibleSchema:
            compatible = False
        return {"isCompatible": compatible, "schemaCompatibilityStrategy": service.schemas.strategy(name)}

    _namespace_strategy_routes(routes, service, authorizer)
    _topic_strategy_routes(routes, service, authorizer)
    _namespace_flag_routes(routes, service, authorizer)
    return routes


STRATEGY_BODY = Annotated[StrictStr, Body(examples=["FULL"], description=f"one of {', '.join(SCHEMA_STRATEGIES)}")]


def _namespace_strategy_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    path = "/namespaces/{tenant}/{namespace}/schemaCompatibilityStrategy"

    @routes.get(path, summary="The namespace's schema compatibility strategy (UNDEFINED: the broker's applies)")
    def get_strategy(tenant: str, namespace: str, caller: Caller) -> str:
        authorizer.require_tenant_admin(caller, tenant)
        return str(service.namespaces.policies(namespace_name(tenant, namespace)).get(STRATEGY_KEY) or "UNDEFINED")

    @routes.put(path, status_code=204, summary="Set the namespace's schema compatibility strategy")
    def set_strategy(tenant: str, namespace: str, body: STRATEGY_BODY, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), STRATEGY_KEY, body)


def _namespace_flag_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    base = "/namespaces/{tenant}/{namespace}/"

    @routes.get(base + "isAllowAutoUpdateSchema", summary="Whether producers may add schema versions")
    def get_auto_update(tenant: str, namespace: str, caller: Caller) -> bool:
        authorizer.require_tenant_admin(caller, tenant)
        return service.schemas.auto_update(namespace_name(tenant, namespace))

    @routes.post(base + "isAllowAutoUpdateSchema", status_code=204,
                 summary="Let producers add schema versions, or not (uploads always may)")
    def set_auto_update(tenant: str, namespace: str, body: Annotated[StrictBool, Body()], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), AUTO_UPDATE_KEY, body)

    @routes.get(base + "schemaValidationEnforced", summary="Whether producers without a schema are refused")
    def get_enforced(tenant: str, namespace: str, caller: Caller, applied: bool = False) -> bool:
        authorizer.require_tenant_admin(caller, tenant)
        name = namespace_name(tenant, namespace)
        if applied:
            return service.schemas.validation_enforced(name)
        return bool(service.namespaces.policies(name).get(ENFORCED_KEY))

    @routes.post(base + "schemaValidationEnforced", status_code=204,
                 summary="Refuse producers without a schema on topics with one, or not")
    def set_enforced(tenant: str, namespace: str, body: Annotated[StrictBool, Body()], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), ENFORCED_KEY, body)


def _topic_strategy_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    path = "/persistent/{tenant}/{namespace}/{topic}/schemaCompatibilityStrategy"

    def topic_of(tenant: str, namespace: str, topic: str) -> TopicName:
        return TopicName.parse(f"persistent://{tenant}/{namespace}/{topic}")

    @routes.get(path, summary="The topic's schema compatibility strategy (null: not set; applied: the one in force)")
    def get_topic_strategy(tenant: str, namespace: str, topic: str, caller: Caller,
                           applied: bool = False) -> str | None:
        authorizer.require_tenant_admin(caller, tenant)
        name = topic_of(tenant, namespace, topic)
        if applied:
            return service.schemas.strategy(name)
        value = service.namespaces.topic_policies(name).get(TOPIC_STRATEGY_KEY)
        return None if value is None else str(value)

    @routes.put(path, status_code=204, summary="Set the topic's schema compatibility strategy")
    def set_topic_strategy(tenant: str, namespace: str, topic: str, body: STRATEGY_BODY, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_topic_policy(topic_of(tenant, namespace, topic), TOPIC_STRATEGY_KEY, body)

    @routes.delete(path, status_code=204, summary="Remove the topic's schema compatibility strategy")
    def remove_topic_strategy(tenant: str, namespace: str, topic: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_topic_policy(topic_of(tenant, namespace, topic), TOPIC_STRATEGY_KEY, None)
