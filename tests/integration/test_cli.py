"""The ``magnetar`` client commands as real subprocesses against a real ``magnetar standalone``.

Checks: ``produce`` then ``consume`` prints the messages as ``pulsar-client`` does (key,
properties, content) over WebSocket and REST, with the service URL from the flag or the
environment; ``consume`` gives up after ``--timeout-s`` with exit 1; ``admin`` tenants,
namespaces, topics and subscriptions commands change and report the broker's state, and broker
errors print ``code: message`` and exit 1; ``perf`` prints live rates and latency percentiles;
tokens made by ``tokens create`` (HS256 and RS256) are accepted by a server with authentication
on, and requests without them are refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.auth import AuthConfig
from broker.service import BrokerConfig
from consumers.client import Client
from tests.integration.server import running_server
from tests.standalone import REPO_ROOT, standalone_process

CLI_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Done:
    returncode: int | None
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with standalone_process(tmp_path_factory.mktemp("cli") / "data") as (service_url, _):
        yield service_url


def _command(args: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "api.cli", *args]


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("MAGNETAR_SERVICE_URL", "MAGNETAR_TOKEN")}
    return {**clean, **(extra or {})}


def run_all(*commands: tuple[str, ...], env: dict[str, str] | None = None) -> list[Done]:
    """Run independent ``magnetar`` commands side by side; every process is reaped (killed by PID
    after ``CLI_TIMEOUT_S``)."""
    procs = [subprocess.Popen(_command(args), cwd=REPO_ROOT, env=_env(env), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for args in commands]
    try:
        outputs = [proc.communicate(timeout=CLI_TIMEOUT_S) for proc in procs]
        return [Done(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs, strict=True)]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


def magnetar(*args: str, env: dict[str, str] | None = None) -> Done:
    return run_all(args, env=env)[0]


def ok(url: str, *args: str) -> str:
    return ok_all(url, args)[0]


def ok_all(url: str, *commands: tuple[str, ...]) -> list[str]:
    """Run commands side by side against ``url``; each must succeed. Their outputs, in order."""
    done = run_all(*(("--service-url", url, *args) for args in commands))
    for args, result in zip(commands, done, strict=True):
        assert result.returncode == 0, f"magnetar {' '.join(args)}: {result.stderr}"
    return [result.stdout for result in done]


def ok_json(url: str, *args: str) -> Any:
    return json.loads(ok(url, *args))


ACK_APPLIED_WAIT_S = 10.0
"""How long the broker may take to apply acknowledgements the CLI sent before it exited."""


def backlog(url: str, topic: str, subscription: str) -> int:
    """The subscription's backlog, read directly from the admin API (not through the CLI)."""
    stats = httpx.get(f"{url}/admin/v2/persistent/public/default/{topic}/stats", timeout=HTTP_TIMEOUT_S).json()
    return int(stats["subscriptions"][subscription]["msgBacklog"])


def test_produce_then_consume_prints_the_messages(url: str) -> None:
    out = ok(url, "produce", "orders", "-m", "hello", "-m", "world", "-k", "k1", "-p", "a=1", "-p", "b=2", "-n", "2")
    assert "4 messages successfully produced" in out
    out = ok(url, "consume", "orders", "-s", "sub", "-p", "earliest", "-n", "4", "--timeout-s", "20")
    blocks = out.split("----- got message -----\n")[1:]
    assert [b.splitlines()[0] for b in blocks] == [f"key:[k1], properties:[a=1, b=2], content:{text}"
                                                   for text in ("hello", "world", "hello", "world")]
    assert "4 messages successfully consumed" in out
    # each one was acknowledged: the acknowledgements are frames without an answer, applied as
    # the broker reads them, so the backlog reaches 0 once it has (bounded wait)
    deadline_s = time.monotonic() + ACK_APPLIED_WAIT_S
    while backlog(url, "orders", "sub") != 0 and time.monotonic() < deadline_s:
        time.sleep(0.05)
    assert backlog(url, "orders", "sub") == 0


def test_rest_produce_and_the_service_url_from_the_environment(url: str, tmp_path: Path) -> None:
    payload = tmp_path / "payload.txt"
    payload.write_bytes("from a file ✓".encode())
    produced = magnetar("produce", "public/default/rest-topic", "--rest", "-m", "via rest", "-f", str(payload),
                        env={"MAGNETAR_SERVICE_URL": url})
    assert produced.returncode == 0, produced.stderr
    assert "2 messages successfully produced" in produced.stdout
    out = magnetar("consume", "persistent://public/default/rest-topic", "-s", "s", "-p", "earliest", "-n", "2",
                   "--timeout-s", "20", "--service-url", url)
    assert out.returncode == 0, out.stderr
    assert "key:[null], properties:[], content:via rest" in out.stdout
    assert "content:from a file ✓" in out.stdout


def test_consume_gives_up_after_the_timeout(url: str) -> None:
    done = magnetar("--service-url", url, "consume", "empty", "-s", "sub", "-n", "1", "--timeout-s", "0.5")
    assert done.returncode == 1
    assert "no message for 0.5 s" in done.stderr and "0 messages successfully consumed" in done.stdout


def test_admin_tenants_and_namespaces(url: str) -> None:
    ok(url, "admin", "tenants", "create", "acme", "--admin-roles", "ops,dev")
    ok(url, "admin", "namespaces", "create", "acme/billing")
    ok_all(url, ("admin", "namespaces", "set-retention", "acme/billing", "--time", "3h", "--size", "10G"),
           ("admin", "namespaces", "grant-permission", "acme/billing", "--role", "app", "--actions", "produce,consume"))
    tenants, namespaces, retention, permissions = ok_all(
        url, ("admin", "tenants", "list"), ("admin", "namespaces", "list", "acme"),
        ("admin", "namespaces", "get-retention", "acme/billing"),
        ("admin", "namespaces", "permissions", "acme/billing"))
    assert json.loads(tenants) == ["acme", "public"] and json.loads(namespaces) == ["acme/billing"]
    assert json.loads(retention) == {"retentionTimeInMinutes": 180, "retentionSizeInMB": 10240}
    assert json.loads(permissions) == {"app": ["consume", "produce"]}
    ok(url, "admin", "namespaces", "revoke-permission", "acme/billing", "--role", "app")
    assert httpx.get(f"{url}/admin/v2/namespaces/acme/billing/permissions", timeout=HTTP_TIMEOUT_S).json() == {}
    ok(url, "admin", "namespaces", "delete", "acme/billing")
    ok(url, "admin", "tenants", "delete", "acme")
    assert httpx.get(f"{url}/admin/v2/tenants", timeout=HTTP_TIMEOUT_S).json() == ["public"]


def test_admin_namespaces_message_ttl_and_deduplication(url: str) -> None:
    ok(url, "admin", "namespaces", "create", "public/policies")
    ok_all(url, ("admin", "namespaces", "set-message-ttl", "public/policies", "-ttl", "2h"),
           ("admin", "namespaces", "set-deduplication", "public/policies", "--disable"))
    ttl, dedup = ok_all(url, ("admin", "namespaces", "get-message-ttl", "public/policies"),
                        ("admin", "namespaces", "get-deduplication", "public/policies"))
    assert (json.loads(ttl), json.loads(dedup)) == (7200, False)
    policies = httpx.get(f"{url}/admin/v2/namespaces/public/policies", timeout=HTTP_TIMEOUT_S).json()
    assert (policies["message_ttl_in_seconds"], policies["deduplicationEnabled"]) == (7200, False)
    ok_all(url, ("admin", "namespaces", "remove-message-ttl", "public/policies"),
           ("admin", "namespaces", "set-deduplication", "public/policies", "-e"))
    ttl, dedup = ok_all(url, ("admin", "namespaces", "get-message-ttl", "public/policies"),
                        ("admin", "namespaces", "get-deduplication", "public/policies"))
    assert (json.loads(ttl), json.loads(dedup)) == (None, True)
    ok(url, "admin", "namespaces", "remove-deduplication", "public/policies")
    assert json.loads(ok(url, "admin", "namespaces", "get-deduplication", "public/policies")) is None
    neither = magnetar("--service-url", url, "admin", "namespaces", "set-deduplication", "public/policies")
    assert neither.returncode == 2 and "-e/--enable" in neither.stderr


def test_admin_namespaces_quotas_and_rates_as_pulsar_admin_names_them(url: str) -> None:
    ok(url, "admin", "namespaces", "create", "public/quotas")
    for command in (("set-max-producers-per-topic", "-p", "3"),  # one after another: one policy document
                    ("set-max-consumers-per-topic", "--max-consumers-per-topic", "4"),
                    ("set-max-subscriptions-per-topic", "-s", "5"), ("set-max-topics-per-namespace", "-t", "6"),
                    ("set-publish-rate", "-m", "100"), ("set-dispatch-rate", "-bd", "1024", "-dt", "2")):
        ok(url, "admin", "namespaces", command[0], "public/quotas", *command[1:])
    got = ok_all(url, *[("admin", "namespaces", f"get-{what}", "public/quotas") for what in (
        "max-producers-per-topic", "max-consumers-per-topic", "max-subscriptions-per-topic",
        "max-topics-per-namespace", "publish-rate", "dispatch-rate")])
    assert [json.loads(g) for g in got] == [
        3, 4, 5, 6, {"publishThrottlingRateInMsg": 100, "publishThrottlingRateInByte": -1},
        {"dispatchThrottlingRateInMsg": -1, "dispatchThrottlingRateInByte": 1024, "ratePeriodInSecond": 2,
         "relativeToPublishRate": False}]
    ok(url, "admin", "namespaces", "remove-max-producers-per-topic", "public/quotas")
    ok(url, "admin", "namespaces", "remove-publish-rate", "public/quotas")
    policies = httpx.get(f"{url}/admin/v2/namespaces/public/quotas", timeout=HTTP_TIMEOUT_S).json()
    assert (policies["max_producers_per_topic"], policies["publishMaxMessageRate"]) == (None, None)
    refused = magnetar("--service-url", url, "admin", "namespaces", "set-max-topics-per-namespace", "public/quotas",
                       "-t", "-1")
    assert refused.returncode != 0 and "maxTopicsPerNamespace" in refused.stdout + refused.stderr


def test_consume_explains_each_option() -> None:
    helped = magnetar("consume", "--help")
    assert helped.returncode == 0
    options = helped.stdout.split("options:", 1)[1]
    for flag in ("-s SUB, --subscription-name SUB", "--subscription-type", "--receiver-queue-size"):
        described = options.split(flag, 1)[1].split("\n  -", 1)[0]
        assert len(described.split()) >= 5, f"{flag} has no help text: {described!r}"


def test_every_client_command_finds_the_broker_through_the_environment(url: str) -> None:
    env = {"MAGNETAR_SERVICE_URL": url}
    commands = [("produce", "env-topic", "-m", "one"),
                ("admin", "topics", "create-subscription", "env-topic", "-s", "env", "-m", "earliest"),
                ("perf", "produce", "env-perf", "-m", "5", "-s", "16")]
    for done, args in zip(run_all(*commands, env=env), commands, strict=True):
        assert done.returncode == 0, f"magnetar {' '.join(args)}: {done.stderr}"
    consumed, stats = run_all(("consume", "env-topic", "-s", "env", "-n", "1", "--timeout-s", "20"),
                              ("admin", "topics", "stats", "env-perf"), env=env)
    assert consumed.returncode == 0 and "content:one" in consumed.stdout, consumed.stderr
    assert stats.returncode == 0 and json.loads(stats.stdout)["msgInCounter"] == 5, stats.stderr


def test_create_subscription_on_a_topic_nobody_wrote_to_yet(url: str, tmp_path: Path) -> None:
    ok(url, "admin", "topics", "create-subscription", "not-written-yet", "-s", "early", "-m", "earliest")
    assert ok_json(url, "admin", "topics", "subscriptions", "not-written-yet") == ["early"]
    ok(url, "produce", "not-written-yet", "-m", "first")
    assert "content:first" in ok(url, "consume", "not-written-yet", "-s", "early", "-n", "1", "--timeout-s", "20")
    no_auto_create = dataclasses.replace(BrokerConfig.test_min(), auto_create_topics=False)
    with running_server(str(tmp_path / "data"), no_auto_create) as (strict_url, _):
        refused = magnetar("--service-url", strict_url, "admin", "topics", "create-subscription", "never", "-s", "s")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "not_found: topic persistent://public/default/never does not exist; allowAutoTopicCreation is off: create it "
        "first (admin v2: PUT /admin/v2/persistent/public/default/never; CLI: magnetar admin topics create "
        "persistent://public/default/never)")


def test_admin_topics_and_partitioned_topics(url: str) -> None:
    ok_all(url, ("admin", "topics", "create", "persistent://public/default/plain"),
           ("admin", "topics", "create-partitioned-topic", "public/default/parts", "-p", "2"))
    ok(url, "admin", "topics", "update-partitioned-topic", "parts", "-p", "3")
    metadata, listed, internal = ok_all(url, ("admin", "topics", "get-partitioned-topic-metadata", "parts"),
                                        ("admin", "topics", "list", "public/default"),
                                        ("admin", "topics", "stats-internal", "plain"))
    assert json.loads(metadata) == {"partitions": 3}
    assert {"persistent://public/default/plain", "persistent://public/default/parts-partition-2"} <= \
        set(json.loads(listed))
    assert "ledgers" in json.loads(internal)
    ok_all(url, ("admin", "topics", "delete-partitioned-topic", "parts"), ("admin", "topics", "delete", "plain"))
    remaining = httpx.get(f"{url}/admin/v2/persistent/public/default", timeout=HTTP_TIMEOUT_S).json()
    assert not any("plain" in t or "parts" in t for t in remaining)


def test_admin_subscriptions_cursor_moves_and_lifecycle(url: str) -> None:
    """Three topics side by side: ``peeks`` (peek, skip, reset by id), ``moves`` (clear, reset by
    time, expire) and ``ends`` (last id, compaction, unsubscribe, terminate)."""
    with Client(url) as client:
        for topic in ("peeks", "moves", "ends"):
            client.produce_batch(topic, [b"c0", b"c1", b"c2"], keys=["same"] * 3)
    ok_all(url, *(("admin", "topics", "create-subscription", topic, "-s", "audit", "-m", "earliest")
                  for topic in ("peeks", "moves", "ends")))
    peek, subscriptions, _, last_text, _ = ok_all(
        url, ("admin", "topics", "peek-messages", "peeks", "-s", "audit", "-n", "5"),
        ("admin", "topics", "subscriptions", "peeks"), ("admin", "topics", "clear-backlog", "moves", "-s", "audit"),
        ("admin", "topics", "last-message-id", "ends"), ("admin", "topics", "compact", "ends"))
    peeked, last = json.loads(peek), json.loads(last_text)
    assert [p["payload"] for p in peeked] == ["c0", "c1", "c2"] and peeked[0]["key"] == "same"
    assert json.loads(subscriptions) == ["audit"] and backlog(url, "moves", "audit") == 0
    assert last["ledgerId"] >= 0 and last["entryId"] >= 0 and last["batchIndex"] == 2  # one REST batch
    _, _, status = ok_all(url, ("admin", "topics", "skip", "peeks", "-s", "audit", "-n", "2"),
                          ("admin", "topics", "reset-cursor", "moves", "-s", "audit", "-t", "1h"),
                          ("admin", "topics", "compaction-status", "ends"))
    assert backlog(url, "moves", "audit") == 3 and json.loads(status)["status"] in ("RUNNING", "SUCCESS")
    after_skip, _, _ = ok_all(url, ("admin", "topics", "peek-messages", "peeks", "-s", "audit"),
                              ("admin", "topics", "expire-messages", "moves", "-s", "audit", "-t", "0"),
                              ("admin", "topics", "unsubscribe", "ends", "-s", "audit"))
    assert [p["payload"] for p in json.loads(after_skip)] == ["c2"]
    ok_all(url, ("admin", "topics", "reset-cursor", "peeks", "-s", "audit", "-m", peeked[0]["batchMessageId"]),
           ("admin", "topics", "terminate", "ends"))
    after_reset, stats = ok_all(url, ("admin", "topics", "peek-messages", "peeks", "-s", "audit"),
                                ("admin", "topics", "stats", "moves"))
    assert [p["payload"] for p in json.loads(after_reset)] == ["c0"]
    assert json.loads(stats)["subscriptions"]["audit"]["msgBacklog"] == 0  # all three older than 0 s
    ended = httpx.get(f"{url}/admin/v2/persistent/public/default/ends/subscriptions", timeout=HTTP_TIMEOUT_S)
    assert ended.json() == []
    refused = magnetar("--service-url", url, "produce", "ends", "-m", "after the end")
    assert refused.returncode == 1 and refused.stderr.startswith("topic_terminated: ")


def test_admin_errors_print_the_brokers_code_and_message(url: str) -> None:
    httpx.put(f"{url}/admin/v2/persistent/public/default/twice", timeout=HTTP_TIMEOUT_S).raise_for_status()
    again, missing, bad = run_all(("--service-url", url, "admin", "topics", "create", "twice"),
                                  ("--service-url", url, "admin", "namespaces", "get-retention", "nobody/nothing"),
                                  ("--service-url", url, "admin", "namespaces", "create", "no-slash"))
    assert again.returncode == 1
    assert again.stderr.strip() == "already_exists: topic persistent://public/default/twice already exists"
    assert missing.returncode == 1 and missing.stderr.startswith("not_found: ")
    assert bad.returncode == 2 and "tenant/namespace" in bad.stderr


def test_perf_prints_rates_and_latency_percentiles(url: str) -> None:
    produced, rest = ok_all(url, ("perf", "produce", "perf-topic", "-n", "2", "-m", "300", "-s", "64", "--batching"),
                            ("perf", "produce", "perf-topic", "-m", "100", "-s", "64", "--rest", "--batching",
                             "--batch-max", "10"))
    assert "Created 2 producers" in produced  # -n counts producers and -m messages, as in pulsar-perf
    assert "Aggregated: 300 messages produced" in produced and "errors 0" in produced
    percentiles = next(line for line in produced.splitlines() if line.startswith("Publish latency ms:"))
    for label in ("p50", "p95", "p99", "p99.9", "max"):
        assert f"{label} " in percentiles
    assert "Aggregated: 100 messages produced" in rest
    consumed = ok(url, "perf", "consume", "perf-topic", "-s", "perf-sub", "-t", "shared", "-p", "earliest",
                  "-n", "2", "-m", "400", "--timeout-s", "20")
    assert "Created 2 consumers" in consumed and "Aggregated: 400 messages consumed" in consumed
    stats = httpx.get(f"{url}/admin/v2/persistent/public/default/perf-topic/stats", timeout=HTTP_TIMEOUT_S).json()
    assert stats["msgInCounter"] == 400 and stats["publishers"] == []
    assert any(line.startswith("End-to-end latency ms: p50 ") for line in consumed.splitlines())


def test_tokens_from_the_cli_are_accepted_by_the_server(tmp_path: Path) -> None:
    secret_file, private_file, public_file = tmp_path / "secret.key", tmp_path / "private.pem", tmp_path / "public.pem"
    keys = run_all(("tokens", "create-secret-key", "--output", str(secret_file)),
                   ("tokens", "create-key-pair", "--output-private-key", str(private_file),
                    "--output-public-key", str(public_file)))
    assert [k.returncode for k in keys] == [0, 0]
    hs256, rs256 = run_all(("tokens", "create", "--secret-key", f"file://{secret_file}", "--subject", "admin",
                            "--expiry-time-s", "3600"),
                           ("tokens", "create", "--private-key", str(private_file), "-s", "admin"))
    assert hs256.returncode == 0 and rs256.returncode == 0, hs256.stderr + rs256.stderr
    token, signed = hs256.stdout.strip(), rs256.stdout.strip()
    hs_auth = AuthConfig(enabled=True, secret_key=secret_file.read_bytes(), superuser_roles=frozenset({"admin"}))
    rs_auth = AuthConfig(enabled=True, public_key=public_file.read_bytes(), superuser_roles=frozenset({"admin"}))
    with running_server(str(tmp_path / "hs"), auth=hs_auth) as (hs_url, _), \
            running_server(str(tmp_path / "rs"), auth=rs_auth) as (rs_url, _):
        refused, accepted, listed, signed_ok, wrong_key = run_all(
            ("--token", "", "produce", "secure", "-m", "x"),  # flags override the environment
            ("--service-url", hs_url, "--token", token, "produce", "secure", "-m", "x"),
            ("admin", "tenants", "list"),
            ("--service-url", rs_url, "--token", signed, "produce", "rs", "-m", "x"),
            ("--service-url", rs_url, "--token", token, "produce", "rs", "-m", "x"),
            env={"MAGNETAR_SERVICE_URL": hs_url, "MAGNETAR_TOKEN": token})
    assert refused.returncode == 1 and refused.stderr.startswith("unauthorized: ")
    assert accepted.returncode == 0, accepted.stderr
    assert listed.returncode == 0 and json.loads(listed.stdout) == ["public"]  # URL and token from the environment
    assert signed_ok.returncode == 0, signed_ok.stderr
    assert wrong_key.returncode == 1 and wrong_key.stderr.startswith("unauthorized: ")


def test_admin_topics_unload_closes_the_topic_and_it_loads_afresh_on_a_new_ledger(url: str) -> None:
    ok(url, "produce", "unloaded", "-m", "before")
    first = ok_json(url, "admin", "topics", "stats-internal", "unloaded")["ledgers"][-1]["ledgerId"]
    ok(url, "admin", "topics", "unload", "unloaded")
    ok(url, "produce", "unloaded", "-m", "after")  # loaded again by its next use: a new ledger
    assert ok_json(url, "admin", "topics", "stats-internal", "unloaded")["ledgers"][-1]["ledgerId"] != first
    consumed = ok(url, "consume", "unloaded", "-s", "all", "-p", "earliest", "-n", "2", "--timeout-s", "20")
    assert "content:before" in consumed and "content:after" in consumed
    missing = magnetar("--service-url", url, "admin", "topics", "unload", "never-made")
    assert missing.returncode == 1 and missing.stderr.startswith("not_found: "), missing.stderr


def test_admin_bundles_persistence_brokers_and_schemas_as_pulsar_admin_names_them(url: str, tmp_path: Path) -> None:
    ok(url, "admin", "namespaces", "create", "public/bundled")
    bundles, brokers, bookies = ok_all(url, ("admin", "namespaces", "bundles", "public/bundled"),
                                       ("admin", "brokers", "list"), ("admin", "bookies", "list-bookies"))
    boundaries = json.loads(bundles)["boundaries"]
    assert boundaries[0] == "0x00000000" and boundaries[-1] == "0xffffffff"
    assert json.loads(brokers) == [url.split("://", 1)[1]]  # standalone lists itself, as Pulsar's does
    assert json.loads(bookies) == {"bookies": [{"bookieId": "embedded"}]}
    whole = "0x00000000_0xffffffff"
    for refused in run_all(*(("--service-url", url, "admin", "namespaces", *args) for args in (
            ("bundle-owners", "public/bundled"), ("unload", "public/bundled", "-b", whole),
            ("split-bundle", "public/bundled", "-b", whole)))):  # bundles have owners in a cluster only
        assert refused.returncode == 1 and refused.stderr.startswith(
            "not_allowed: bundles are owned by brokers only in a cluster"), refused.stderr
    ok(url, "admin", "namespaces", "set-persistence", "public/bundled", "-e", "1", "-w", "1", "-a", "1")
    assert ok_json(url, "admin", "namespaces", "get-persistence", "public/bundled") == {
        "bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1,
        "managedLedgerMaxMarkDeleteRate": 0.0}
    ok(url, "admin", "namespaces", "remove-persistence", "public/bundled")
    ok(url, "admin", "namespaces", "set-encryption-required", "public/bundled", "-e")
    assert ok_json(url, "admin", "namespaces", "get-encryption-required", "public/bundled") is True
    plain = magnetar("--service-url", url, "produce", "public/bundled/plain", "-m", "x")
    assert plain.returncode == 1 and "Encryption is required" in plain.stderr, plain.stderr
    ok(url, "admin", "namespaces", "set-encryption-required", "public/bundled", "-d")
    assert ok_json(url, "admin", "namespaces", "get-persistence", "public/bundled") is None
    definition = tmp_path / "schema.json"
    definition.write_text(json.dumps({"type": "JSON", "schema": json.dumps(
        {"type": "record", "name": "Click", "fields": [{"name": "page", "type": "string"}]}), "properties": {}}))
    ok(url, "admin", "schemas", "upload", "public/bundled/clicks", "-f", str(definition))
    schema = ok_json(url, "admin", "schemas", "get", "persistent://public/bundled/clicks")
    assert schema["type"] == "JSON" and "Click" in schema["data"], schema
    assert ok_json(url, "admin", "schemas", "get", "public/bundled/clicks", "--version", "0")["type"] == "JSON"
    ok(url, "admin", "schemas", "delete", "public/bundled/clicks")
    missing = magnetar("--service-url", url, "admin", "schemas", "get", "public/bundled/clicks")
    assert missing.returncode == 1 and missing.stderr.startswith("not_found: "), missing.stderr
    no_file = magnetar("--service-url", url, "admin", "schemas", "upload", "public/bundled/clicks", "-f",
                       str(tmp_path / "nowhere.json"))
    assert no_file.returncode == 2 and "schema file" in no_file.stderr
