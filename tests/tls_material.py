"""Certificates for the TLS tests, made with ``cryptography``: a CA, a broker certificate it signed
(for ``localhost`` and 127.0.0.1) and client certificates whose CN is a role, as Pulsar's mutual
TLS uses them; and the client-side ``ssl`` contexts that trust that CA."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 2


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class TlsMaterial:
    directory: Path
    ca: KeyPair
    server: KeyPair

    def client(self, role: str) -> KeyPair:
        """A client certificate with CN ``role``, signed by the CA (made once per role)."""
        pair = KeyPair(self.directory / f"client-{role}.cert.pem", self.directory / f"client-{role}.key.pem")
        if not pair.cert.exists():
            _issue(pair, _name(role), self.ca, server=False)
        return pair

    def context(self, role: str | None = None) -> ssl.SSLContext:
        """A client context trusting the CA (and presenting ``role``'s certificate when given)."""
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        if role is not None:
            pair = self.client(role)
            context.load_cert_chain(str(pair.cert), str(pair.key))
        return context


def make_material(directory: Path) -> TlsMaterial:
    """A fresh CA and a broker certificate in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = KeyPair(directory / "ca.cert.pem", directory / "ca.key.pem")
    _issue(ca, _name("magnetar-test-ca"), None, server=False)
    server = KeyPair(directory / "broker.cert.pem", directory / "broker.key.pem")
    _issue(server, _name("localhost"), ca, server=True)
    return TlsMaterial(directory, ca, server)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(pair: KeyPair, subject: x509.Name, issuer: KeyPair | None, *, server: bool) -> None:
    """Write a key and a certificate for ``subject``: self-signed as a CA when ``issuer`` is None."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS)))
    signer: Any = key
    if issuer is None:
        issuer_name = subject
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    else:
        signer = serialization.load_pem_private_key(issuer.key.read_bytes(), password=None)
        issuer_name = x509.load_pem_x509_certificate(issuer.cert.read_bytes()).subject
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    cert = builder.issuer_name(issuer_name).sign(signer, hashes.SHA256())
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))


def write_rsa_key_pair(directory: Path) -> tuple[Path, Path]:
    """``public.pem`` and ``private.pem`` in ``directory``: an RSA pair for end-to-end encryption
    (the official client's ``CryptoKeyReader`` reads them)."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "private.pem").write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()))
    (directory / "public.pem").write_bytes(private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return directory / "public.pem", directory / "private.pem"
