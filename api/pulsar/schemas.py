"""Placeholder replaced below."""
from __future__ import annotations

from typing import Any


class SchemaRegistry:
    def __init__(self, service: Any) -> None:
        self.service = service

    def for_producer(self, topic: Any, schema: Any) -> bytes | None:
        return None

    def for_consumer(self, topic: Any, schema: Any) -> None:
        return None

    def get(self, topic: Any, version: Any) -> tuple[Any, Any]:
        return None, None
