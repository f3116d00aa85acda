"""WebSocket frames in Pulsar's JSON shapes: parsing client frames, writing result and message frames.

Role: the text of the WebSocket API. Client frames are JSON objects; a delivered message is
``{messageId, payload (base64), properties, publishTime (ISO-8601), redeliveryCount, offset,
key, eventTime}``, plus Pulsar's ``encryptionContext`` for an end-to-end encrypted entry
(``EncryptionContext.as_json``; its payload is the stored ciphertext); a producer's result is
``{result: "ok", messageId, context, offset}`` or ``{result: "send-error:<n>", errorMsg,
errorCode, context}`` with Pulsar's codes (3 bad JSON, 7 bad payload encoding or event time, 8
broker refusal); consumers and readers answer a bad frame ``{result: "error:<n>", errorMsg}``.
Message frames are written directly (ids, base64 and times need no escaping; only keys,
properties and the encryption context go through JSON).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson

from api.limits import WS_ERROR_TEXT_CHARS_MAX
from broker import Delivery, InvalidRequest, iso_time

# Pulsar's WebSocket result codes
JSON_DESERIALIZE_ERROR = 3
PAYLOAD_ENCODING_ERROR = 7
UNKNOWN_ERROR = 8
_PAYLOAD_ENCODING_FIELDS = frozenset({"payload", "eventTime"})


class FrameError(Exception):
    """A client frame this session cannot use; answered with an error frame, nothing written."""

    def __init__(self, result_code: int, message: str) -> None:
        super().__init__(message)
        self.result_code = result_code


def frame_error(exc: InvalidRequest) -> FrameError:
    """A broker refusal of a frame's field as the frame error Pulsar's codes give it (7 for the
    payload and the event time, 3 for everything else)."""
    code = PAYLOAD_ENCODING_ERROR if exc.field in _PAYLOAD_ENCODING_FIELDS else JSON_DESERIALIZE_ERROR
    return FrameError(code, str(exc))


def message_frame(delivery: Delivery, message_id_b64: str | None = None) -> str:
    """A delivered message as Pulsar's WebSocket frame (plus its ``offset``), written directly:
    ids, base64 and times need no escaping; only the key and properties go through JSON."""
    message = delivery.message
    extra = ""
    if message.key is not None:
        extra += f',"key":{json.dumps(message.key)}'
    if message.event_time_ms is not None:
        extra += f',"eventTime":"{iso_time(message.event_time_ms)}"'
    if delivery.key_version is not None:
        extra += f',"keyVersion":{delivery.key_version}'
    if delivery.encryption is not None:
        extra += f',"encryptionContext":{json_text(delivery.encryption.as_json())}'
    properties = json.dumps(message.properties, separators=(",", ":")) if message.properties else "{}"
    message_id = message_id_b64 or delivery.message_id.to_base64()
    return (f'{{"messageId":"{message_id}",'
            f'"payload":"{base64.b64encode(message.payload).decode("ascii")}",'
            f'"properties":{properties},"publishTime":"{iso_time(delivery.publish_time_ms)}",'
            f'"redeliveryCount":{delivery.redelivery_count},"offset":{delivery.offset}{extra}}}')


def parse_frame(text: str) -> dict[str, Any]:
    try:
        frame = orjson.loads(text)
    except orjson.JSONDecodeError:  # also what orjson does not take: integers past 64 bits, NaN
        try:
            frame = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise FrameError(JSON_DESERIALIZE_ERROR, f"frame is not valid JSON: {exc}") from None
    if not isinstance(frame, dict):
        raise FrameError(JSON_DESERIALIZE_ERROR, "frame must be a JSON object")
    return frame


def short(text: str) -> str:
    return text if len(text) <= WS_ERROR_TEXT_CHARS_MAX else text[:WS_ERROR_TEXT_CHARS_MAX] + "…"


def frame_text(data: dict[str, Any]) -> str:
    return json_text(data)


def json_text(value: Any) -> str:
    """``value`` as compact JSON: orjson, or the standard library for what orjson does not write
    (integers past 64 bits)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"))


def send_error(context: Any, result_code: int, error_code: str, message: str, **extra: Any) -> str:
    """A producer's ``send-error`` frame; ``extra`` fields follow (``currentKeyVersion``)."""
    return frame_text({"result": f"send-error:{result_code}", "errorMsg": short(f"{error_code}: {message}"),
                       "errorCode": error_code, "context": context, **extra})

