"""What a topic lookup answers: the broker that serves a topic, for any transport.

Role: a value on the broker's face. ``NamespaceService.lookup(topic)`` returns a ``LookupResult``:
the owner's broker id and addresses and whether it is this broker. HTTP turns it into a 307 or
the JSON of ``/lookup/v2/topic/...``; the binary protocol's LOOKUP into a Connect or Redirect
answer. A standalone broker is its own owner (``local`` always true, addresses empty: the
transport knows how it was reached).

A broker configured with Pulsar's ``advertisedListeners`` is known by several names at once
(``AdvertisedListener``): its address carries them all, so that any broker answers a client
that names a listener with the owner's URLs of that listener, as Pulsar's ownership data does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdvertisedListener:
    """One of Pulsar's ``advertisedListeners``: the binary-protocol URLs of a broker under one
    name (a client's ``listenerName`` picks it)."""

    name: str
    service_url: str = ""
    """``pulsar://host:port`` ('' when the listener has none)."""
    service_url_tls: str = ""
    """``pulsar+ssl://host:port`` ('' when the listener has none)."""


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
    listeners: tuple[AdvertisedListener, ...] = ()
    """Its ``advertisedListeners`` (none: it is known by the URLs above only)."""

    def listener(self, name: str) -> AdvertisedListener | None:
        return next((listener for listener in self.listeners if listener.name == name), None)

    def listeners_json(self) -> dict[str, dict[str, str | None]]:
        """The listeners as Pulsar's ownership data and load reports hold them (``advertisedListeners``)."""
        return {listener.name: {"brokerServiceUrl": listener.service_url or None,
                                "brokerServiceUrlTls": listener.service_url_tls or None}
                for listener in self.listeners}


def listeners_of(obj: dict[str, dict[str, str | None]] | None) -> tuple[AdvertisedListener, ...]:
    """The listeners of :meth:`BrokerAddress.listeners_json` (none: a broker without them)."""
    return tuple(AdvertisedListener(str(name), str(urls.get("brokerServiceUrl") or ""),
                                    str(urls.get("brokerServiceUrlTls") or ""))
                 for name, urls in (obj or {}).items())


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
