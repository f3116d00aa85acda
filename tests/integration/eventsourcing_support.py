"""A real ``magnetar standalone`` per test class for the ``eventsourcing`` library's own test
cases, and recorders over it, each on a topic of its own (the library's tests expect a fresh,
empty store from every ``create_recorder``)."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from typing import Any, ClassVar

from consumers.client import Client
from tests.standalone import standalone_process


class MagnetarBroker:
    """Mixin for a ``unittest.TestCase``: ``cls.url`` and ``cls.client`` of a broker that lives
    as long as the class."""

    url: ClassVar[str]
    client: ClassVar[Client]
    _stack: ClassVar[contextlib.ExitStack]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()  # type: ignore[misc]
        cls._stack = contextlib.ExitStack()
        data_dir = cls._stack.enter_context(tempfile.TemporaryDirectory(prefix="magnetar-es-"))
        cls.url, _ = cls._stack.enter_context(standalone_process(data_dir))
        cls.client = cls._stack.enter_context(Client(cls.url))

    @classmethod
    def tearDownClass(cls) -> None:
        cls._stack.close()
        super().tearDownClass()  # type: ignore[misc]

    @classmethod
    def new_topic(cls, purpose: str = "events") -> str:
        return f"persistent://public/default/es-{purpose}-{uuid.uuid4().hex[:12]}"

    def recorder(self, recorder_class: type[Any]) -> Any:
        return recorder_class(self.client, self.new_topic())
