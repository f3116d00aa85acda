"""Types of the native batch decoder (``_batch_decoder.c``)."""

from broker.entry_format.model import DecodedMessage

def decode_batch(buf: bytes, count: int, first_offset: int | None, base_sequence_id: int,
                 /) -> list[DecodedMessage] | None: ...
def set_message_type(message_type: type, /) -> None: ...
