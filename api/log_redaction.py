"""Tokens never reach the logs: uvicorn's request lines lose the value of ``?token=``.

Role: WebSocket clients (the web console's live tail among them) authenticate with
``?token=<jwt>`` because browsers cannot set headers on a WebSocket; uvicorn logs each request
line and each WebSocket handshake with its query string. ``TokenRedactingFilter`` rewrites those
records, on uvicorn's access and error loggers, before any handler formats them.

Invariant: in every record that passes through the filter, a ``token`` query parameter's value
reads ``<redacted>``; nothing else in the record changes and no record is dropped.
"""

from __future__ import annotations

import logging
import re

_TOKEN_PARAMETER = re.compile(r"([?&]token=)[^&\s\"']*", re.IGNORECASE)
REDACTED = "<redacted>"
LOGGERS = ("uvicorn.access", "uvicorn.error")


def redact(text: str) -> str:
    return _TOKEN_PARAMETER.sub(rf"\g<1>{REDACTED}", text)


class TokenRedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in record.args)
        return True


TOKEN_REDACTING_FILTER = TokenRedactingFilter()


def install() -> None:
    """Attach the filter to uvicorn's loggers (idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if TOKEN_REDACTING_FILTER not in logger.filters:
            logger.addFilter(TOKEN_REDACTING_FILTER)
