"""What a topic lookup answers: the broker that serves a topic, for any transport.

Role: a value on the broker's face. ``NamespaceService.lookup(topic)`` returns a ``LookupResult``:
the owner's broker id and addresses and whether it is this broker. HTTP turns it into a 307 or
the JSON of ``/lookup/v2/topic/...``; the binary protocol's LOOKUP into a Connect or Redirect
answer. A standalone broker is its own owner (``local`` always true, addresses empty: the
transport knows how it was reached).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BrokerAddress:
    broker_id: str
    """``host:port`` of the web service: the broker's name in ZooKeeper ('' standalone)."""
    web_service_url: str
    """``http://host:port``."""
    pulsar_service_url: str = ""
    """``pulsar://host:port`` when the broker speaks the binary protocol, else ''."""
    pulsar_service_url_tls: str = ""
    """``pulsar+ssl://host:port`` when it also listens with TLS, else ''."""


@dataclass(frozen=True)
class LookupResult:
    """Where a topic is served: ``local`` when this broker owns the topic's bundle and serves it."""

    topic: str
    bundle: str
    """``tenant/ns/0xLLLLLLLL_0xUUUUUUUU`` ('' standalone)."""
    owner: BrokerAddress
    local: bool
    assigned: bool = False
    """``owner`` was just chosen to take the unowned bundle and does not own it yet: a client
    must ask it (it takes the bundle on that lookup), as Pulsar's Redirect says."""
