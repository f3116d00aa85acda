"""The client commands of ``magnetar``: ``produce``, ``consume``, ``tokens`` (and the wiring of
``admin`` and ``perf``), in the shape of Pulsar's ``pulsar-client`` and ``pulsar tokens``.

Role: command-line front end of ``consumers.client``; these commands reach the broker over the
network only (``--service-url``, default ``http://127.0.0.1:8080`` or ``$MAGNETAR_SERVICE_URL``;
``--token`` or ``$MAGNETAR_TOKEN``), so they work against any running broker.

Invariants: a broker error prints the broker's ``code: message`` on stderr and exits 1; bad
arguments exit 2 (argparse); every wait is bounded unless the user asked to wait forever
(``consume -n 0`` without ``--timeout-s``).
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from consumers.client import DEFAULT_SERVICE_URL, Client, ClientError, HttpError, Message, ReceiveTimeout

ENV_SERVICE_URL = "MAGNETAR_SERVICE_URL"
ENV_TOKEN = "MAGNETAR_TOKEN"
REST_PRODUCE_BATCH_MAX = 100
SECRET_KEY_BYTES = 32  # HS256
RSA_KEY_BITS = 2048
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace], int]


def add_connection_options(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    """``--service-url`` and ``--token``; on subcommands they default to the top level's value."""
    url_default = os.environ.get(ENV_SERVICE_URL, DEFAULT_SERVICE_URL) if top_level else argparse.SUPPRESS
    token_default = os.environ.get(ENV_TOKEN) if top_level else argparse.SUPPRESS
    parser.add_argument("--service-url", default=url_default,
                        help=f"broker URL (default ${ENV_SERVICE_URL} or {DEFAULT_SERVICE_URL})")
    parser.add_argument("--token", default=token_default, help=f"auth token (default ${ENV_TOKEN})")


def connection_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    add_connection_options(parent, top_level=False)
    return parent


def client_of(args: argparse.Namespace) -> Client:
    return Client(args.service_url, args.token or None)


def add_client_commands(parser: argparse.ArgumentParser, commands: Any) -> None:
    """Register produce, consume, admin, perf and tokens on ``magnetar``'s subcommands."""
    from api.cli_admin import add_admin_commands
    from api.cli_perf import add_perf_commands

    add_connection_options(parser, top_level=True)
    connection = connection_parent()
    _add_produce(commands, connection)
    _add_consume(commands, connection)
    add_admin_commands(commands, connection)
    add_perf_commands(commands, connection)
    _add_tokens(commands)


def run_client_command(args: argparse.Namespace) -> int:
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        raise AssertionError(f"unhandled command {args.command}")
    try:
        return handler(args)
    except HttpError as exc:
        print(f"{exc.code}: {exc.message}", file=sys.stderr)
    except ClientError as exc:
        print(str(exc), file=sys.stderr)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_FAILURE


def parse_properties(items: list[str] | None) -> dict[str, str]:
    properties: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"property {item!r} must look like key=value")
        properties[key] = value
    return properties


# --- produce ---------------------------------------------------------------------------------
def _add_produce(commands: Any, connection: argparse.ArgumentParser) -> None:
    produce = commands.add_parser("produce", parents=[connection], help="produce messages (like pulsar-client produce)")
    produce.add_argument("topic")
    produce.add_argument("-m", "--messages", action="append", default=[], metavar="MSG",
                         help="a message (UTF-8); repeat for several")
    produce.add_argument("-f", "--file", action="append", default=[], metavar="PATH",
                         help="a file whose bytes are one message; repeat for several")
    produce.add_argument("-n", "--num-produce", type=int, default=1, metavar="COUNT",
                         help="how many times to send the messages (default 1)")
    produce.add_argument("-k", "--key", help="partitioning key of every message")
    produce.add_argument("-p", "--properties", action="append", metavar="KEY=VALUE", help="a message property")
    produce.add_argument("--rest", action="store_true", help="produce over REST (PIP-64) instead of WebSocket")
    produce.set_defaults(handler=_produce)


def _produce(args: argparse.Namespace) -> int:
    payloads = [m.encode() for m in args.messages] + [Path(f).read_bytes() for f in args.file]
    if not payloads:
        raise ValueError("give at least one message (-m MSG) or file (-f PATH)")
    if args.num_produce < 1:
        raise ValueError("-n must be at least 1")
    properties = parse_properties(args.properties)
    messages = payloads * args.num_produce
    with client_of(args) as client:
        if args.rest:
            for start in range(0, len(messages), REST_PRODUCE_BATCH_MAX):
                chunk = messages[start:start + REST_PRODUCE_BATCH_MAX]
                client.produce_batch(args.topic, chunk, keys=[args.key] * len(chunk), properties=properties)
        else:
            producer = client.create_producer(args.topic)
            futures = [producer.send_async(m, key=args.key, properties=properties) for m in messages]
            for future in futures:
                future.result()
            producer.close()
    print(f"{len(messages)} messages successfully produced")
    return 0


# --- consume ---------------------------------------------------------------------------------
def _add_consume(commands: Any, connection: argparse.ArgumentParser) -> None:
    consume = commands.add_parser("consume", parents=[connection], help="consume messages (like pulsar-client consume)")
    consume.add_argument("topic")
    consume.add_argument("-s", "--subscription-name", required=True, metavar="SUB")
    consume.add_argument("-t", "--subscription-type", default="Exclusive",
                         choices=["Exclusive", "Shared", "Failover", "Key_Shared"])
    consume.add_argument("-n", "--num-messages", type=int, default=1, metavar="COUNT",
                         help="how many messages to consume (0 = forever; default 1)")
    consume.add_argument("-p", "--subscription-position", default="latest", type=str.lower,
                         choices=["latest", "earliest"], help="where a new subscription starts (default latest)")
    consume.add_argument("--timeout-s", type=float, default=None,
                         help="give up when no message arrives for this long (default: wait)")
    consume.add_argument("-q", "--receiver-queue-size", type=int, default=1000)
    consume.set_defaults(handler=_consume)


def format_message(message: Message) -> str:
    properties = ", ".join(f"{k}={v}" for k, v in message.properties.items())
    key = message.key if message.key is not None else "null"
    content = message.data.decode(errors="replace")
    return f"----- got message -----\nkey:[{key}], properties:[{properties}], content:{content}"


def _consume(args: argparse.Namespace) -> int:
    if args.num_messages < 0:
        raise ValueError("-n must be 0 (forever) or more")
    timeout_ms = None if args.timeout_s is None else int(args.timeout_s * 1000)
    consumed = 0
    with client_of(args) as client:
        consumer = client.subscribe(args.topic, args.subscription_name, subscription_type=args.subscription_type,
                                    initial_position=args.subscription_position,
                                    receiver_queue_size=args.receiver_queue_size)
        try:
            while args.num_messages == 0 or consumed < args.num_messages:
                message = consumer.receive(timeout_ms)
                print(format_message(message), flush=True)
                consumer.acknowledge(message)
                consumed += 1
        except ReceiveTimeout:
            print(f"no message for {args.timeout_s:g} s", file=sys.stderr)
            if args.num_messages:
                print(f"{consumed} messages successfully consumed")
                return EXIT_FAILURE
        finally:
            consumer.close()
    print(f"{consumed} messages successfully consumed")
    return 0


# --- tokens ----------------------------------------------------------------------------------
def _add_tokens(commands: Any) -> None:
    tokens = commands.add_parser("tokens", help="create secret keys, key pairs and tokens (like pulsar tokens)")
    actions = tokens.add_subparsers(dest="tokens_command", required=True)
    secret = actions.add_parser("create-secret-key", help="a random HS256 secret key")
    secret.add_argument("-o", "--output", help="write the key's raw bytes here (default: print it in base64)")
    secret.set_defaults(handler=_create_secret_key)
    pair = actions.add_parser("create-key-pair", help="an RS256 key pair (PEM)")
    pair.add_argument("--output-private-key", required=True)
    pair.add_argument("--output-public-key", required=True)
    pair.set_defaults(handler=_create_key_pair)
    create = actions.add_parser("create", help="a token for a role, signed with a secret or private key")
    keys = create.add_mutually_exclusive_group(required=True)
    keys.add_argument("--secret-key", metavar="FILE", help="HS256 key: a path, file:///path or data:;base64,...")
    keys.add_argument("--private-key", metavar="FILE", help="RS256 private key (PEM): a path or file:///path")
    create.add_argument("-s", "--subject", required=True, metavar="ROLE", help="the role the token stands for")
    create.add_argument("-e", "--expiry-time-s", type=int, default=None, metavar="N",
                        help="the token expires after N seconds (default: never)")
    create.set_defaults(handler=_create_token)


def _write_private(path: str, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)


def _create_secret_key(args: argparse.Namespace) -> int:
    key = secrets.token_bytes(SECRET_KEY_BYTES)
    if args.output:
        _write_private(args.output, key)
    else:
        print(base64.b64encode(key).decode())
    return 0


def _create_key_pair(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    private = rsa.generate_private_key(public_exponent=65537, key_size=RSA_KEY_BITS)
    _write_private(args.output_private_key, private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    Path(args.output_public_key).write_bytes(private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return 0


def _create_token(args: argparse.Namespace) -> int:
    from api.auth import create_token, read_key

    if args.expiry_time_s is not None and args.expiry_time_s <= 0:
        raise ValueError("--expiry-time-s must be positive")
    secret = read_key(args.secret_key) if args.secret_key else None
    private = read_key(args.private_key) if args.private_key else None
    print(create_token(args.subject, secret_key=secret, private_key=private, expires_in_s=args.expiry_time_s))
    return 0
