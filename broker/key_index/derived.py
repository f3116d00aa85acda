"""Derived streams: the key index's streams of event types and tags (dynamic consistency boundaries).

Role: a DCB event (``broker/dcb.py``) is a message whose properties name its type
(``dcb-type``) and its tags (``dcb-tags``, a JSON list of strings). Besides its key's stream,
the key index numbers such a message in one *derived stream* per type and per tag, so a read
or an append condition that names a tag reads that tag's rows, never the partition. This
module says which derived streams a message belongs to; the index stores their rows as it
stores a key's (``partition.py``, ``segment.py``).

Invariants: a derived stream's name is bytes starting with ``0xFF``, a byte no UTF-8 encoding
produces (not even of a lone surrogate), so it never names a key's stream; the same function
of a message's properties decides its derived streams on append and when entries are read
again on open (the index stays a function of the log); what does not follow the rule (a type
or tag too long, tags that are not a JSON list of strings, more tags than
``DCB_TAGS_PER_EVENT_MAX``) is left out the same way on both paths, and the DCB edge refuses it
before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from broker.limits import DCB_TAG_BYTES_MAX, DCB_TAGS_PER_EVENT_MAX, DCB_TYPE_BYTES_MAX

TYPE_PROPERTY = "dcb-type"
TAGS_PROPERTY = "dcb-tags"
MARK = TYPE_PROPERTY.encode()
"""Bytes every entry holding a DCB event contains (uncompressed): a cheap first test."""
_TYPE_PREFIX = b"\xfft:"
_TAG_PREFIX = b"\xffg:"
NO_KEYS: frozenset[bytes] = frozenset()

IndexKey = str | bytes
"""A stream's name in the key index: a key (str) or a derived stream (bytes, ``0xFF`` first)."""


def type_key(event_type: str) -> bytes:
    return _TYPE_PREFIX + event_type.encode(errors="surrogatepass")


def tag_key(tag: str) -> bytes:
    return _TAG_PREFIX + tag.encode(errors="surrogatepass")


def derived_keys(properties: Mapping[str, str]) -> frozenset[bytes]:
    """The derived streams of a message with ``properties`` (empty: it is no DCB event)."""
    event_type = properties.get(TYPE_PROPERTY)
    if event_type is None or len(event_type.encode(errors="surrogatepass")) > DCB_TYPE_BYTES_MAX:
        return NO_KEYS
    keys = {type_key(event_type)}
    tags = tags_of(properties.get(TAGS_PROPERTY))
    if tags is not None:
        keys.update(tag_key(tag) for tag in tags)
    return frozenset(keys)


def tags_of(text: str | None) -> list[str] | None:
    """The tags a ``dcb-tags`` property names, or None when it breaks the rule (no tags kept)."""
    if not text:
        return []
    try:
        tags = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    if not isinstance(tags, list) or len(tags) > DCB_TAGS_PER_EVENT_MAX:
        return None
    if not all(isinstance(t, str) and _utf8_bytes(t) <= DCB_TAG_BYTES_MAX for t in tags):
        return None
    return tags


def _utf8_bytes(text: str) -> int:
    """The tag's length in UTF-8; past any bound for a text UTF-8 cannot encode (a lone
    surrogate, which JSON's escapes can carry), so such a tag breaks the rule."""
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        return DCB_TAG_BYTES_MAX + 1


def keys_of_messages(properties: Sequence[Mapping[str, str]]) -> tuple[frozenset[bytes], ...]:
    """Each message's derived streams; empty when no message is a DCB event (the common case
    costs one dictionary lookup a message)."""
    found = [derived_keys(p) if p and TYPE_PROPERTY in p else NO_KEYS for p in properties]
    return tuple(found) if any(found) else ()


class DcbItem:
    """One query item as derived streams: an event matches when its type is one of ``types``
    (any type when there are none) and it carries every one of ``tags``."""

    __slots__ = ("tags", "types")

    def __init__(self, types: frozenset[bytes], tags: frozenset[bytes]) -> None:
        self.types = types
        self.tags = tags

    @property
    def matches_all(self) -> bool:
        return not self.types and not self.tags

    def matches(self, keys: frozenset[bytes]) -> bool:
        """Whether an event in the derived streams ``keys`` matches."""
        return (not self.types or not self.types.isdisjoint(keys)) and self.tags <= keys


class DcbCondition:
    """An append's condition, checked under the offset lock: no event matching any of ``items``
    at an offset ``>= after`` (DCB's "after position P" is offset ``P - 1``'s successor). The
    segments were checked before the lock (``segments`` is what was checked); the tail is
    checked under it."""

    __slots__ = ("after", "items", "segments")

    def __init__(self, items: Sequence[DcbItem], after: int, segments: object) -> None:
        self.items = tuple(items)
        self.after = after
        self.segments = segments
