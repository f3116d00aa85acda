"""TLS on the broker's listeners: the server's ``ssl`` context and who a client certificate names.

Role: one ``TlsConfig`` (Pulsar's keys ``tlsCertificateFilePath``, ``tlsKeyFilePath``,
``tlsTrustCertsFilePath``, ``tlsRequireTrustedClientCertOnConnect``,
``tlsAllowInsecureConnection``, ``tlsProtocols``) gives every TLS listener its context: the
web service's HTTPS/WSS port (``webServicePortTls``, ``api/web_server.py``) and the binary
protocol's ``pulsar+ssl://`` port (``brokerServicePortTls``, ``api/pulsar/server.py``). A
connection's verified client certificate becomes a ``TlsPeer``; ``AuthenticationProviderTls``
(``api/authentication.py``) takes its CN as the role. On HTTP the peer reaches the application in
the ASGI scope (``TLS_PEER_EXTENSION``), put there by the listener's protocol; the WebSocket edge
(``api/ws/server.py``) reads it from the connection it takes over (``tls_peer_of``).

Invariants:
- Only TLS 1.2 and 1.3 are spoken (``tlsProtocols`` may narrow that, never widen it): an older
  client fails the handshake.
- A client certificate is asked for only when ``tlsTrustCertsFilePath`` names the authorities
  that sign them, and one that is presented must verify against them (else the handshake fails);
  with ``tlsRequireTrustedClientCertOnConnect`` a client without one fails the handshake too.
  With ``tlsAllowInsecureConnection`` no certificate is asked for, so none is trusted.
- A ``TlsPeer`` exists only for a certificate that verified: an unverified one never names a role.
- No TLS 1.3 session tickets are sent (``num_tickets = 0``): a ticket arrives after the handshake,
  while a client may already be writing its first request, and a client that reads and writes
  one TLS connection from two threads (the threaded client of the ``websockets`` library does)
  then sometimes never sends that request: measured, about one WSS handshake in 2,000 stalled
  until its timeout with tickets, none in 4,800 without. The clients here do not resume
  sessions, so nothing is lost.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

TLS_PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
"""The versions ``tlsProtocols`` may name (Pulsar's names); nothing older is offered."""

TLS_PEER_EXTENSION = "magnetar.tls.peer"
"""ASGI scope extension: the ``TlsPeer`` of a request that came over TLS with a verified client
certificate (absent otherwise)."""


@dataclass(frozen=True)
class TlsConfig:
    cert_file: str | None = None
    """``tlsCertificateFilePath``: the broker's certificate (PEM, with its chain)."""
    key_file: str | None = None
    """``tlsKeyFilePath``: its private key (PEM)."""
    trust_certs_file: str | None = None
    """``tlsTrustCertsFilePath``: the authorities that sign client certificates."""
    require_trusted_client_cert: bool = False
    """``tlsRequireTrustedClientCertOnConnect``: a client without a trusted certificate fails the handshake."""
    allow_insecure_connection: bool = False
    """``tlsAllowInsecureConnection``: no client certificate is asked for (none is verified or used)."""
    protocols: tuple[str, ...] = ("TLSv1.3", "TLSv1.2")
    """``tlsProtocols``: the versions spoken (a subset of ``TLS_PROTOCOLS``)."""

    @property
    def configured(self) -> bool:
        """The broker has a certificate and key: its TLS listeners can run."""
        return self.cert_file is not None and self.key_file is not None

    @property
    def verifies_clients(self) -> bool:
        """Client certificates are asked for and verified (a ``TlsPeer`` can exist)."""
        return self.trust_certs_file is not None and not self.allow_insecure_connection

    def server_context(self) -> ssl.SSLContext:
        """The context of a TLS listener (raises ``OSError``/``ssl.SSLError`` for unusable files)."""
        assert self.cert_file is not None and self.key_file is not None, "TLS needs a certificate and key"
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        versions = sorted(TLS_PROTOCOLS[name] for name in self.protocols)
        context.minimum_version, context.maximum_version = versions[0], versions[-1]
        context.load_cert_chain(self.cert_file, self.key_file)
        context.num_tickets = 0  # no session tickets: see the invariants above
        if self.verifies_clients:
            assert self.trust_certs_file is not None
            context.load_verify_locations(self.trust_certs_file)
            context.verify_mode = ssl.CERT_REQUIRED if self.require_trusted_client_cert else ssl.CERT_OPTIONAL
        else:
            context.verify_mode = ssl.CERT_NONE
        return context


@dataclass(frozen=True)
class TlsPeer:
    """The subject of a client certificate that verified against ``tlsTrustCertsFilePath``."""

    subject: tuple[tuple[tuple[str, str], ...], ...]

    @property
    def common_name(self) -> str | None:
        """The certificate's CN (the last one, as Pulsar reads it), None without one."""
        names = [value for rdn in self.subject for key, value in rdn if key == "commonName"]
        return names[-1] if names else None


def tls_peer_of(transport: Any) -> TlsPeer | None:
    """The verified client certificate of ``transport`` (an asyncio or uvloop transport after its
    handshake); None on a plain connection or without a verified certificate."""
    if transport is None or not transport.get_extra_info("sslcontext"):
        return None
    peercert: Mapping[str, Any] | None = transport.get_extra_info("peercert")
    if not peercert or "subject" not in peercert:  # {} when no certificate was verified
        return None
    return TlsPeer(tuple(tuple((str(k), str(v)) for k, v in rdn) for rdn in peercert["subject"]))


def with_tls_peer(app: ASGIApp, peer: TlsPeer) -> ASGIApp:
    """``app`` for one connection: each request's scope carries ``peer`` (``TLS_PEER_EXTENSION``)."""

    async def app_with_peer(scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("extensions", {})[TLS_PEER_EXTENSION] = peer
        await app(scope, receive, send)

    return app_with_peer


def tls_peer_in(scope: Scope) -> TlsPeer | None:
    """The ``TlsPeer`` the listener put in an ASGI ``scope``, if any."""
    peer = (scope.get("extensions") or {}).get(TLS_PEER_EXTENSION)
    return peer if isinstance(peer, TlsPeer) else None
