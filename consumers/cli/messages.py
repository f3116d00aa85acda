"""``magnetar produce`` and ``magnetar consume``, in the shape of Pulsar's ``pulsar-client``.

Role: command-line front end of ``consumers.client``: produce over WebSocket (or REST with
``--rest``; with ``--expected-key-version`` as one conditional append to the key's event
stream, ``streams.py``), consume from a subscription and acknowledge what was printed.

Invariants: every wait is bounded unless the user asked to wait forever (``consume -n 0``
without ``--timeout-s``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from consumers.cli.options import EXIT_FAILURE, add_subscription_type, client_of, parse_properties
from consumers.cli.streams import append_conditionally
from consumers.client import Message, ReceiveTimeout

REST_PRODUCE_BATCH_MAX = 100
TOPIC_HELP = "persistent://tenant/namespace/topic, or a short name in public/default"


def add_message_commands(commands: Any, connection: argparse.ArgumentParser) -> None:
    _add_produce(commands, connection)
    _add_consume(commands, connection)


def _add_produce(commands: Any, connection: argparse.ArgumentParser) -> None:
    produce = commands.add_parser("produce", parents=[connection], help="produce messages (like pulsar-client produce)")
    produce.add_argument("topic", help=TOPIC_HELP)
    produce.add_argument("-m", "--messages", action="append", default=[], metavar="MSG",
                         help="a message (UTF-8); repeat for several")
    produce.add_argument("-f", "--file", action="append", default=[], metavar="PATH",
                         help="a file whose bytes are one message; repeat for several")
    produce.add_argument("-n", "--num-produce", type=int, default=1, metavar="COUNT",
                         help="how many times to send the messages (default 1)")
    produce.add_argument("-k", "--key", help="partitioning key of every message")
    produce.add_argument("-p", "--properties", action="append", metavar="KEY=VALUE", help="a message property")
    produce.add_argument("--rest", action="store_true", help="produce over REST (PIP-64) instead of WebSocket")
    produce.add_argument("--expected-key-version", metavar="N",
                         help="append every message at once to the key's event stream, only if it is at version N "
                              '(-1: a new stream; "exists": any version)')
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
        if args.expected_key_version is not None:
            print(append_conditionally(client, args, messages, properties))
            return 0
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
    consume.add_argument("topic", help=TOPIC_HELP)
    consume.add_argument("-s", "--subscription-name", required=True, metavar="SUB",
                         help="the durable subscription to read from; created at -p's position if it is new, "
                              "resumed after its last acknowledged message if it exists")
    add_subscription_type(consume, "how the subscription's consumers share messages (default Exclusive: one "
                                   "consumer)")
    consume.add_argument("-n", "--num-messages", type=int, default=1, metavar="COUNT",
                         help="how many messages to consume (0 = forever; default 1)")
    consume.add_argument("-p", "--subscription-position", default="latest", type=str.lower,
                         choices=["latest", "earliest"], help="where a new subscription starts (default latest)")
    consume.add_argument("--timeout-s", type=float, default=None,
                         help="give up when no message arrives for this long (default: wait)")
    consume.add_argument("-q", "--receiver-queue-size", type=int, default=1000,
                         help="messages the broker may send ahead of their acknowledgement (default 1000)")
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


