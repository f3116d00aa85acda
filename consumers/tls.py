"""TLS for the clients: how an ``https://`` (and ``wss://``) service URL is reached.

Role: the Python client (``consumers/client``), the CLI and the Spark source and sink build one
``ssl`` context from the options Pulsar's clients name: the trust file
(``tls_trust_certs_file_path``: the authorities that signed the broker's certificate; the
system's when not given) and, for mutual TLS, the client's certificate and key
(``tls_certificate_file_path``, ``tls_private_key_file_path``: what Pulsar's ``AuthenticationTLS``
presents; a broker with ``AuthenticationProviderTls`` takes the role from its CN).

Invariants: TLS 1.2 or newer; the broker's certificate is verified, host name included; a bad
option (an unreadable file, a certificate without its key) fails here, before any connection.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class ClientTls:
    trust_certs_file: str | None = None
    certificate_file: str | None = None
    private_key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.certificate_file is None) != (self.private_key_file is None):
            raise ValueError("a client certificate needs both tls_certificate_file_path and tls_private_key_file_path")

    @property
    def given(self) -> bool:
        """Any TLS option was given (else an ``https://`` URL is trusted as the system trusts it)."""
        return any((self.trust_certs_file, self.certificate_file, self.private_key_file))

    def context(self) -> ssl.SSLContext:
        """The client context (raises ``OSError`` or ``ssl.SSLError`` for unusable files)."""
        context = ssl.create_default_context(cafile=self.trust_certs_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.certificate_file is not None and self.private_key_file is not None:
            context.load_cert_chain(self.certificate_file, self.private_key_file)
        return context
