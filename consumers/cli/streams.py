"""``magnetar read-stream``: one key's event stream, by version, and ``produce``'s conditional append.

Role: command-line front end of the client's event streams. ``read-stream TOPIC KEY`` prints
the key's events from ``--from-version`` on (``--backward``: from the last one down), at most
``-n`` of them, and with ``--follow`` keeps printing new ones as they are appended (a live
stream reader). ``magnetar produce -k KEY --expected-key-version N`` (``messages.py``) appends
conditionally through :func:`append_conditionally`.

Invariants: every wait is bounded unless the user asked to wait forever (``--follow -n 0``
without ``--timeout-s``); events print in the order read, each with its version and offset.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from consumers.cli.options import EXIT_FAILURE, client_of
from consumers.client import Client, Message, ReceiveTimeout

READ_PAGE_MESSAGES = 1000


def add_stream_commands(commands: Any, connection: argparse.ArgumentParser) -> None:
    read = commands.add_parser("read-stream", parents=[connection],
                               help="read one key's event stream by version (and follow it)")
    read.add_argument("topic")
    read.add_argument("key")
    read.add_argument("--from-version", type=int, default=None, metavar="N",
                      help="first version to print (default: the first kept, or the last with --backward)")
    read.add_argument("--backward", action="store_true", help="from the newest version down")
    read.add_argument("-n", "--num-messages", type=int, default=0, metavar="COUNT",
                      help="print at most this many events (0: all; with --follow, forever)")
    read.add_argument("--follow", action="store_true", help="keep printing events as they are appended")
    read.add_argument("--timeout-s", type=float, default=None,
                      help="with --follow: give up when no event arrives for this long (default: wait)")
    read.set_defaults(handler=_read_stream)


def format_event(message: Message) -> str:
    properties = ", ".join(f"{k}={v}" for k, v in message.properties.items())
    content = message.data.decode(errors="replace")
    return (f"----- version {message.key_version} (offset {message.offset}) -----\n"
            f"properties:[{properties}], content:{content}")


def append_conditionally(client: Client, args: argparse.Namespace, payloads: list[bytes],
                         properties: dict[str, str]) -> str:
    """One append of every payload to the stream of ``args.key``, expecting ``args.expected_key_version``."""
    if args.key is None:
        raise ValueError("--expected-key-version needs a key (-k KEY)")
    expected: int | str = args.expected_key_version
    if expected != "exists":
        try:
            expected = int(expected)
        except ValueError:
            raise ValueError('--expected-key-version takes a version (-1 for a new stream) or "exists"') from None
    result = client.append(args.topic, args.key, payloads, expected_version=expected, properties=properties)
    events = f"{len(payloads)} event{'' if len(payloads) == 1 else 's'}"
    return f"{events} appended to {args.key!r}: versions {result.first_version}..{result.version}"


def _read_stream(args: argparse.Namespace) -> int:
    if args.num_messages < 0:
        raise ValueError("-n must be 0 (all) or more")
    if args.follow and args.backward:
        raise ValueError("--follow reads forward; drop --backward")
    printed = 0
    with client_of(args) as client:
        if args.follow:
            return _follow(client, args)
        version = args.from_version
        while args.num_messages == 0 or printed < args.num_messages:
            page = min(READ_PAGE_MESSAGES, args.num_messages - printed) if args.num_messages else READ_PAGE_MESSAGES
            batch = client.read_stream(args.topic, args.key, from_version=version, max_messages=page,
                                       backward=args.backward)
            for message in batch.messages:
                print(format_event(message), flush=True)
            printed += len(batch.messages)
            if not batch.messages or batch.next_version < 0 or batch.next_version > batch.version:
                break
            version = batch.next_version
    print(f"{printed} event{'' if printed == 1 else 's'} of {args.key!r} read")
    return 0


def _follow(client: Client, args: argparse.Namespace) -> int:
    timeout_ms = None if args.timeout_s is None else int(args.timeout_s * 1000)
    printed = 0
    reader = client.create_stream_reader(args.topic, args.key, args.from_version or 0)
    try:
        while args.num_messages == 0 or printed < args.num_messages:
            print(format_event(reader.read_next(timeout_ms)), flush=True)
            printed += 1
    except ReceiveTimeout:
        print(f"no event for {args.timeout_s:g} s", file=sys.stderr)
        if args.num_messages:
            print(f"{printed} event{'' if printed == 1 else 's'} of {args.key!r} read")
            return EXIT_FAILURE
    finally:
        reader.close()
    print(f"{printed} event{'' if printed == 1 else 's'} of {args.key!r} read")
    return 0
