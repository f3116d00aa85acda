"""Authentication providers (api/authentication.py) and how the Authorizer tries them (api/auth.py):
tokens from headers, queries and CONNECT, roles from verified client certificates, htpasswd users'
passwords, and the anonymous role of callers without credentials."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from starlette.requests import HTTPConnection

from api.auth import AuthConfig, Authorizer
from api.authentication import BasicProvider, BasicUsers, Credentials, TlsProvider, TokenProvider
from api.tls import TLS_PEER_EXTENSION, TlsPeer
from broker import Unauthorized
from consumers.cli.tokens import create_token

SECRET = b"provider-test-secret-provider-test!"
ALICE = TlsPeer(((("organizationName", "Acme"),), (("commonName", "alice"),)))


def request(*, headers: dict[str, str] | None = None, query: str = "", peer: TlsPeer | None = None) -> HTTPConnection:
    scope: dict[str, Any] = {"type": "http", "headers": [(k.lower().encode(), v.encode()) for k, v in
                                                         (headers or {}).items()],
                             "query_string": query.encode(), "path": "/", "method": "GET"}
    if peer is not None:
        scope["extensions"] = {TLS_PEER_EXTENSION: peer}
    return HTTPConnection(scope)


def authorizer(*providers: str) -> Authorizer:
    config = AuthConfig(enabled=True, providers=providers, secret_key=SECRET, superuser_roles=frozenset({"alice"}))
    return Authorizer(config, service=None)  # type: ignore[arg-type]  # authentication reads no broker state


def test_the_token_provider_reads_the_header_the_query_and_connect() -> None:
    provider = TokenProvider(SECRET, "HS256", "sub")
    token = create_token("bob", secret_key=SECRET, expires_in_s=60)
    for credentials in (Credentials(http=request(headers={"Authorization": f"Bearer {token}"})),
                        Credentials(http=request(query=f"token={token}")),
                        Credentials(command_data=f"token:{token}".encode())):
        identity = provider.authenticate(credentials)
        assert identity is not None and identity.role == "bob" and identity.expires_at_s is not None
    assert provider.authenticate(Credentials(http=request())) is None
    with pytest.raises(Unauthorized, match="invalid token"):
        provider.authenticate(Credentials(command_data=b"not-a-jwt"))


def test_the_tls_provider_takes_the_role_from_the_cn() -> None:
    provider = TlsProvider()
    identity = provider.authenticate(Credentials(tls_peer=ALICE))
    assert identity is not None and (identity.role, identity.expires_at_s) == ("alice", None)
    assert provider.authenticate(Credentials(http=request())) is None
    with pytest.raises(Unauthorized, match="no CN"):
        provider.authenticate(Credentials(tls_peer=TlsPeer(((("organizationName", "Acme"),),))))


def test_over_http_the_first_provider_with_valid_credentials_decides() -> None:
    both = authorizer("token", "tls")
    caller = both.authenticate_headers(request(headers={"Authorization": "Bearer forged"}, peer=ALICE))
    assert (caller.role, caller.superuser) == ("alice", True)  # the certificate verified; the token did not
    with pytest.raises(Unauthorized, match="invalid token"):
        both.authenticate_headers(request(headers={"Authorization": "Bearer forged"}))
    with pytest.raises(Unauthorized, match=r"send a token .* or a client certificate"):
        both.authenticate_headers(request())
    with pytest.raises(Unauthorized):  # a certificate counts only where its provider is configured
        authorizer("token").authenticate_headers(request(peer=ALICE))


def test_on_the_binary_protocol_connect_names_the_provider() -> None:
    both = authorizer("token", "tls")
    assert both.authenticate_command("tls", None, ALICE).role == "alice"
    with pytest.raises(Unauthorized, match="'tls' needs a client certificate"):
        both.authenticate_command("tls", None, None)
    with pytest.raises(Unauthorized, match="'basic' is not accepted: use token, tls"):
        both.authenticate_command("basic", b"user:pass", ALICE)
    with pytest.raises(Unauthorized, match="'tls' is not accepted: use token"):
        authorizer("token").authenticate_command("tls", None, ALICE)


PULSAR_DOCS_HTPASSWD = "superuser:$apr1$GBIYZYFZ$MzLcPrvoUky16mLcK6UtX/\n"
"""The htpasswd line Pulsar's Basic authentication page shows (``htpasswd -cmb … superuser admin``)."""


def basic_users() -> BasicUsers:
    from passlib.hash import apr_md5_crypt, bcrypt, des_crypt

    return BasicUsers.parse(PULSAR_DOCS_HTPASSWD + f"\nmd5:{apr_md5_crypt.hash('pw-md5')}\n"
                            f"des:{des_crypt.hash('pw-des')}\nbc:{bcrypt.using(rounds=4).hash('pw-bc')}\n")


def basic_header(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_the_basic_provider_reads_each_htpasswd_hash_over_http_and_connect() -> None:
    provider = BasicProvider(basic_users())
    for user, password in (("superuser", "admin"), ("md5", "pw-md5"), ("des", "pw-des"), ("bc", "pw-bc")):
        for credentials in (Credentials(http=request(headers=basic_header(user, password))),
                            Credentials(command_data=f"{user}:{password}".encode())):
            identity = provider.authenticate(credentials)
            assert identity is not None and identity.role == user
        with pytest.raises(Unauthorized, match="unknown user or invalid password"):
            provider.authenticate(Credentials(command_data=f"{user}:wrong".encode()))
    assert provider.authenticate(Credentials(http=request(headers={"Authorization": "Bearer x"}))) is None
    with pytest.raises(Unauthorized, match="user:password"):
        provider.authenticate(Credentials(command_data=b"no-colon"))
    with pytest.raises(Unauthorized, match="unknown user"):
        provider.authenticate(Credentials(command_data=b"nobody:admin"))


@pytest.mark.parametrize(("text", "message"), [("user-only\n", "line 1: expected user:hash"),
                                                ("a:b:c\n", "line 1: expected user:hash"),
                                                ("\nplain:secret-in-clear\n", "line 2: the hash of 'plain'")])
def test_an_htpasswd_file_with_a_bad_line_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BasicUsers.parse(text)


def anonymous_authorizer(*providers: str) -> Authorizer:
    config = AuthConfig(enabled=True, providers=providers, secret_key=SECRET, anonymous_role="anonymous",
                        basic_users=basic_users())
    return Authorizer(config, service=None)  # type: ignore[arg-type]


def test_the_anonymous_role_is_for_callers_without_credentials_only() -> None:
    anonymous = anonymous_authorizer("tls", "token", "basic")
    assert anonymous.authenticate_headers(request()).role == "anonymous"
    assert anonymous.authenticate_command("none", b"", None).role == "anonymous"
    assert anonymous.authenticate_command("", b"", None).role == "anonymous"
    assert anonymous.authenticate_headers(request(headers=basic_header("md5", "pw-md5"))).role == "md5"
    for refused in (request(headers={"Authorization": "Bearer forged"}), request(headers=basic_header("md5", "no"))):
        with pytest.raises(Unauthorized):
            anonymous.authenticate_headers(refused)
    with pytest.raises(Unauthorized, match="'kerberos' is not accepted"):
        anonymous.authenticate_command("kerberos", b"ticket", None)
    with pytest.raises(Unauthorized, match="authentication required"):
        authorizer("token").authenticate_headers(request())
    with pytest.raises(Unauthorized, match="'none' is not accepted"):
        authorizer("token").authenticate_command("none", b"", None)
