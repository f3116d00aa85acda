"""One WebSocket connection's wire, sans I/O: bytes in, the handshake request and text frames out.

Role: websockets' own sans-I/O ``ServerProtocol`` parses the opening handshake, answers it, and
keeps the connection's state (open, closing, closed) and every frame that is not a whole masked
text frame: ping (it queues the pong), pong, close (it echoes it), binary, fragments. In front of
it, ``WebSocketWire`` splits the frames a Pulsar client sends nearly always itself (whole,
masked, uncompressed text frames, one per message or acknowledgement): several per read,
unmasked with websockets' C ``apply_mask``, at a fraction of what the websockets parser costs per
frame. ``text_frames`` writes the server's text frames the same way. The wire never touches a
socket or an event loop: ``server.py`` feeds it the bytes it reads and writes the bytes it
returns (``output``), so it is tested with plain byte strings.

Invariants:
- Text frames come out in the order they arrived, whichever reader split them; a whole frame of
  another kind is handed to websockets at a frame boundary, so its parser and state stay exactly
  as if it had read everything. Anything the fast reader does not take (a fragment, reserved
  bits, an unmasked frame, a frame over the bound) hands that frame and everything after it to
  the websockets parser for the rest of the connection, which answers it as it always does
  (1002 for a protocol error). A binary message is read as UTF-8 text (``"\\x00"`` when it is
  not: answered as a bad frame).
- A frame larger than ``frame_bytes_max`` (``webSocketMaxTextFrameSize``) is never read,
  whatever size its header declares: the wire answers it with a close frame carrying 1009 and the
  reason, logged once at warning, and drops the rest of the peer's data (``failed``: the adapter
  half-closes and drains instead of closing with unread data, which makes the kernel answer with
  a reset that can overtake the close frame). A text frame that is not UTF-8 closes with 1007
  (RFC 6455 7.4.1), logged once at warning, without a traceback: a client's mistake.
- At most one incomplete frame (bounded by ``frame_bytes_max``) waits for the rest of its bytes,
  and one fragmented message (bounded the same way, by websockets); the handshake's head is at
  most ``head_bytes_max`` bytes. Per-message deflate is never negotiated.
- After the close handshake started (by either side) no text frame comes out.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence

from websockets.datastructures import Headers
from websockets.exceptions import PayloadTooBig
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import SEND_EOF, State
from websockets.server import ServerProtocol

try:
    from websockets.speedups import apply_mask
except ImportError:  # websockets built without its C speedups
    from websockets.utils import apply_mask

log = logging.getLogger(__name__)
_WEBSOCKETS_LOG = logging.getLogger(f"{__name__}.websockets")
"""websockets' own per-connection records ("connection open", "connection closed"): warnings only."""
_WEBSOCKETS_LOG.setLevel(logging.WARNING)

_U16 = struct.Struct(">H").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_U16_PACK = struct.Struct(">H").pack
_U64_PACK = struct.Struct(">Q").pack
_TEXT_SHORT = [bytes((0x81, size)) for size in range(126)]
"""Unmasked server text frame headers (FIN, opcode 1) by payload size below 126."""
_TEXT_MEDIUM = b"\x81\x7e"
_TEXT_LONG = b"\x81\x7f"
_HEAD_END = b"\r\n\r\n"
NOT_TEXT = "\x00"
"""What a binary message that is not UTF-8 reads as: not JSON, so answered as a bad frame."""


class HandshakeRefused(Exception):
    """The handshake's head is not a request websockets can answer (too long, malformed)."""


def text_frames(texts: Sequence[str], parts: list[bytes]) -> int:
    """Append the unmasked text frames of ``texts`` to ``parts`` (header and payload apart);
    the payload bytes appended."""
    size_total = 0
    for text in texts:
        payload = text.encode()
        size = len(payload)
        if size < 126:
            parts.append(_TEXT_SHORT[size])
        elif size < 65536:
            parts.append(_TEXT_MEDIUM + _U16_PACK(size))
        else:
            parts.append(_TEXT_LONG + _U64_PACK(size))
        parts.append(payload)
        size_total += size
    return size_total


class WebSocketWire:
    """The handshake, then frames in (``receive``), for one connection; what to send back
    (``output``); closing (``close``) and keep-alive pings (``ping``)."""

    def __init__(self, frame_bytes_max: int, head_bytes_max: int) -> None:
        self._conn = ServerProtocol(max_size=frame_bytes_max, logger=_WEBSOCKETS_LOG)
        self._frame_bytes_max = frame_bytes_max
        self._head_bytes_max = head_bytes_max
        self._head = b""
        self._fast = False
        """Whole text frames are split here (open, at a frame boundary); else websockets parses."""
        self._partial = b""
        self._fragments: list[bytes] = []
        self._fragment_opcode: Opcode | None = None
        self._out: list[bytes] = []
        self._reported = False
        self.label = "?"
        """The connection as the log names it: its path (never its query: a ``?token=``) and peer."""
        self.pongs: list[bytes] = []
        """Payloads of the pongs received since the adapter last looked."""

    # --- the opening handshake ---------------------------------------------------------------
    def receive_head(self, data: bytes) -> Request | None:
        """The handshake request once its head is complete (None: not yet); bytes after the
        head (frames a client sent before the answer) are read once the connection is open."""
        head = self._head + data
        end = head.find(_HEAD_END)
        if end < 0:
            if len(head) > self._head_bytes_max:
                raise HandshakeRefused(f"the handshake's head exceeds {self._head_bytes_max} bytes")
            self._head = head
            return None
        self._head = b""
        end += len(_HEAD_END)
        self._partial = head[end:]
        self._conn.receive_data(head[:end])
        request = next((e for e in self._conn.events_received() if isinstance(e, Request)), None)
        if request is None:
            self._conn.data_to_send()  # websockets' own answer: the adapter answers instead
            raise HandshakeRefused("the handshake is not a valid HTTP request")
        return request

    def accept(self, request: Request) -> Response:
        """websockets' answer to ``request``: 101, or its refusal of a bad handshake."""
        return self._conn.accept(request)

    def respond(self, response: Response) -> bytes:
        """The bytes of ``response``; after a 101 the connection is open, after anything else it
        ends (the adapter closes it once written)."""
        self._conn.send_response(response)
        self._fast = response.status_code == 101
        return b"".join(self._conn.data_to_send())

    @staticmethod
    def refusal(status: int, phrase: str, body: bytes, headers: dict[str, str] | None = None) -> Response:
        """An HTTP answer that refuses the upgrade: a JSON body, the connection closed after it."""
        fields = Headers({"Content-Type": "application/json", "Content-Length": str(len(body)),
                          "Connection": "close"})
        for name, value in (headers or {}).items():
            fields[name] = value
        return Response(status, phrase, fields, body)

    # --- an open connection: bytes in -------------------------------------------------------------
    @property
    def open(self) -> bool:
        return self._conn.state is State.OPEN

    @property
    def failed(self) -> bool:
        """The wire closed the connection for a fault of the peer's (1002, 1007, 1009): what the
        peer still sends is dropped until it closes."""
        return self._conn.eof_sent and self._conn.close_rcvd is None

    @property
    def close_received(self) -> bool:
        return self._conn.close_rcvd is not None

    @property
    def close_sent(self) -> tuple[int, str] | None:
        close = self._conn.close_sent
        return None if close is None else (close.code, close.reason)

    @property
    def has_output(self) -> bool:
        return bool(self._out)

    def output(self) -> list[bytes]:
        """Bytes to send (pongs, close frames), in order; ``SEND_EOF`` (``b""``) last when the
        wire wants the connection closed after them."""
        out, self._out = self._out, []
        return out

    def receive(self, data: bytes) -> list[str]:
        """The text frames ``data`` completes, in order (after the close handshake started: none)."""
        if self._partial:
            data, self._partial = self._partial + data, b""
        if self._fast:  # open, at a frame boundary (every way out of either turns it off)
            return self._read_frames(data)
        return self._parse(data)

    def _read_frames(self, buf: bytes) -> list[str]:
        end, pos = len(buf), 0
        limit = self._frame_bytes_max
        texts: list[str] = []
        while end - pos >= 6:
            first, second = buf[pos], buf[pos + 1]
            length, head = second & 0x7F, pos + 2
            if length == 126:
                length, head = _U16(buf, head)[0], head + 2
            elif length == 127:
                if end - head < 8:
                    break
                length, head = _U64(buf, head)[0], head + 8
            if first & 0xF0 != 0x80 or not second & 0x80 or length > limit:
                self._fast = False  # a fragment, RSV bits, unmasked, too large: websockets' from here on
                return texts + self._parse(buf[pos:])
            start = head + 4
            if end - start < length:
                break
            if first != 0x81:  # a whole frame of another kind: websockets', at a boundary
                texts += self._parse(buf[pos : start + length])
                pos = start + length
                if not self.open:
                    self._fast = False
                    return texts + self._parse(buf[pos:])
                continue
            try:
                texts.append(apply_mask(buf[start : start + length], buf[head:start]).decode())
            except UnicodeDecodeError:
                self._close_invalid_text()
                return texts
            pos = start + length
        if pos < end:
            self._partial = buf[pos:]
        return texts

    def _parse(self, data: bytes) -> list[str]:
        """``data`` through the websockets parser: its events as text frames, pongs and output."""
        conn = self._conn
        closing = not self.open  # the close handshake started before this read: no text frame comes out
        if data:
            conn.receive_data(data)
        texts: list[str] = []
        for event in conn.events_received():
            if not isinstance(event, Frame):
                continue
            opcode = event.opcode
            if opcode is Opcode.CLOSE:
                closing = True  # frames read before it in this read are the peer's last words
            elif opcode is Opcode.PONG:
                self.pongs.append(bytes(event.data))
            elif opcode is Opcode.TEXT or opcode is Opcode.BINARY or opcode is Opcode.CONT:
                message = self._message(event)
                if message is None or closing:
                    continue
                text = self._text_of(message)
                if text is None:
                    break
                texts.append(text)
        self._out += conn.data_to_send()
        if conn.parser_exc is not None:
            self._report(conn.parser_exc)
        return texts

    def _message(self, frame: Frame) -> bytes | None:
        """A data frame's message once complete (fragments joined); websockets bounds a fragmented
        message's size by ``frame_bytes_max`` and checks the fragments' order."""
        if frame.opcode is not Opcode.CONT:
            self._fragment_opcode = frame.opcode
            self._fragments = []
        self._fragments.append(bytes(frame.data))
        if not frame.fin:
            return None
        message = self._fragments[0] if len(self._fragments) == 1 else b"".join(self._fragments)
        self._fragments = []
        return message

    def _text_of(self, message: bytes) -> str | None:
        try:
            return message.decode()
        except UnicodeDecodeError:
            if self._fragment_opcode is Opcode.BINARY:
                return NOT_TEXT
            self._close_invalid_text()
            return None

    def _close_invalid_text(self) -> None:
        self._fast = False
        log.warning("WebSocket %s closed with 1007: a text frame is not UTF-8", self.label)
        self._reported = True
        if self.open:
            self._conn.fail(1007, "a text frame is not UTF-8")
        self._out += self._conn.data_to_send()

    def _report(self, error: Exception) -> None:
        """Log a parser failure once: a frame over the bound at warning, the rest at info."""
        if self._reported or isinstance(error, EOFError):
            return
        self._reported = True
        close = self._conn.close_sent
        code, reason = (close.code, close.reason) if close is not None else (1002, str(error))
        if isinstance(error, PayloadTooBig):
            log.warning("WebSocket %s closed with %d: %s (webSocketMaxTextFrameSize)", self.label, code, reason)
        else:
            log.info("WebSocket %s closed with %d: %s", self.label, code, reason)

    # --- frames out ------------------------------------------------------------------------------
    def close(self, code: int, reason: str) -> list[bytes]:
        """The close frame that starts the closing handshake (nothing once it started)."""
        if not self.open:
            return []
        self._fast = False
        self._conn.send_close(code, reason)
        return self._conn.data_to_send()

    def ping(self, payload: bytes) -> list[bytes]:
        if not self.open:
            return []
        self._conn.send_ping(payload)
        return self._conn.data_to_send()

    def fail(self, code: int, reason: str) -> list[bytes]:
        """Close at once without waiting for the peer (a keep-alive timeout): the close frame and
        ``SEND_EOF``."""
        self._fast = False
        if self.open:
            self._conn.fail(code, reason)
        out = self._conn.data_to_send()
        return out if SEND_EOF in out else [*out, SEND_EOF]
