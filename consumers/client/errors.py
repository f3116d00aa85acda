"""The client's errors: one root, ``ClientError``, each carrying the server's ``code`` and ``message``.

Policy: a broker answer becomes an error with the broker's own ``code`` (``message_too_large``,
``forbidden``, ...) and ``message``; client-side conditions (timeouts, a closed connection) have
codes of their own. Timeouts are also ``TimeoutError``s, so ``except TimeoutError`` works.
``ConnectionClosed.by_client`` tells "closed by us" (``close()`` was called) from "broken from
outside" (the broker went away; the cause is chained).
"""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Root of every error the client raises."""

    code = "client_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class HttpError(ClientError):
    """The broker answered an HTTP request (or refused a WebSocket upgrade) with an error status;
    ``status`` is 0 when it could not be reached at all. ``details`` holds the answer's fields
    besides ``code`` and ``message`` (a trimmed stream's ``firstVersion``, say)."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.details = details or {}


class ConnectError(HttpError):
    """A producer, consumer or reader session could not be opened."""


class SendError(ClientError):
    """The broker refused one publish: ``send-error:<result_code>`` on the WebSocket API (Pulsar's
    codes: 3 bad JSON, 7 bad payload encoding, 8 broker failure) or a failed REST produce result."""

    def __init__(self, message: str, *, code: str, result_code: int) -> None:
        super().__init__(message, code=code)
        self.result_code = result_code


class KeyVersionMismatch(ClientError):
    """A conditional append was refused: a key's stream is not at the expected version, and
    nothing was written. ``current_versions`` says where each key's stream is."""

    code = "key_version_mismatch"

    def __init__(self, message: str, *, current_versions: dict[str, int]) -> None:
        super().__init__(message)
        self.current_versions = current_versions


class ConsumerError(ClientError):
    """The broker answered a consumer or reader command (ack, nack, unsubscribe) with an error."""


class SendTimeout(ClientError, TimeoutError):
    code = "send_timeout"


class ReceiveTimeout(ClientError, TimeoutError):
    code = "receive_timeout"


class ConnectionClosed(ClientError):
    """The session is over: nothing more can be sent or received on it."""

    code = "connection_closed"

    def __init__(self, message: str, *, by_client: bool) -> None:
        super().__init__(message)
        self.by_client = by_client
