"""``magnetar tokens``: secret keys, key pairs and tokens, like ``pulsar tokens``; and the one
reader of key files that the broker uses too.

Role: the token tool. ``create_token`` signs a token for a role the way the broker verifies it
(HS256 with a secret key, RS256 with a private key); ``read_key`` reads a key given as a path,
``file:///path`` or ``data:;base64,…`` exactly as stored (a random secret key may end in a
whitespace byte, and it is part of the key). The broker reads its configured keys with the same
function, so the tool and the broker always agree on a key.
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import time
from pathlib import Path
from typing import Any

import jwt

SECRET_KEY_BYTES = 32  # HS256
RSA_KEY_BITS = 2048


def read_key(reference: str) -> bytes:
    """Key bytes from ``file:///path``, ``data:;base64,<b64>`` or a plain path. Raises
    ``ValueError`` (bad base64) or ``OSError`` (unreadable file)."""
    if reference.startswith("data:"):
        _, _, encoded = reference.partition(",")
        return base64.b64decode(encoded, validate=True)
    return Path(reference.removeprefix("file://")).read_bytes()


def create_token(subject: str, *, secret_key: bytes | None = None, private_key: bytes | None = None,
                 expires_in_s: int | None = None) -> str:
    """A token for ``subject`` (its ``sub`` claim), signed with one of the keys."""
    claims: dict[str, Any] = {"sub": subject}
    if expires_in_s is not None:
        claims["exp"] = int(time.time()) + expires_in_s
    if secret_key is not None:
        return jwt.encode(claims, secret_key, algorithm="HS256")
    if private_key is not None:
        return jwt.encode(claims, private_key, algorithm="RS256")
    raise ValueError("create_token needs a secret_key or a private_key")


def add_token_commands(commands: Any) -> None:
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
    if args.expiry_time_s is not None and args.expiry_time_s <= 0:
        raise ValueError("--expiry-time-s must be positive")
    secret = read_key(args.secret_key) if args.secret_key else None
    private = read_key(args.private_key) if args.private_key else None
    print(create_token(args.subject, secret_key=secret, private_key=private, expires_in_s=args.expiry_time_s))
    return 0
