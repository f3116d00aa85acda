"""What every ``magnetar`` client command shares: the broker to talk to, and how a failure ends.

``--service-url`` (default ``$MAGNETAR_SERVICE_URL`` or ``http://127.0.0.1:8080``; ``https://``
for a broker's TLS port; a ``pulsar://`` URL is refused naming the one to give), the
subscription type in any case (``subscription_type``), ``--token`` (default ``$MAGNETAR_TOKEN``) and the TLS options of
Pulsar's tools (``--tls-trust-certs-file-path``, pulsar-admin's ``--tls-trust-cert-path``: the
authorities that signed the broker's certificate; ``--tls-certificate-file-path`` and
``--tls-private-key-file-path``: a client certificate for mutual TLS) on the top level and on
every subcommand; a broker error prints the broker's ``code: message`` on stderr and exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TypedDict

from consumers.client import DEFAULT_SERVICE_URL, Client, ClientError, HttpError

ENV_SERVICE_URL = "MAGNETAR_SERVICE_URL"
ENV_TOKEN = "MAGNETAR_TOKEN"
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace], int]


def positive(text: str) -> int:
    """An option's whole number of at least 1 (a count of partitions, producers, consumers)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def add_connection_options(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    """``--service-url``, ``--token`` and the TLS options; on subcommands they default to the top
    level's value."""
    url_default = os.environ.get(ENV_SERVICE_URL, DEFAULT_SERVICE_URL) if top_level else argparse.SUPPRESS
    token_default = os.environ.get(ENV_TOKEN) if top_level else argparse.SUPPRESS
    parser.add_argument("--service-url", default=url_default, type=service_url,
                        help=f"the broker's web service URL, http:// or https:// (default ${ENV_SERVICE_URL} or "
                             f"{DEFAULT_SERVICE_URL})")
    parser.add_argument("--token", default=token_default, help=f"auth token (default ${ENV_TOKEN})")
    tls_default = None if top_level else argparse.SUPPRESS
    parser.add_argument("--tls-trust-certs-file-path", "--tls-trust-cert-path", dest="tls_trust_certs_file_path",
                        default=tls_default, metavar="FILE",
                        help="the authorities (PEM) that signed the broker's certificate (https:// URLs)")
    parser.add_argument("--tls-certificate-file-path", default=tls_default, metavar="FILE",
                        help="a client certificate (PEM) for mutual TLS: the broker takes the role from its CN")
    parser.add_argument("--tls-private-key-file-path", default=tls_default, metavar="FILE",
                        help="the client certificate's private key (PEM)")


def service_url(text: str) -> str:
    """A ``--service-url`` (or ``$MAGNETAR_SERVICE_URL``): the web service's; a ``pulsar://`` one is
    refused saying which URL to give instead."""
    scheme = text.partition("://")[0].lower() if "://" in text else ""
    if scheme in ("http", "https"):
        return text
    if scheme in ("pulsar", "pulsar+ssl"):
        raise argparse.ArgumentTypeError(
            f"{text} is Pulsar's binary protocol, for Pulsar's own clients; the magnetar commands speak HTTP: give "
            f"the broker's web service URL, such as {DEFAULT_SERVICE_URL} (--service-url or ${ENV_SERVICE_URL})")
    raise argparse.ArgumentTypeError(f"{text!r} is not a URL of the broker's web service: give http://HOST:PORT or "
                                     "https://HOST:PORT")


SUBSCRIPTION_TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")


def subscription_type(text: str) -> str:
    """A subscription type in any case (``shared``, ``KEY_SHARED``), as REST and WebSocket accept it."""
    for name in SUBSCRIPTION_TYPES:
        if text.lower() == name.lower():
            return name
    raise argparse.ArgumentTypeError(f"unknown subscription type {text!r}: use one of {', '.join(SUBSCRIPTION_TYPES)} "
                                     "(any case)")


def add_subscription_type(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    parser.add_argument("-t", "--subscription-type", default="Exclusive", type=subscription_type,
                        metavar="{" + ",".join(SUBSCRIPTION_TYPES) + "}", help=help_text)


def connection_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    add_connection_options(parent, top_level=False)
    return parent


def client_of(args: argparse.Namespace) -> Client:
    return Client(args.service_url, args.token or None, **tls_options(args))


class TlsOptions(TypedDict):
    tls_trust_certs_file_path: str | None
    tls_certificate_file_path: str | None
    tls_private_key_file_path: str | None


def tls_options(args: argparse.Namespace) -> TlsOptions:
    """The client's TLS keyword arguments from the command line."""
    return TlsOptions(tls_trust_certs_file_path=args.tls_trust_certs_file_path,
                      tls_certificate_file_path=args.tls_certificate_file_path,
                      tls_private_key_file_path=args.tls_private_key_file_path)


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


