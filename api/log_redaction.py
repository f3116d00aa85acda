"""Secrets never reach a log: tokens are cut out of every record the server writes.

Role: WebSocket clients (browsers above all) pass their token as ``?token=<JWT>``, and uvicorn's
access and connection logs print request targets with their query strings. ``TokenRedactor``
rewrites each record's message and arguments before any handler formats them: the value of a
``token`` query parameter and anything shaped like a JWT become ``***``.

Invariant: installed on the loggers that print request targets (uvicorn's access and error
loggers, which log their records themselves rather than through child loggers), so no request
target the server logs carries a token; Magnetar's own modules never log tokens or keys.
"""

from __future__ import annotations

import logging
import re

_TOKEN_PARAM = re.compile(r"(?i)(token=)[^&\s\"'#]+")
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*")
REDACTED = "***"
LOGGERS = ("uvicorn.access", "uvicorn.error")


def redact(text: str) -> str:
    return _JWT.sub(REDACTED, _TOKEN_PARAM.sub(rf"\g<1>{REDACTED}", text))


class TokenRedactor(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True


_REDACTOR = TokenRedactor()


def install() -> None:
    """Attach the redactor to every logger that may print a request target (idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _REDACTOR not in logger.filters:
            logger.addFilter(_REDACTOR)
