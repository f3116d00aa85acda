"""What each command a client may send needs: one table, every client command in it.

Role: the session (``session.py``) looks every command up in ``COMMANDS`` before its handler
runs, and refuses one the table does not serve (an ERROR when it carries a request id, else a
protocol violation): a new command cannot be served without a decision here, and the binary
command walk (``tests/integration/test_binary_authorization.py``) fails on a client command of
Pulsar's ``BaseCommand`` that the table does not name. What a command needs (``Needs``):

- ``TOPIC``: it names a topic; the role needs one of the rule's actions there, the permission
  its HTTP twin demands: LOOKUP, PARTITIONED_METADATA and GET_SCHEMA produce or consume (as
  ``/lookup/v2`` and ``GET /admin/v2/schemas``), PRODUCER and GET_OR_CREATE_SCHEMA produce,
  SUBSCRIBE consume;
- ``NAMESPACE``: it names a namespace (the topic lists): produce or consume there;
- ``PRODUCER``, ``CONSUMER``, ``WATCH``: it names something this connection opened, checked when
  it was opened (ids are per connection: nothing of another connection can be named). When the
  policies change every session checks again what it holds and closes what its role may no
  longer use (``PulsarSession.revalidate``); a request about a consumer (``recheck``) checks
  its consumer's topic again each time;
- ``CONNECTION``: the connection's own upkeep and credentials (CONNECT, AUTH_RESPONSE, PING, PONG);
- ``UNSUPPORTED``: transactions, refused to everyone.

Invariants: a name is checked before anything is looked up, so a forbidden topic and a missing
one (or a missing namespace or tenant) get the same answer, AuthorizationError, in the
command's own error form (``Rule.refuse``); with authentication off nothing is checked.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from api.auth import Action
from api.pulsar import commands
from api.pulsar.context import ConnectionContext
from api.pulsar.proto import pulsar_api_pb2 as pb
from broker import Forbidden, TopicName, check_namespace

T = pb.BaseCommand.Type
PRODUCE_OR_CONSUME = (Action.PRODUCE, Action.CONSUME)


class Needs(enum.Enum):
    TOPIC = "topic"
    NAMESPACE = "namespace"
    PRODUCER = "producer"
    CONSUMER = "consumer"
    WATCH = "watch"
    CONNECTION = "connection"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class Rule:
    needs: Needs
    body: str | None = None
    """The ``BaseCommand`` field holding the command (it must be present and complete)."""
    actions: tuple[Action, ...] = ()
    """Any one of them suffices, on the named topic or namespace (or the consumer's topic)."""
    name_field: str | None = None
    """The body's field naming the topic or namespace."""
    refuse: Callable[[int, BaseException], bytes] = commands.error
    """The command's answer to a refusal, from its request id."""
    off_loop: bool = False
    """Checked by the handler where it works (lookups, off the event loop in a cluster)."""
    recheck: bool = False
    """A request about a consumer: its topic is checked again each time."""


def _schema_refused(request_id: int, failure: BaseException) -> bytes:
    return commands.schema_response(request_id, None, None, failure)


def _topic(body: str, actions: tuple[Action, ...], **more: object) -> Rule:
    return Rule(Needs.TOPIC, body, actions, "topic", **more)  # type: ignore[arg-type]


def _consumer(body: str, *, recheck: bool = False) -> Rule:
    return Rule(Needs.CONSUMER, body, (Action.CONSUME,) if recheck else (), recheck=recheck)


COMMANDS: dict[int, Rule] = {
    T.CONNECT: Rule(Needs.CONNECTION),
    T.AUTH_RESPONSE: Rule(Needs.CONNECTION, "authResponse"),
    T.PING: Rule(Needs.CONNECTION),
    T.PONG: Rule(Needs.CONNECTION),
    T.LOOKUP: _topic("lookupTopic", PRODUCE_OR_CONSUME, refuse=commands.lookup_failed, off_loop=True),
    T.PARTITIONED_METADATA: _topic("partitionMetadata", PRODUCE_OR_CONSUME,
                                   refuse=commands.partitioned_metadata_failed, off_loop=True),
    T.PRODUCER: _topic("producer", (Action.PRODUCE,)),
    T.SUBSCRIBE: _topic("subscribe", (Action.CONSUME,)),
    T.GET_SCHEMA: _topic("getSchema", PRODUCE_OR_CONSUME, refuse=_schema_refused),
    T.GET_OR_CREATE_SCHEMA: _topic("getOrCreateSchema", (Action.PRODUCE,),
                                   refuse=lambda r, f: commands.get_or_create_schema_response(r, None, f)),
    T.GET_TOPICS_OF_NAMESPACE: Rule(Needs.NAMESPACE, "getTopicsOfNamespace", PRODUCE_OR_CONSUME, "namespace"),
    T.WATCH_TOPIC_LIST: Rule(Needs.NAMESPACE, "watchTopicList", PRODUCE_OR_CONSUME, "namespace"),
    T.SEND: Rule(Needs.PRODUCER, "send"),
    T.CLOSE_PRODUCER: Rule(Needs.PRODUCER, "close_producer"),
    T.FLOW: _consumer("flow"),
    T.ACK: _consumer("ack"),
    T.CLOSE_CONSUMER: _consumer("close_consumer"),
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: _consumer("redeliverUnacknowledgedMessages", recheck=True),
    T.SEEK: _consumer("seek", recheck=True),
    T.GET_LAST_MESSAGE_ID: _consumer("getLastMessageId", recheck=True),
    T.UNSUBSCRIBE: _consumer("unsubscribe", recheck=True),
    T.CONSUMER_STATS: _consumer("consumerStats", recheck=True),
    T.WATCH_TOPIC_LIST_CLOSE: Rule(Needs.WATCH, "watchTopicListClose"),
    **{kind: Rule(Needs.UNSUPPORTED) for kind in (
        T.NEW_TXN, T.ADD_PARTITION_TO_TXN, T.ADD_SUBSCRIPTION_TO_TXN, T.END_TXN, T.END_TXN_ON_PARTITION,
        T.END_TXN_ON_SUBSCRIPTION, T.TC_CLIENT_CONNECT_REQUEST)},
}
"""Every command a client may send (the rest are ``session.BROKER_ONLY``) and what it needs."""


def require(context: ConnectionContext, actions: tuple[Action, ...], name: str, needs: Needs) -> None:
    """``Forbidden`` unless the connection's role may do one of ``actions`` on the topic or
    namespace ``name`` (``InvalidTopicName``/``InvalidRequest`` for a malformed name); nothing is
    looked up but the grants, so a missing name is refused as a forbidden one is."""
    authorizer = context.authorizer
    namespace = TopicName.parse(name).namespace_name if needs is Needs.TOPIC else "/".join(check_namespace(name))
    if not authorizer.enabled:
        return
    principal = context.principal
    assert principal is not None
    if not any(authorizer.allowed(principal, action, namespace) for action in actions):
        raise Forbidden(f"role {principal.role!r} may not {' or '.join(a.value for a in actions)} on {name}")


def require_for(context: ConnectionContext, kind: int, name: str) -> None:
    """:func:`require` with the actions ``COMMANDS`` names for command ``kind``."""
    rule = COMMANDS[kind]
    require(context, rule.actions, name, rule.needs)
