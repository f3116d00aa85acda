"""Topic patterns: which topics of a namespace a ``topicsPattern`` consumer follows.

Role: a pattern consumer (WebSocket ``/ws/v3/consumer/{sub}?topicsPattern=``, the Python client)
names a namespace and a regular expression over full topic names; every topic of the namespace
whose name matches, now or later, joins the consumer. The expression is matched with RE2
(``google-re2``), which runs in time linear in the name's length: a pattern like ``(a+)+b``
cannot stall the broker, as Python's backtracking ``re`` does on a name of a few dozen
characters. RE2 has no backreferences or lookaround; a pattern using them is refused as
invalid.

Invariant: a pattern longer than ``PATTERN_BYTES_MAX`` bytes or one RE2 cannot compile is an
``InvalidRequest`` before anything subscribes.
"""

from __future__ import annotations

import re2

from broker.errors import InvalidRequest
from broker.limits import PATTERN_BYTES_MAX

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a bad pattern is the client's error, answered, not logged by RE2


class TopicPattern:
    def __init__(self, namespace: str, pattern: str, *, bytes_max: int = PATTERN_BYTES_MAX) -> None:
        if len(pattern.encode()) > bytes_max:
            raise InvalidRequest(f"topicsPattern is longer than {bytes_max} bytes")
        try:
            self._regex = re2.compile(pattern, _OPTIONS)
        except re2.error as exc:
            detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
            raise InvalidRequest(f"invalid topicsPattern {pattern!r}: {detail}") from None
        self.namespace = namespace
        self.pattern = pattern

    def matches(self, namespace: str, full_name: str) -> bool:
        return namespace == self.namespace and self._regex.fullmatch(full_name) is not None
