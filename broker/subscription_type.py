"""The four subscription types and how a transport names one.

Role: the type a subscription was opened with decides its dispatcher (``broker/subscription.py``
makes one per type: ``broker/dispatch_single_active.py`` for Exclusive and Failover,
``broker/dispatch_shared.py`` for Shared, ``broker/dispatch_key_shared.py`` for Key_Shared), as
Pulsar's ``SubscriptionType``. Invariant: a name parses case-insensitively, and an unknown one
is a clear ``InvalidRequest``, never a default.
"""

from __future__ import annotations

from enum import StrEnum

from broker.errors import InvalidRequest


class SubscriptionType(StrEnum):
    EXCLUSIVE = "Exclusive"
    FAILOVER = "Failover"
    SHARED = "Shared"
    KEY_SHARED = "Key_Shared"

    @classmethod
    def parse(cls, value: str) -> SubscriptionType:
        for member in cls:
            if member.value.lower() == value.lower():
                return member
        raise InvalidRequest(f"unknown subscription type {value!r}: use Exclusive, Failover, Shared or Key_Shared")
