"""One binary-protocol connection's state machine: handshake, then commands onto the broker.

Role: the server's asyncio adapter (``server.py``) feeds this session the frames its decoder
cut (``framing.py``); the session answers through ``Outbound``. States:

    AWAITING_CONNECT --CONNECT (credentials checked when authentication is on)--> CONNECTED
    any state --protocol violation, failed authentication, peer gone--> CLOSED

Credentials expire: a CONNECTED session whose token's ``exp`` passed is challenged
(AUTH_CHALLENGE) when the client said it can refresh, and closed otherwise or when no valid
token of the same role answers (``check_credentials``), as Pulsar's broker does.

Before CONNECTED only CONNECT (and PING/PONG) is allowed; a second CONNECT, a command of an
unknown kind, a SEND for a producer this connection did not open or without its payload are
protocol violations: :class:`ProtocolViolation` propagates and the adapter closes the
connection. Requests the broker refuses are answered with the command's error form (ERROR,
SEND_ERROR, a failed lookup) and the connection goes on. The producer and consumer halves
(``producers.py``, ``consumers.py``), the lookups (``lookups.py``) and the topic lists
(``topic_lists.py``) hold the per-command logic. When topics stop being served here (their
bundle moved to another broker), ``topics_unloaded`` closes their producers and consumers with
CLOSE_PRODUCER and CLOSE_CONSUMER: the client looks them up again and reaches the new owner.

Authorization: every command is looked up in ``permissions.COMMANDS`` before its handler runs
(a command not there is refused) and checked against what it needs there, every time: a
command naming a topic or namespace needs its HTTP twin's permission, refused before anything
is looked up, so a missing name answers as a forbidden one. When the policies change,
``revalidate`` closes what the role may no longer hold (CLOSE_PRODUCER, its later sends refused;
CLOSE_CONSUMER; topic-list watches). A role holds at most its share of the server's connections
(``shares.py``): a CONNECT beyond it is answered TooManyRequests.

Protocol version: the server speaks up to ``PROTOCOL_VERSION_MAX`` and answers CONNECT with
the lower of that and the client's, as Pulsar's broker does.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from api.auth import Action
from api.authentication import TOKEN_METHOD
from api.limits import SEND_GROUP_COMMANDS_MAX
from api.pulsar import commands
from api.pulsar.consumers import ConsumerHalf
from api.pulsar.context import ConnectionContext
from api.pulsar.framing import Frame, ProtocolViolation
from api.pulsar.hot_commands import SEND, FlowCommand, SendCommand
from api.pulsar.lookups import LookupAnswer, LookupRunner, Lookups
from api.pulsar.permissions import COMMANDS, Needs, Rule, require
from api.pulsar.producers import ProducerHalf
from api.pulsar.proto import pulsar_api_pb2 as pb
from api.pulsar.schemas import ProtocolSchemas
from api.pulsar.topic_lists import TopicLists
from broker import Forbidden, MagnetarError, NotAllowed, ProducerAccess, TopicName, Unauthorized

log = logging.getLogger(__name__)

T = pb.BaseCommand.Type
PROTOCOL_VERSION_MAX = 19
SERVER_VERSION = "Magnetar 0.1.0"
NO_REQUEST_ID = (1 << 64) - 1
"""The request id of an ERROR that answers no request (a refused CONNECT): Java's -1."""


BROKER_ONLY = frozenset({
    T.CONNECTED, T.SEND_RECEIPT, T.SEND_ERROR, T.MESSAGE, T.SUCCESS, T.ERROR, T.PRODUCER_SUCCESS,
    T.PARTITIONED_METADATA_RESPONSE, T.LOOKUP_RESPONSE, T.CONSUMER_STATS_RESPONSE, T.REACHED_END_OF_TOPIC,
    T.GET_LAST_MESSAGE_ID_RESPONSE, T.ACTIVE_CONSUMER_CHANGE, T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
    T.GET_SCHEMA_RESPONSE, T.AUTH_CHALLENGE, T.ACK_RESPONSE, T.GET_OR_CREATE_SCHEMA_RESPONSE,
    T.WATCH_TOPIC_LIST_SUCCESS, T.WATCH_TOPIC_UPDATE, T.TOPIC_MIGRATED, T.NEW_TXN_RESPONSE,
    T.ADD_PARTITION_TO_TXN_RESPONSE, T.ADD_SUBSCRIPTION_TO_TXN_RESPONSE, T.END_TXN_RESPONSE,
    T.END_TXN_ON_PARTITION_RESPONSE, T.END_TXN_ON_SUBSCRIPTION_RESPONSE, T.TC_CLIENT_CONNECT_RESPONSE})
"""Commands only a broker sends: from a client they are protocol violations. Every other
command is in ``permissions.COMMANDS``."""


Verdicts = dict[tuple[str, Action, str], bool]
"""(role, action, namespace) → allowed, as found after one change of the policies."""


class State(enum.Enum):
    AWAITING_CONNECT = "awaiting_connect"
    CONNECTED = "connected"
    CLOSED = "closed"


class PulsarSession:
    def __init__(self, context: ConnectionContext, lookups: LookupRunner,
                 lookup_answer: Callable[[TopicName, str], LookupAnswer], access: ProducerAccess,
                 schemas: ProtocolSchemas) -> None:
        self.context = context
        self.state = State.AWAITING_CONNECT
        self.protocol_version = 0
        self.client_version = ""
        self.supports_auth_refresh = False
        self._challenged_at_s: float | None = None
        """When an AUTH_CHALLENGE asked for fresh credentials that have not come yet."""
        self._connection_share: str | None = None
        """The role whose share of the connections this one holds."""
        self.producers = ProducerHalf(context, access, schemas)
        self.consumers = ConsumerHalf(context, schemas)
        self.topic_lists = TopicLists(context)
        self.lookups = Lookups(context, lookups, lookup_answer)
        self._schemas = schemas
        self.last_frame_s = time.monotonic()
        self._handlers: dict[int, Callable[[pb.BaseCommand, Frame], None]] = {
            T.PING: lambda c, f: context.out.write([commands.pong()]),
            T.PONG: lambda c, f: None,
            T.PARTITIONED_METADATA: lambda c, f: self.lookups.partitioned_metadata(c.partitionMetadata),
            T.LOOKUP: lambda c, f: self.lookups.lookup(c.lookupTopic),
            T.PRODUCER: lambda c, f: self.producers.open(c.producer),
            T.SEND: lambda c, f: self.producers.send_group([f]),
            T.CLOSE_PRODUCER: lambda c, f: self.producers.close(c.close_producer),
            T.SUBSCRIBE: lambda c, f: self.consumers.subscribe(c.subscribe),
            T.FLOW: lambda c, f: self.consumers.flow(c.flow),
            T.ACK: lambda c, f: self.consumers.ack(c.ack),
            T.REDELIVER_UNACKNOWLEDGED_MESSAGES: lambda c, f: self.consumers.redeliver(
                c.redeliverUnacknowledgedMessages),
            T.SEEK: lambda c, f: self.consumers.seek(c.seek),
            T.GET_LAST_MESSAGE_ID: lambda c, f: self.consumers.last_message_id(c.getLastMessageId),
            T.UNSUBSCRIBE: lambda c, f: self.consumers.unsubscribe(c.unsubscribe),
            T.CLOSE_CONSUMER: lambda c, f: self.consumers.close(c.close_consumer),
            T.CONSUMER_STATS: lambda c, f: self.consumers.stats(c.consumerStats),
            T.GET_TOPICS_OF_NAMESPACE: lambda c, f: self.topic_lists.get(c.getTopicsOfNamespace),
            T.WATCH_TOPIC_LIST: lambda c, f: self.topic_lists.watch(c.watchTopicList),
            T.WATCH_TOPIC_LIST_CLOSE: lambda c, f: self.topic_lists.close(c.watchTopicListClose),
            T.GET_SCHEMA: lambda c, f: self._get_schema(c.getSchema),
            T.GET_OR_CREATE_SCHEMA: lambda c, f: self._get_or_create_schema(c.getOrCreateSchema),
            T.AUTH_RESPONSE: lambda c, f: self._auth_response(c.authResponse),
        }

    # --- the state machine ---------------------------------------------------------------
    def handle_all(self, frames: Sequence[Frame]) -> None:
        """Apply the frames of one read, in order; consecutive SENDs (at most ``SEND_GROUP_COMMANDS_MAX``)
        go to the producers as one group. ``ProtocolViolation`` as :meth:`handle`, after the
        SENDs before the offending frame were taken."""
        run: list[Frame] = []
        try:
            for frame in frames:
                if frame.kind == SEND and self.state is State.CONNECTED:
                    if frame.hot is None:
                        _require_body(frame.command, COMMANDS[SEND])
                    run.append(frame)
                    if len(run) >= SEND_GROUP_COMMANDS_MAX:
                        group, run = run, []
                        self._send_group(group)
                    continue
                if run:
                    group, run = run, []
                    self._send_group(group)
                self.handle(frame)
        finally:
            if run:
                self._send_group(run)

    def _send_group(self, frames: list[Frame]) -> None:
        self.last_frame_s = time.monotonic()
        self.producers.send_group(frames)

    def handle(self, frame: Frame) -> None:
        """Apply one frame; ``ProtocolViolation`` when the connection must be closed."""
        self.last_frame_s = time.monotonic()
        if self.state is State.CLOSED:
            return
        hot = frame.hot
        if hot is not None:  # SEND, FLOW, ACK read by hand, with every required field
            if self.state is not State.CONNECTED:
                raise ProtocolViolation(f"{T.Name(frame.kind)} before CONNECT")
            if isinstance(hot, SendCommand):
                self.producers.send_group([frame])
            elif isinstance(hot, FlowCommand):
                self.consumers.flow(hot)
            else:
                self.consumers.ack(hot)
            return
        command = frame.command
        if command.type == T.CONNECT:
            if self.state is not State.AWAITING_CONNECT:
                raise ProtocolViolation("CONNECT on a connected connection")
            self._connect(command.connect)
            return
        if self.state is State.AWAITING_CONNECT and command.type not in (T.PING, T.PONG):
            raise ProtocolViolation(f"{T.Name(command.type)} before CONNECT")
        rule = COMMANDS.get(command.type)
        handler = self._handlers.get(command.type)
        if rule is None or handler is None:
            self._refuse(command)
            return
        _require_body(command, rule)
        if self._permitted(command, rule):
            handler(command, frame)

    def _permitted(self, command: pb.BaseCommand, rule: Rule) -> bool:
        """Whether the connection's role may run ``command`` now (``permissions.py``); a refusal
        is answered in the command's own form. A request about a consumer whose topic the role
        may no longer read first closes what the connection may no longer hold."""
        if not self.context.authorizer.enabled or rule.off_loop or not rule.actions:
            return True
        body = getattr(command, rule.body or "")
        try:
            if rule.name_field is not None:
                require(self.context, rule.actions, getattr(body, rule.name_field), rule.needs)
            else:
                topic = self.consumers.topic_of(body.consumer_id)
                if topic is not None:
                    require(self.context, rule.actions, topic.full_name, Needs.TOPIC)
        except MagnetarError as exc:
            if isinstance(exc, Forbidden) and rule.needs is Needs.CONSUMER:
                self.revalidate()
            request_id = _request_id_in(body)
            if request_id is not None:
                self.context.out.write([rule.refuse(request_id, exc)])
            return False
        return True

    def _refuse(self, command: pb.BaseCommand) -> None:
        """A command Magnetar does not serve (transactions): an ERROR when
        it carries a request id the client waits on, else a protocol violation (so is a command
        only a broker sends)."""
        request_id = None if command.type in BROKER_ONLY else _request_id_of(command)
        if request_id is None:
            raise ProtocolViolation(f"{T.Name(command.type)} is not supported")
        self.context.out.write([commands.error(request_id, NotAllowed(f"{T.Name(command.type)} is not supported"))])

    def _connect(self, connect: pb.CommandConnect) -> None:
        if not connect.HasField("client_version"):
            raise ProtocolViolation("CONNECT without a client version")
        self.client_version = connect.client_version
        self.protocol_version = min(connect.protocol_version, PROTOCOL_VERSION_MAX)
        self.supports_auth_refresh = connect.feature_flags.supports_auth_refresh
        context = self.context
        if context.authorizer.enabled:
            try:
                context.principal = self._authenticate(connect.auth_method_name, connect.auth_data)
            except (Unauthorized, Forbidden) as exc:
                context.count("authentication_failures")
                context.out.write([commands.error_of(NO_REQUEST_ID, pb.AuthenticationError, str(exc))])
                self.state = State.CLOSED
                context.out.close()
                return
            if not self._take_connection_share():
                return
        self.state = State.CONNECTED
        context.out.write([commands.connected(SERVER_VERSION, self.protocol_version,
                                              context.settings.max_message_size_bytes)])

    def _take_connection_share(self) -> bool:
        """The role's share of the connections (``shares.py``): beyond it the CONNECT is answered
        TooManyRequests and the connection closed."""
        context = self.context
        role = context.counted_role
        if role is None:
            return True
        try:
            context.pools.connections.take(role)
        except MagnetarError as exc:
            context.out.write([commands.error(NO_REQUEST_ID, exc)])
            self.state = State.CLOSED
            context.out.close()
            return False
        self._connection_share = role
        return True

    def _authenticate(self, method: str, data: bytes) -> Any:
        """The provider of ``method`` decides, from ``data`` and the connection's client certificate."""
        return self.context.authorizer.authenticate_command(method, data, self.context.tls_peer)

    def _auth_response(self, response: pb.CommandAuthResponse) -> None:
        """A client refreshing its credentials: the new token must be valid and name the same
        role (else the connection ends, as Pulsar's broker ends it)."""
        if not self.context.authorizer.enabled:
            return
        try:
            principal = self._authenticate(response.response.auth_method_name, response.response.auth_data)
        except Unauthorized as exc:
            raise ProtocolViolation(f"refreshed credentials refused: {exc}") from None
        previous = self.context.principal
        if previous is not None and principal.role != previous.role:
            raise ProtocolViolation(f"refreshed credentials name role {principal.role!r}, not {previous.role!r}")
        self.context.principal = principal
        self._challenged_at_s = None

    def check_credentials(self, now_s: float) -> None:
        """Pulsar's authentication refresh, run every ``auth_refresh_check_s``: once the token
        expired, a client that can refresh is sent AUTH_CHALLENGE and must answer with a valid
        token of the same role before the next check; any other client is disconnected
        (``ProtocolViolation``). ``now_s`` is wall-clock time, as the token's ``exp``."""
        principal = self.context.principal
        if self.state is not State.CONNECTED or principal is None or principal.expires_at_s is None \
                or now_s < principal.expires_at_s:
            return
        if not self.supports_auth_refresh:
            raise ProtocolViolation("the token expired and the client cannot refresh it")
        if self._challenged_at_s is not None:
            if now_s - self._challenged_at_s >= self.context.settings.auth_refresh_check_s:
                raise ProtocolViolation("the token expired and no fresh one came after the challenge")
            return
        self._challenged_at_s = now_s
        self.context.out.write([commands.auth_challenge(SERVER_VERSION, self.protocol_version, TOKEN_METHOD)])

    # --- schemas -------------------------------------------------------------------------
    def _get_schema(self, request: pb.CommandGetSchema) -> None:
        try:
            schema, version = self._schemas.get(TopicName.parse(request.topic), request.schema_version or None)
        except MagnetarError as exc:
            self.context.out.write([commands.schema_response(request.request_id, None, None, exc)])
            return
        self.context.out.write([commands.schema_response(request.request_id, schema, version)])

    def _get_or_create_schema(self, request: pb.CommandGetOrCreateSchema) -> None:
        try:
            version = self._schemas.for_producer(TopicName.parse(request.topic), request.schema)
        except MagnetarError as exc:
            self.context.out.write([commands.get_or_create_schema_response(request.request_id, None, exc)])
            return
        self.context.out.write([commands.get_or_create_schema_response(request.request_id, version)])

    # --- the end -------------------------------------------------------------------------
    def writable_again(self) -> None:
        self.consumers.deliver_all()

    def topics_unloaded(self, names: set[TopicName]) -> None:
        """These topics are no longer served by this broker: close their producers (after the
        receipts of the sends already stored) and consumers, telling the client, as Pulsar's
        broker does on an unload. The broker already closed its consumers of them; this sends
        CLOSE_CONSUMER at once rather than at their next delivery."""
        if self.state is not State.CONNECTED:
            return
        self.producers.unloaded(names)
        self.consumers.unloaded(names)

    def revalidate(self, verdicts: Verdicts | None = None) -> None:
        """The policies changed: close what this connection holds and its role may no longer
        use, as the WebSocket sessions are closed (``api/sessions.py``). Producers get
        CLOSE_PRODUCER once their stored sends are answered and their later sends are refused;
        consumers get CLOSE_CONSUMER (what they held unacknowledged goes to the others); a
        topic-list watch ends (no more updates; Pulsar has no command to tell the client).
        ``verdicts`` remembers each (role, action, namespace) answer for the other sessions
        checked after the same change."""
        context = self.context
        principal = context.principal
        if self.state is not State.CONNECTED or not context.authorizer.enabled or principal is None:
            return
        known: Verdicts = {} if verdicts is None else verdicts

        def may(action: Action, namespace: str) -> bool:
            key = (principal.role, action, namespace)
            verdict = known.get(key)
            if verdict is None:
                verdict = known[key] = context.authorizer.allowed(principal, action, namespace)
            return verdict

        producing = {t for t in self.producers.topics() if not may(Action.PRODUCE, t.namespace_name)}
        if producing:
            self.producers.revoked(producing, Forbidden(f"role {principal.role!r} may no longer produce there"))
        consuming = {t for t in self.consumers.topics() if not may(Action.CONSUME, t.namespace_name)}
        if consuming:
            self.consumers.revoked(consuming)
        listing = {n for n in self.topic_lists.namespaces()
                   if not (may(Action.PRODUCE, n) or may(Action.CONSUME, n))}
        if listing:
            self.topic_lists.revoked(listing)
        if producing or consuming or listing:
            log.info("role %r lost permissions: closed its producers on %d topics, consumers on %d, watches of "
                     "%d namespaces", principal.role, len(producing), len(consuming), len(listing))

    def connection_lost(self) -> None:
        self.state = State.CLOSED
        if self._connection_share is not None:
            self.context.pools.connections.give_back(self._connection_share)
            self._connection_share = None
        self.producers.close_all()
        self.consumers.close_all()
        self.topic_lists.close_all()


def _require_body(command: pb.BaseCommand, rule: Rule) -> None:
    """The command's body must be present and complete (required fields set)."""
    field = rule.body
    if field is None:
        return
    if not command.HasField(field):
        raise ProtocolViolation(f"{T.Name(command.type)} without its body")
    body = getattr(command, field)
    if not body.IsInitialized():
        raise ProtocolViolation(f"{T.Name(command.type)} lacks {', '.join(body.FindInitializationErrors())}")


def _request_id_in(body: Any) -> int | None:
    """The request id of a command's body, None when it has none."""
    if "request_id" in body.DESCRIPTOR.fields_by_name and body.HasField("request_id"):
        return int(body.request_id)
    return None


def _request_id_of(command: pb.BaseCommand) -> int | None:
    for descriptor, value in command.ListFields():
        if descriptor.name != "type" and hasattr(value, "request_id") and value.HasField("request_id"):
            return int(value.request_id)
    return None
