"""The client's retry-letter producers: made once per topic, whatever the concurrency.

Role: unit test of ``RetryLetter`` above the producer factory (the broker side is tested in
``tests/integration/test_client_retry.py`` against a real ``magnetar standalone``).

Checks: two first reconsumes at once, while the producer is still being made, share one
producer (the second used to make its own, which was never closed); ``close`` closes it.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from consumers.client._producer import AsyncProducer
from consumers.client._retry import RetryLetter, RetryLetterPolicy


class CountedProducer:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def test_concurrent_first_uses_make_one_producer() -> None:
    made: list[CountedProducer] = []

    async def make(topic: str) -> AsyncProducer:
        await asyncio.sleep(0.01)  # the first call is still making it when the second comes
        made.append(CountedProducer())
        return cast(AsyncProducer, made[-1])

    async def run() -> list[Any]:
        policy = RetryLetterPolicy.of("persistent://t/ns/x", "sub", retry_letter_topic=None, dead_letter_topic=None,
                                      max_redeliver_count=None)
        letters = RetryLetter(policy, make)
        got = await asyncio.gather(letters._producer(policy.retry_letter_topic),
                                   letters._producer(policy.retry_letter_topic))
        await letters.close()
        return list(got)

    got = asyncio.run(run())
    assert len(made) == 1 and got[0] is got[1] is made[0]
    assert made[0].closed
