"""uvicorn's request lines and WebSocket handshakes are logged without the ``?token=`` value."""

from __future__ import annotations

import logging
from pathlib import Path

from api import log_redaction
from api.app import create_app
from broker.service import BrokerService


def record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, msg, args, None)


def test_token_values_are_redacted_and_nothing_else_changes() -> None:
    handshake = record('%s - "WebSocket %s" [accepted]', "127.0.0.1:5000",
                       "/ws/v2/reader/persistent/public/default/t?messageId=latest&token=eyJ.secret.sig")
    access = record('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", "/healthz?token=abc&x=1", "1.1", 200)
    inline = record("GET /x?TOKEN=abc")
    for item in (handshake, access, inline):
        assert log_redaction.TOKEN_REDACTING_FILTER.filter(item) is True
    assert handshake.getMessage() == ('127.0.0.1:5000 - "WebSocket /ws/v2/reader/persistent/public/default/t'
                                      '?messageId=latest&token=<redacted>" [accepted]')
    assert access.getMessage() == '127.0.0.1:5000 - "GET /healthz?token=<redacted>&x=1 HTTP/1.1" 200'
    assert inline.getMessage() == "GET /x?TOKEN=<redacted>"
    untouched = record("GET /topics/x?tokens=3&mytoken=4")
    log_redaction.TOKEN_REDACTING_FILTER.filter(untouched)
    assert untouched.getMessage() == "GET /topics/x?tokens=3&mytoken=4"


def test_the_application_installs_the_filter_on_uvicorns_loggers(tmp_path: Path) -> None:
    create_app(BrokerService(str(tmp_path / "data")))
    create_app(BrokerService(str(tmp_path / "data")))
    for name in log_redaction.LOGGERS:
        filters = logging.getLogger(name).filters
        assert filters.count(log_redaction.TOKEN_REDACTING_FILTER) == 1
