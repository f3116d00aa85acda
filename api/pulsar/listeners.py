"""Advertised listeners: the names under which a broker gives clients its binary-protocol URLs.

Role: Pulsar's ``advertisedListeners`` and ``internalListenerName`` (PIP-61). A broker reachable
from several networks advertises one URL per network under a name,
``advertisedListeners=internal:pulsar://10.0.0.5:6650,external:pulsar+ssl://broker.example.com:6651``;
a client names the one it can reach (``pulsar.Client(url, listener_name="external")``, sent as
``CommandLookupTopic.advertised_listener_name``, or HTTP's ``listenerName`` query parameter /
``X-Pulsar-ListenerName`` header) and every lookup answers that listener's URLs, of whichever
broker owns the topic. A lookup without a name answers the internal listener's URLs.
:func:`parse_advertised_listeners` reads the two keys with the rules of Pulsar's
``MultipleListenerValidator``; :func:`named_listener` picks one for a lookup.

Invariants: every listener has at most one URL per scheme (``pulsar``, ``pulsar+ssl``, and the
``http``/``https`` URLs Pulsar also accepts, which Magnetar's lookups do not use); two listeners
never share a ``host:port``; the internal listener is one of them (the first when
``internalListenerName`` is blank). The broker binds ``brokerServicePort`` /
``brokerServicePortTls`` only: the advertised URLs are what clients are told, as in Pulsar
without ``bindAddresses``. A lookup naming a listener the owner does not have fails with
Pulsar's error and words (ServiceNotReady, "the broker do not have NAME listener", which
Pulsar's clients recognise).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from api.limits import ADVERTISED_LISTENER_URLS_COUNT_MAX, LISTENER_NAME_CHARS_MAX
from broker import AdvertisedListener, BrokerAddress, ServiceUnitNotReady

SCHEMES = ("pulsar", "pulsar+ssl", "http", "https")


def parse_advertised_listeners(text: str, internal_name: str) -> tuple[tuple[AdvertisedListener, ...], str]:
    """(listeners, internal listener's name) of ``advertisedListeners`` and
    ``internalListenerName``; ``ValueError`` with a one-line reason when they break a rule."""
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    if len(entries) > ADVERTISED_LISTENER_URLS_COUNT_MAX:
        raise ValueError(f"advertisedListeners: at most {ADVERTISED_LISTENER_URLS_COUNT_MAX} URLs, not {len(entries)}")
    urls: dict[str, dict[str, str]] = {}
    owners: dict[str, str] = {}
    for entry in entries:
        name, scheme, url, host_port = _entry(entry)
        by_scheme = urls.setdefault(name, {})
        if scheme in by_scheme:
            raise ValueError(f"advertisedListeners: listener {name!r} has two {scheme}:// URLs")
        if owners.setdefault(host_port, name) != name:
            raise ValueError(f"advertisedListeners: {host_port} is given to two listeners, "
                             f"{owners[host_port]!r} and {name!r}")
        by_scheme[scheme] = url
    internal = internal_name.strip() or next(iter(urls), "")
    if urls and internal not in urls:
        raise ValueError(f"internalListenerName {internal!r} is not one of advertisedListeners' names "
                         f"({', '.join(urls)})")
    listeners = tuple(AdvertisedListener(name, by_scheme.get("pulsar", ""), by_scheme.get("pulsar+ssl", ""))
                      for name, by_scheme in urls.items())
    return listeners, internal


def _entry(entry: str) -> tuple[str, str, str, str]:
    """(name, scheme, url, host:port) of one ``name:scheme://host:port``."""
    name, _, url = entry.partition(":")
    name, url = name.strip(), url.strip()
    if not name or not url or url.startswith("//"):  # "pulsar://h:p" has no name
        raise ValueError(f"advertisedListeners: {entry!r} is not listener_name:scheme://host:port")
    if len(name) > LISTENER_NAME_CHARS_MAX or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"advertisedListeners: listener name {name!r} must be letters, digits, '-' and '_' "
                         f"(at most {LISTENER_NAME_CHARS_MAX})")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        port = None
        parts = urlsplit("")
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(f"advertisedListeners: {url!r} of listener {name!r} is not "
                         f"{' / '.join(SCHEMES)}://host:port")
    return name, scheme, f"{scheme}://{parts.netloc}", f"{parts.hostname}:{port}"


def named_listener(address: BrokerAddress, name: str) -> AdvertisedListener:
    """The listener ``name`` of the broker at ``address``; Pulsar's refusal when it has none."""
    listener = address.listener(name)
    if listener is None:
        raise ServiceUnitNotReady(f"the broker do not have {name} listener")
    return listener
