"""``magnetar admin``: Pulsar's ``pulsar-admin`` commands for tenants, namespaces (policies,
bundles, persistence), topics, brokers and schemas.

Role: each command is one (or, for ``peek-messages``, a few) calls to the admin v2 REST paths
Pulsar documents (``/admin/v2/tenants``, ``/admin/v2/namespaces/{tenant}/{namespace}``,
``/admin/v2/persistent/{tenant}/{namespace}/{topic}/...``), made with ``consumers.client`` over
the network. A JSON answer is printed as indented JSON; an empty answer prints nothing; a broker
error prints ``code: message`` on stderr and exits 1.

Invariants: arguments are checked before any request (a bad duration, message id or namespace
exits 2 without a call); every request carries the ``--token``.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import httpx

from consumers.cli.options import client_of, positive
from consumers.client import HttpError, HttpRequest, MessageIdParts, Topic

PEEK_MESSAGES_MAX = 1000
OFFLOAD_STATUS_POLL_S = 0.5
"""How often ``offload-status --wait-complete`` asks again."""
LATEST_ID = (1 << 63) - 1
_TIME_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800, "y": 31_536_000}
_SIZE_UNITS_MB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


Call = HttpRequest
"""An admin command's one HTTP call, as the client's calls make theirs."""

Build = Callable[[argparse.Namespace], Call]


# --- argument helpers --------------------------------------------------------------------------
def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def namespace_path(text: str) -> str:
    parts = text.strip().split("/")
    if len(parts) != 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"namespace {text!r} must look like tenant/namespace")
    return "/".join(_quote(p) for p in parts)


def topic_path(text: str) -> str:
    """``persistent/{tenant}/{namespace}/{topic}`` of a topic argument."""
    try:
        return Topic.parse(text).path
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration_s(text: str) -> int:
    """``90``, ``30s``, ``10m``, ``3h``, ``2d``, ``5w``, ``1y`` as seconds (a bare number is seconds)."""
    value = text.strip().lower()
    unit = value[-1] if value and value[-1] in _TIME_UNITS_S else "s"
    number = value[:-1] if value and value[-1] in _TIME_UNITS_S else value
    if not number.isdigit():
        raise argparse.ArgumentTypeError(f"duration {text!r} must look like 30s, 10m, 3h, 2d, 5w or 1y")
    return int(number) * _TIME_UNITS_S[unit]


def retention_minutes(text: str) -> int:
    """Pulsar's ``--time``: -1 (forever), or a duration whose bare number means minutes."""
    if text.strip() == "-1":
        return -1
    return duration_s(text if not text.strip().isdigit() else f"{text.strip()}m") // 60


def retention_mb(text: str) -> int:
    """Pulsar's ``--size``: -1 (unlimited), or ``500M``, ``10G``, ``1T`` (a bare number means MB)."""
    value = text.strip().lower()
    if value == "-1":
        return -1
    unit = value[-1] if value and value[-1] in _SIZE_UNITS_MB else "m"
    number = value[:-1] if value and value[-1] in _SIZE_UNITS_MB else value
    if not number.isdigit():
        raise argparse.ArgumentTypeError(f"size {text!r} must look like 500M, 10G or 1T (or -1)")
    return int(int(number) * _SIZE_UNITS_MB[unit])


def size_bytes(text: str) -> int:
    """pulsar-admin's sizes: ``-1``, a bare number of bytes, or ``10K``, ``500M``, ``10G``, ``1T``."""
    value = text.strip().lower()
    if value == "-1":
        return -1
    unit = value[-1] if value and value[-1] in _SIZE_UNITS_MB else ""
    number = value[:-1] if unit else value
    if not number.isdigit():
        raise argparse.ArgumentTypeError(f"size {text!r} must look like 4096, 10K, 500M, 10G or 1T (or -1)")
    return int(number) * (int(_SIZE_UNITS_MB[unit] * 1024 * 1024) if unit else 1)


def duration_ms(text: str) -> int:
    """A duration (as ``duration_s``) in milliseconds."""
    return duration_s(text) * 1000


def message_id_body(text: str) -> dict[str, int]:
    """Pulsar's admin ``MessageId`` JSON from ``ledger:entry[:partition[:batch]]`` or base64."""
    try:
        parts = MessageIdParts.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return {"ledgerId": parts.ledger_id, "entryId": parts.entry_id, "partitionIndex": parts.partition,
            "batchIndex": parts.batch_index}


# --- running ------------------------------------------------------------------------------------
def print_response(response: httpx.Response) -> None:
    if not response.content:
        return
    if response.headers.get("content-type", "").startswith("application/json"):
        print(json.dumps(response.json(), indent=2, sort_keys=True))
    else:
        print(response.text)


def _runner(build: Build) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        call = build(args)
        with client_of(args) as client:
            print_response(client.request(call.method, call.path, json_body=call.json_body, params=call.params))
        return 0
    return run


class _Group:
    """One ``admin <group>`` with its leaf commands."""

    def __init__(self, admin: Any, name: str, help_text: str, connection: argparse.ArgumentParser) -> None:
        self._actions = admin.add_parser(name, help=help_text).add_subparsers(dest="admin_command", required=True)
        self._connection = connection

    def command(self, name: str, help_text: str, build: Build | None = None) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = self._actions.add_parser(name, help=help_text, parents=[self._connection])
        if build is not None:
            parser.set_defaults(handler=_runner(build))
        return parser


def add_admin_commands(commands: Any, connection: argparse.ArgumentParser) -> None:
    admin = commands.add_parser("admin", help="administer tenants, namespaces, topics, brokers and schemas "
                                              "(like pulsar-admin)")
    groups = admin.add_subparsers(dest="admin_group", required=True)
    _add_tenants(_Group(groups, "tenants", "tenants", connection))
    _add_namespaces(_Group(groups, "namespaces", "namespaces and their policies", connection))
    topics = _Group(groups, "topics", "topics, partitioned topics and subscriptions", connection)
    _add_topics(topics)
    _add_subscriptions(topics)
    _add_topic_lifecycle(topics)
    _add_brokers(_Group(groups, "brokers", "the cluster's live brokers", connection))
    _Group(groups, "bookies", "the cluster's bookies", connection).command(
        "list-bookies", "the bookies brokers write to (standalone: its embedded one)",
        lambda a: Call("GET", "/admin/v2/bookies/all"))
    _add_schemas(_Group(groups, "schemas", "a topic's schema versions", connection))


# --- tenants --------------------------------------------------------------------------------------
def _add_tenants(group: _Group) -> None:
    group.command("list", "list tenants", lambda a: Call("GET", "/admin/v2/tenants"))
    group.command("get", "a tenant's admin roles and allowed clusters",
                  lambda a: Call("GET", f"/admin/v2/tenants/{_quote(a.tenant)}")).add_argument("tenant")

    def tenant_info(args: argparse.Namespace) -> dict[str, Any]:
        info: dict[str, Any] = {"adminRoles": [r for r in (args.admin_roles or "").split(",") if r]}
        if args.allowed_clusters:
            info["allowedClusters"] = [c for c in args.allowed_clusters.split(",") if c]
        return info

    create = group.command("create", "create a tenant",
                           lambda a: Call("PUT", f"/admin/v2/tenants/{_quote(a.tenant)}", tenant_info(a)))
    create.add_argument("tenant")
    create.add_argument("-r", "--admin-roles", help="comma-separated admin roles")
    create.add_argument("-c", "--allowed-clusters", help="comma-separated clusters (default: standalone)")
    group.command("delete", "delete a tenant without namespaces",
                  lambda a: Call("DELETE", f"/admin/v2/tenants/{_quote(a.tenant)}")).add_argument("tenant")


# --- namespaces -----------------------------------------------------------------------------------
def _namespace_call(method: str) -> Build:
    return lambda args: Call(method, f"/admin/v2/namespaces/{args.namespace}")


def _add_namespaces(group: _Group) -> None:
    base = "/admin/v2/namespaces"
    group.command("list", "list a tenant's namespaces",
                  lambda a: Call("GET", f"{base}/{_quote(a.tenant)}")).add_argument("tenant")
    for name, method, help_text in (("create", "PUT", "create a namespace"),
                                    ("delete", "DELETE", "delete a namespace without topics"),
                                    ("policies", "GET", "a namespace's policies")):
        group.command(name, help_text, _namespace_call(method)).add_argument("namespace", type=namespace_path)
    retention = group.command("set-retention", "keep consumed messages for a time and/or size", lambda a: Call(
        "POST", f"{base}/{a.namespace}/retention",
        {"retentionTimeInMinutes": a.time, "retentionSizeInMB": a.size}))
    retention.add_argument("namespace", type=namespace_path)
    retention.add_argument("--time", type=retention_minutes, required=True, help="e.g. 100m, 3h, 2d, 5w or -1")
    retention.add_argument("--size", type=retention_mb, required=True, help="e.g. 500M, 10G or -1")
    group.command("get-retention", "the retention policy",
                  lambda a: Call("GET", f"{base}/{a.namespace}/retention")).add_argument("namespace",
                                                                                       type=namespace_path)
    _add_ttl_and_dedup(group, base)
    _add_offload_policies(group, base)
    _add_quotas(group, base)
    _add_bundles(group, base)
    _add_persistence(group, base)
    grant = group.command("grant-permission", "grant a role produce and/or consume", lambda a: Call(
        "POST", f"{base}/{a.namespace}/permissions/{_quote(a.role)}", [x for x in a.actions.split(",") if x]))
    grant.add_argument("namespace", type=namespace_path)
    grant.add_argument("--role", required=True)
    grant.add_argument("--actions", required=True, help="comma-separated: produce,consume")
    revoke = group.command("revoke-permission", "revoke every action of a role",
                           lambda a: Call("DELETE", f"{base}/{a.namespace}/permissions/{_quote(a.role)}"))
    revoke.add_argument("namespace", type=namespace_path)
    revoke.add_argument("--role", required=True)
    group.command("permissions", "the roles' granted actions",
                  lambda a: Call("GET", f"{base}/{a.namespace}/permissions")).add_argument("namespace",
                                                                                          type=namespace_path)


def _add_ttl_and_dedup(group: _Group, base: str) -> None:
    """Pulsar's ``set-``, ``get-`` and ``remove-message-ttl`` and ``-deduplication``."""
    ttl = group.command("set-message-ttl", "expire unconsumed messages older than a time", lambda a: Call(
        "POST", f"{base}/{a.namespace}/messageTTL", a.message_ttl))
    ttl.add_argument("namespace", type=namespace_path)
    ttl.add_argument("-ttl", "--messageTTL", dest="message_ttl", type=duration_s, required=True,
                     help="seconds, or e.g. 30m, 3h, 2d (0: none)")
    _get_and_remove(group, base, "message-ttl", "messageTTL", "the message TTL in seconds (null: none)")
    dedup = group.command("set-deduplication", "turn producer deduplication on or off", lambda a: Call(
        "POST", f"{base}/{a.namespace}/deduplication", a.enable))
    dedup.add_argument("namespace", type=namespace_path)
    switch = dedup.add_mutually_exclusive_group(required=True)
    switch.add_argument("-e", "--enable", dest="enable", action="store_true", help="store a resent message once")
    switch.add_argument("-d", "--disable", dest="enable", action="store_false", help="store every message sent")
    _get_and_remove(group, base, "deduplication", "deduplication",
                    "whether deduplication is on (null: the broker's default)")
    encryption = group.command("set-encryption-required", "take only end-to-end encrypted messages, or any",
                               lambda a: Call("POST", f"{base}/{a.namespace}/encryptionRequired", a.enable))
    encryption.add_argument("namespace", type=namespace_path)
    required = encryption.add_mutually_exclusive_group(required=True)
    required.add_argument("-e", "--enable", dest="enable", action="store_true", help="refuse what is not encrypted")
    required.add_argument("-d", "--disable", dest="enable", action="store_false", help="take any message")
    group.command("get-encryption-required", "whether only encrypted messages are taken", lambda a: Call(
        "GET", f"{base}/{a.namespace}/encryptionRequired")).add_argument("namespace", type=namespace_path)


QUOTA_COMMANDS = (("max-producers-per-topic", "maxProducersPerTopic", "-p", "producers of one topic"),
                  ("max-consumers-per-topic", "maxConsumersPerTopic", "-c", "consumers of one topic"),
                  ("max-subscriptions-per-topic", "maxSubscriptionsPerTopic", "-s", "subscriptions of one topic"),
                  ("max-topics-per-namespace", "maxTopicsPerNamespace", "-t", "topics of the namespace"))
"""pulsar-admin's name, the admin v2 path, its short option and what the limit counts."""


def _add_quotas(group: _Group, base: str) -> None:
    """pulsar-admin's ``set-``, ``get-`` and ``remove-`` of the quotas and rate limits."""
    def setter(path: str) -> Build:
        return lambda a: Call("POST", f"{base}/{a.namespace}/{path}", a.limit)

    for name, path, short, what in QUOTA_COMMANDS:
        command = group.command(f"set-{name}", f"limit the {what} (0: unlimited)", setter(path))
        command.add_argument("namespace", type=namespace_path)
        command.add_argument(short, f"--{name}", dest="limit", type=int, required=True)
        _get_and_remove(group, base, name, path, f"the limit of {what} (null: the broker's default)")
    publish = group.command("set-publish-rate", "throttle publishing to each topic", lambda a: Call(
        "POST", f"{base}/{a.namespace}/publishRate",
        {"publishThrottlingRateInMsg": a.messages, "publishThrottlingRateInByte": a.bytes}))
    publish.add_argument("namespace", type=namespace_path)
    publish.add_argument("-m", "--msg-publish-rate", dest="messages", type=int, default=-1, help="-1: unlimited")
    publish.add_argument("-b", "--byte-publish-rate", dest="bytes", type=int, default=-1, help="-1: unlimited")
    _get_and_remove(group, base, "publish-rate", "publishRate", "the publish rate of each topic (null: none)")
    dispatch = group.command("set-dispatch-rate", "throttle dispatch from each topic", lambda a: Call(
        "POST", f"{base}/{a.namespace}/dispatchRate",
        {"dispatchThrottlingRateInMsg": a.messages, "dispatchThrottlingRateInByte": a.bytes,
         "ratePeriodInSecond": a.period, "relativeToPublishRate": a.relative}))
    dispatch.add_argument("namespace", type=namespace_path)
    dispatch.add_argument("-md", "--msg-dispatch-rate", dest="messages", type=int, default=-1, help="-1: unlimited")
    dispatch.add_argument("-bd", "--byte-dispatch-rate", dest="bytes", type=int, default=-1, help="-1: unlimited")
    dispatch.add_argument("-dt", "--dispatch-rate-period", dest="period", type=int, default=1, help="seconds")
    dispatch.add_argument("-rp", "--relative-to-publish-rate", dest="relative", action="store_true")
    _get_and_remove(group, base, "dispatch-rate", "dispatchRate", "the dispatch rate of each topic (null: none)")


def _add_offload_policies(group: _Group, base: str) -> None:
    """Pulsar's ``set-``/``get-offload-threshold`` and ``set-``/``get-``/``clear-offload-deletion-lag``."""
    threshold = group.command("set-offload-threshold", "offload closed ledgers once a topic holds more than this",
                              lambda a: Call("PUT", f"{base}/{a.namespace}/offloadThreshold", a.size))
    threshold.add_argument("namespace", type=namespace_path)
    threshold.add_argument("-s", "--size", type=size_bytes, required=True,
                           help="bytes kept on the bookies, e.g. 10M, 1G (0: offload at once, -1: never)")
    group.command("get-offload-threshold", "the offload threshold in bytes (null: the broker's)", lambda a: Call(
        "GET", f"{base}/{a.namespace}/offloadThreshold")).add_argument("namespace", type=namespace_path)
    lag = group.command("set-offload-deletion-lag", "delete the bookies' copy this long after an offload",
                        lambda a: Call("PUT", f"{base}/{a.namespace}/offloadDeletionLagMs", a.lag))
    lag.add_argument("namespace", type=namespace_path)
    lag.add_argument("-l", "--lag", type=duration_ms, required=True, help="e.g. 10m, 3h, 2d (0: at once)")
    group.command("get-offload-deletion-lag", "the deletion lag in ms (null: the broker's)", lambda a: Call(
        "GET", f"{base}/{a.namespace}/offloadDeletionLagMs")).add_argument("namespace", type=namespace_path)
    group.command("clear-offload-deletion-lag", "the broker's deletion lag applies again", lambda a: Call(
        "DELETE", f"{base}/{a.namespace}/offloadDeletionLagMs")).add_argument("namespace", type=namespace_path)


def _get_and_remove(group: _Group, base: str, policy: str, path: str, what: str) -> None:
    group.command(f"get-{policy}", what, lambda a: Call("GET", f"{base}/{a.namespace}/{path}")).add_argument(
        "namespace", type=namespace_path)
    group.command(f"remove-{policy}", f"remove the {policy} policy (back to the default)",
                  lambda a: Call("DELETE", f"{base}/{a.namespace}/{path}")).add_argument(
        "namespace", type=namespace_path)


def _add_bundles(group: _Group, base: str) -> None:
    """pulsar-admin's ``bundles``, ``unload`` (of one bundle) and ``split-bundle``."""
    group.command("bundles", "the namespace's bundle boundaries",
                  lambda a: Call("GET", f"{base}/{a.namespace}/bundles")).add_argument("namespace", type=namespace_path)
    group.command("bundle-owners", "each bundle and the broker that owns it (null: unowned)",
                  lambda a: Call("GET", f"{base}/{a.namespace}/bundles/owners")).add_argument(
        "namespace", type=namespace_path)
    unload = group.command("unload", "stop serving a bundle on its broker; its topics move", lambda a: Call(
        "PUT", f"{base}/{a.namespace}/{_quote(a.bundle)}/unload",
        params={"destinationBroker": a.destination_broker} if a.destination_broker else None))
    unload.add_argument("namespace", type=namespace_path)
    unload.add_argument("-b", "--bundle", required=True, help="e.g. 0x00000000_0xffffffff (see bundle-owners)")
    unload.add_argument("-d", "--destinationBroker", dest="destination_broker",
                        help="the broker (host:port of its web service) to take the bundle")
    split = group.command("split-bundle", "divide a bundle in two at the middle of its hash range", lambda a: Call(
        "PUT", f"{base}/{a.namespace}/{_quote(a.bundle)}/split"))
    split.add_argument("namespace", type=namespace_path)
    split.add_argument("-b", "--bundle", required=True, help="e.g. 0x00000000_0xffffffff")


def _add_persistence(group: _Group, base: str) -> None:
    """pulsar-admin's ``set-``, ``get-`` and ``remove-persistence``: the quorums of new ledgers."""
    persistence = group.command("set-persistence", "the ensemble and quorums of the namespace's new ledgers",
                                lambda a: Call("POST", f"{base}/{a.namespace}/persistence", {
                                    "bookkeeperEnsemble": a.ensemble, "bookkeeperWriteQuorum": a.write_quorum,
                                    "bookkeeperAckQuorum": a.ack_quorum,
                                    "managedLedgerMaxMarkDeleteRate": a.mark_delete_rate}))
    persistence.add_argument("namespace", type=namespace_path)
    persistence.add_argument("-e", "--bookkeeper-ensemble", dest="ensemble", type=int, required=True)
    persistence.add_argument("-w", "--bookkeeper-write-quorum", dest="write_quorum", type=int, required=True)
    persistence.add_argument("-a", "--bookkeeper-ack-quorum", dest="ack_quorum", type=int, required=True)
    persistence.add_argument("-r", "--ml-mark-delete-max-rate", dest="mark_delete_rate", type=float, default=0.0,
                             help="cursor position updates per second (0: no limit)")
    _get_and_remove(group, base, "persistence", "persistence", "the persistence policy (null: the broker's default)")


# --- brokers and schemas --------------------------------------------------------------------------
def _add_brokers(group: _Group) -> None:
    group.command("list", "the live brokers of a cluster (its web service host:port each)", lambda a: Call(
        "GET", f"/admin/v2/brokers/{_quote(a.cluster)}")).add_argument(
        "cluster", nargs="?", default="standalone", help="the cluster's name (default standalone)")


def schema_path(text: str) -> str:
    """``/admin/v2/schemas/{tenant}/{namespace}/{topic}`` of a topic argument."""
    try:
        topic = Topic.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return "/admin/v2/schemas/" + "/".join(_quote(p) for p in (topic.tenant, topic.namespace, topic.local))


def schema_file(text: str) -> dict[str, Any]:
    """A schema definition file as pulsar-admin's ``schemas upload -f`` reads it:
    ``{"type": "AVRO", "schema": "...", "properties": {...}}``."""
    try:
        with open(text, encoding="utf-8") as definition:
            body = json.load(definition)
    except (OSError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"schema file {text}: {exc}") from None
    if not isinstance(body, dict) or "type" not in body:
        raise argparse.ArgumentTypeError(f"schema file {text} must hold a JSON object with a \"type\"")
    return body


def _add_schemas(group: _Group) -> None:
    get = group.command("get", "the topic's latest schema, or one version", lambda a: Call(
        "GET", f"{a.topic}/schema" + (f"/{a.version}" if a.version is not None else "")))
    get.add_argument("topic", type=schema_path, help="persistent://tenant/namespace/topic or a short name")
    get.add_argument("-v", "--version", type=int)
    upload = group.command("upload", "add a schema version (refused when incompatible)",
                           lambda a: Call("POST", f"{a.topic}/schema", a.filename))
    upload.add_argument("topic", type=schema_path, help="persistent://tenant/namespace/topic or a short name")
    upload.add_argument("-f", "--filename", type=schema_file, required=True,
                        help='a JSON file: {"type": "AVRO", "schema": "...", "properties": {}}')
    group.command("delete", "delete every version of the topic's schema", lambda a: Call(
        "DELETE", f"{a.topic}/schema")).add_argument("topic", type=schema_path)


# --- topics ---------------------------------------------------------------------------------------
def _topic_command(group: _Group, name: str, help_text: str, build: Build | None) -> argparse.ArgumentParser:
    parser = group.command(name, help_text, build)
    parser.add_argument("topic", type=topic_path, help="persistent://tenant/namespace/topic or a short name")
    return parser


def _add_topics(group: _Group) -> None:
    admin = "/admin/v2"
    group.command("list", "list a namespace's topics (partitions as -partition-N)",
                  lambda a: Call("GET", f"{admin}/persistent/{a.namespace}")).add_argument("namespace",
                                                                                         type=namespace_path)
    group.command("list-partitioned-topics", "list a namespace's partitioned topics",
                  lambda a: Call("GET", f"{admin}/persistent/{a.namespace}/partitioned")).add_argument(
        "namespace", type=namespace_path)
    _topic_command(group, "create", "create a non-partitioned topic", lambda a: Call("PUT", f"{admin}/{a.topic}"))
    _topic_command(group, "delete", "delete a topic", lambda a: Call(
        "DELETE", f"{admin}/{a.topic}", params={"force": "true"} if a.force else None)).add_argument(
        "-f", "--force", action="store_true", help="also delete its subscriptions")
    _topic_command(group, "create-partitioned-topic", "create a partitioned topic", lambda a: Call(
        "PUT", f"{admin}/{a.topic}/partitions", a.partitions)).add_argument(
        "-p", "--partitions", type=positive, required=True)
    _topic_command(group, "update-partitioned-topic", "raise a partitioned topic's partition count", lambda a: Call(
        "POST", f"{admin}/{a.topic}/partitions", a.partitions)).add_argument(
        "-p", "--partitions", type=positive, required=True)
    _topic_command(group, "get-partitioned-topic-metadata", "the number of partitions",
                   lambda a: Call("GET", f"{admin}/{a.topic}/partitions"))
    _topic_command(group, "delete-partitioned-topic", "delete a partitioned topic and its partitions", lambda a: Call(
        "DELETE", f"{admin}/{a.topic}/partitions", params={"force": "true"} if a.force else None)).add_argument(
        "-f", "--force", action="store_true", help="also delete its subscriptions")
    _topic_command(group, "stats", "statistics (Pulsar's TopicStats)",
                   lambda a: Call("GET", f"{admin}/{a.topic}/stats"))
    _topic_command(group, "partitioned-stats", "statistics of a partitioned topic",
                   lambda a: Call("GET", f"{admin}/{a.topic}/partitioned-stats",
                                  params={"perPartition": "true"} if a.per_partition else None)).add_argument(
        "--per-partition", action="store_true")
    _topic_command(group, "unload", "close the topic: its clients reconnect, it loads afresh on next use",
                   lambda a: Call("PUT", f"{admin}/{a.topic}/unload"))
    _topic_command(group, "stats-internal", "storage statistics: ledgers and cursors",
                   lambda a: Call("GET", f"{admin}/{a.topic}/internalStats"))


def _subscription_command(group: _Group, name: str, help_text: str, build: Build | None) -> argparse.ArgumentParser:
    parser = _topic_command(group, name, help_text, build)
    parser.add_argument("-s", "--subscription", required=True)
    return parser


def _subscription_path(args: argparse.Namespace) -> str:
    return f"/admin/v2/{args.topic}/subscription/{_quote(args.subscription)}"


def _initial_position(text: str) -> Any:
    return text.lower() if text.lower() in ("earliest", "latest") else message_id_body(text)


def _reset_cursor(args: argparse.Namespace) -> Call:
    if (args.time is None) == (args.message_id is None):
        raise ValueError("give exactly one of -t/--time or -m/--message-id")
    if args.time is not None:
        timestamp_ms = int(time.time() * 1000) - args.time * 1000
        return Call("POST", f"{_subscription_path(args)}/resetcursor/{max(timestamp_ms, 0)}")
    return Call("POST", f"{_subscription_path(args)}/resetcursor", args.message_id)


def _add_subscriptions(group: _Group) -> None:
    _topic_command(group, "subscriptions", "list the subscriptions",
                   lambda a: Call("GET", f"/admin/v2/{a.topic}/subscriptions"))
    _subscription_command(group, "create-subscription", "create a durable subscription", lambda a: Call(
        "PUT", _subscription_path(a), a.message_id)).add_argument(
        "-m", "--message-id", type=_initial_position, default="latest",
        help="earliest, latest (default) or ledger:entry")
    _subscription_command(group, "unsubscribe", "delete a subscription", lambda a: Call(
        "DELETE", _subscription_path(a), params={"force": "true"} if a.force else None)).add_argument(
        "-f", "--force", action="store_true", help="disconnect its consumers first")
    reset = _subscription_command(group, "reset-cursor", "move the subscription to a time or message id",
                                  _reset_cursor)
    reset.add_argument("-t", "--time", type=duration_s, help="go back this far, e.g. 10m, 3h, 2d")
    reset.add_argument("-m", "--message-id", type=message_id_body, help="ledger:entry[:partition[:batch]] or base64")
    _subscription_command(group, "skip", "skip (acknowledge) the next N messages", lambda a: Call(
        "POST", f"{_subscription_path(a)}/skip/{a.count}")).add_argument("-n", "--count", type=positive, required=True)
    _subscription_command(group, "clear-backlog", "acknowledge the whole backlog",
                          lambda a: Call("POST", f"{_subscription_path(a)}/skip_all"))
    _subscription_command(group, "expire-messages", "acknowledge messages older than T seconds", lambda a: Call(
        "POST", f"{_subscription_path(a)}/expireMessages/{a.expire_time}")).add_argument(
        "-t", "--expire-time", type=duration_s, required=True, help="seconds (or 10m, 3h, ...)")
    peek = _subscription_command(group, "peek-messages", "the next N unacknowledged messages (a JSON array)", None)
    peek.add_argument("-n", "--count", type=positive, default=1)
    peek.set_defaults(handler=_peek)


def peeked_message(position: int, response: httpx.Response) -> dict[str, Any]:
    """A peeked message (raw payload + ``X-Pulsar-*`` headers) as one JSON object."""
    headers = response.headers
    properties = json.loads(headers.get("X-Pulsar-PROPERTY", "{}") or "{}")
    found: dict[str, Any] = {"position": position, "messageId": headers.get("X-Pulsar-Message-ID"),
                             "publishTime": headers.get("X-Pulsar-publish-time"), "properties": properties}
    for field, header in (("batchMessageId", "X-Magnetar-Message-ID"), ("offset", "X-Magnetar-Offset"),
                          ("key", "X-Pulsar-partition-key"), ("eventTime", "X-Pulsar-event-time"),
                          ("redeliveryCount", "X-Pulsar-redelivery-count")):
        if header in headers:
            found[field] = headers[header]
    try:
        found["payload"] = response.content.decode()
    except UnicodeDecodeError:
        found["payloadBase64"] = base64.b64encode(response.content).decode()
    return found


def _peek(args: argparse.Namespace) -> int:
    """Print the next ``--count`` unacknowledged messages as one JSON array (fewer if the backlog
    is shorter)."""
    if args.count > PEEK_MESSAGES_MAX:
        raise ValueError(f"peek at most {PEEK_MESSAGES_MAX} messages")
    peeked: list[dict[str, Any]] = []
    with client_of(args) as client:
        for position in range(1, args.count + 1):
            try:
                response = client.request("GET", f"{_subscription_path(args)}/position/{position}")
            except HttpError as exc:
                if exc.status == 404 and position > 1:
                    break
                raise
            peeked.append(peeked_message(position, response))
    print(json.dumps(peeked, indent=2, sort_keys=True))
    return 0


def _add_topic_lifecycle(group: _Group) -> None:
    admin = "/admin/v2"
    _topic_command(group, "last-message-id", "the id of the last message",
                   lambda a: Call("GET", f"{admin}/{a.topic}/lastMessageId"))
    _topic_command(group, "compact", "start compaction (latest message per key)",
                   lambda a: Call("PUT", f"{admin}/{a.topic}/compaction"))
    _topic_command(group, "compaction-status", "NOT_RUN, RUNNING, SUCCESS or ERROR",
                   lambda a: Call("GET", f"{admin}/{a.topic}/compaction"))
    _topic_command(group, "terminate", "accept no more messages; prints the last message id",
                   lambda a: Call("POST", f"{admin}/{a.topic}/terminate"))
    offload = _topic_command(group, "offload", "offload closed ledgers to the object store, keeping at most "
                             "--size-threshold bytes on the bookies", None)
    offload.add_argument("-s", "--size-threshold", dest="size_threshold", type=size_bytes, required=True,
                         help="bytes to keep on the bookies, e.g. 10M, 1G")
    offload.set_defaults(handler=_offload)
    status = _topic_command(group, "offload-status", "NOT_RUN, RUNNING, SUCCESS or ERROR (with lastError)", None)
    status.add_argument("-w", "--wait-complete", dest="wait", action="store_true",
                        help="wait while the offload runs")
    status.set_defaults(handler=_offload_status)


def first_ledger_within(ledgers: list[dict[str, Any]], size_threshold: int) -> dict[str, int] | None:
    """The message id before which to offload so that at most ``size_threshold`` bytes of the
    newest ledgers stay (pulsar-admin's ``findFirstLedgerWithinThreshold``); None: nothing to offload."""
    suffix_bytes = 0
    previous = ledgers[-1]["ledgerId"] if ledgers else -1
    for ledger in reversed(ledgers):
        suffix_bytes += int(ledger["size"])
        if suffix_bytes > size_threshold:
            return {"ledgerId": previous, "entryId": 0, "partitionIndex": -1}
        previous = ledger["ledgerId"]
    return None


def _offload(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        stats = client.request("GET", f"/admin/v2/{args.topic}/internalStats").json()
        ledgers = list(stats.get("ledgers", []))
        if ledgers:
            ledgers[-1] = {**ledgers[-1], "size": stats.get("currentLedgerSize", ledgers[-1]["size"])}
        message_id = first_ledger_within(ledgers, args.size_threshold)
        if message_id is None:
            print("Nothing to offload")
            return 0
        client.request("PUT", f"/admin/v2/{args.topic}/offload", json_body=message_id)
    print(f"Offload triggered for {args.topic} for messages before {message_id['ledgerId']}:0:-1")
    return 0


def _offload_status(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        status = client.request("GET", f"/admin/v2/{args.topic}/offload").json()
        while args.wait and status.get("status") == "RUNNING":
            time.sleep(OFFLOAD_STATUS_POLL_S)
            status = client.request("GET", f"/admin/v2/{args.topic}/offload").json()
    print(json.dumps(status, indent=2, sort_keys=True))
    return 0 if status.get("status") != "ERROR" else 1
