"""Secrets never reach a log: tokens are cut out of every record uvicorn writes about a request.

Role: WebSocket clients (browsers and the web console's live tail above all) pass their token as
``?token=<JWT>`` because a browser cannot set headers on a WebSocket, and HTTP clients may too;
uvicorn logs each request line with its query string. ``TokenRedactingFilter`` rewrites those
records on uvicorn's access and error loggers, before any handler formats them: the value of a
``token`` query parameter, and anything else shaped like a JWT, reads ``<redacted>``. The
WebSocket edge (``api/ws/server.py``) logs each handshake's target through ``redact`` itself.

Invariant: nothing else in a record changes and no record is dropped; the filter is installed
once per logger however many applications are built.
"""

from __future__ import annotations

import logging
import re

_TOKEN_PARAMETER = re.compile(r"([?&]token=)[^&\s\"'#]*", re.IGNORECASE)
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*")
REDACTED = "<redacted>"
LOGGERS = ("uvicorn.access", "uvicorn.error")


def redact(text: str) -> str:
    return _JWT.sub(REDACTED, _TOKEN_PARAMETER.sub(rf"\g<1>{REDACTED}", text))


class TokenRedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True


TOKEN_REDACTING_FILTER = TokenRedactingFilter()


def install() -> None:
    """Attach the filter to uvicorn's loggers (idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if TOKEN_REDACTING_FILTER not in logger.filters:
            logger.addFilter(TOKEN_REDACTING_FILTER)
