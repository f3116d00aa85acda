"""Object stores of every offload driver, through one library (obstore, Rust's object_store).

Role: ``open_store`` builds the obstore store a driver names (``aws-s3``/``s3``: S3Store;
``google-cloud-storage``: GCSStore; ``azureblob``: AzureStore; ``filesystem``: LocalStore on a
directory), with bounded timeouts and a bounded number of retries; ``describe_failure`` turns
a store's exception into a short reason (credentials refused, bucket missing, object missing,
store unreachable, ...) for an ``OffloadError`` message.

Invariants: no secret reaches a message: reasons are chosen from the error's kind and S3 error
code, never copied from the store's answer. S3 credentials come from the standard AWS
environment variables (read by obstore) or, when none is set, from boto3's chain (``~/.aws``
files, ``AWS_PROFILE``) when boto3 is installed. A custom S3 endpoint is addressed path-style,
and plain ``http://`` is allowed only for it.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from obstore.exceptions import (
    BaseError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from obstore.store import AzureStore, GCSStore, LocalStore, S3Store

from broker.errors import OffloadConfigError
from broker.limits import OFFLOAD_RETRY_BACKOFF_INITIAL_MS, OFFLOAD_RETRY_BACKOFF_MS_MAX
from broker.offload.settings import S3_DRIVERS, OffloadSettings

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig

_CREDENTIAL_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
                     "InvalidToken", "AuthorizationHeaderMalformed")


def open_store(settings: OffloadSettings) -> ObjectStore:
    """The store of ``settings`` (already validated). Raises ``OffloadConfigError``."""
    client, retry = _client_options(settings), _retry_config(settings)
    try:
        if settings.driver in S3_DRIVERS:
            return _s3_store(settings, client, retry)
        if settings.driver == "google-cloud-storage":
            gcs: dict[str, Any] = {}
            if settings.gcs_service_account_key_file:
                gcs["service_account"] = settings.gcs_service_account_key_file
            return GCSStore(settings.bucket, client_options=client, retry_config=retry, **gcs)
        if settings.driver == "azureblob":
            return AzureStore(settings.bucket, client_options=client, retry_config=retry, **_azure_config(settings))
        return LocalStore(filesystem_directory(settings.file_system_uri), mkdir=True)
    except (BaseError, OSError, ValueError) as exc:
        raise OffloadConfigError(f"the {settings.driver} offload store ({settings.location()}) cannot be set up: "
                                 f"{describe_failure(exc)}") from None


def filesystem_directory(uri: str) -> str:
    """``fileSystemURI`` as a local directory: a path, or a ``file://`` URI."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = unquote(parsed.path) if parsed.scheme else uri
        if not path:
            raise OffloadConfigError(f"fileSystemURI {uri!r} names no directory")
        return str(Path(path).absolute())
    raise OffloadConfigError(f"fileSystemURI {uri!r}: only a local directory or a file:// URI is supported")


def _client_options(settings: OffloadSettings) -> ClientConfig:
    options: ClientConfig = {"timeout": timedelta(milliseconds=settings.request_timeout_ms),
                             "connect_timeout": timedelta(milliseconds=settings.connect_timeout_ms)}
    if settings.service_endpoint.startswith("http://"):
        options["allow_http"] = True
    return options


def _retry_config(settings: OffloadSettings) -> RetryConfig:
    return {"max_retries": settings.max_retries, "retry_timeout": timedelta(milliseconds=settings.retry_timeout_ms),
            "backoff": {"init_backoff": timedelta(milliseconds=OFFLOAD_RETRY_BACKOFF_INITIAL_MS),
                        "max_backoff": timedelta(milliseconds=OFFLOAD_RETRY_BACKOFF_MS_MAX), "base": 2}}


def _s3_store(settings: OffloadSettings, client: ClientConfig, retry: RetryConfig) -> S3Store:
    config: dict[str, Any] = {}
    if settings.region:
        config["region"] = settings.region
    elif not os.environ.get("AWS_REGION") and not os.environ.get("AWS_DEFAULT_REGION"):
        config["region"] = "us-east-1"
    if settings.service_endpoint:
        config["endpoint"] = settings.service_endpoint
        config["virtual_hosted_style_request"] = False
    provider = _boto3_credentials()
    if provider is not None:
        return S3Store(settings.bucket, client_options=client, retry_config=retry, credential_provider=provider,
                       **config)
    return S3Store(settings.bucket, client_options=client, retry_config=retry, **config)


def _boto3_credentials() -> Any:
    """boto3's credential chain when the environment names no key (obstore reads the standard
    variables itself but not ``~/.aws`` files), or None."""
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    try:
        import boto3
        from botocore.exceptions import BotoCoreError
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        return None
    try:
        session = boto3.Session()
        if session.get_credentials() is None:
            return None
        return Boto3CredentialProvider(session)
    except BotoCoreError:  # a named profile that no file holds: as if none were found
        return None


def _azure_config(settings: OffloadSettings) -> dict[str, Any]:
    """Pulsar's Azure variables (``AZURE_STORAGE_ACCOUNT``, ``AZURE_STORAGE_ACCESS_KEY``), when set."""
    config: dict[str, Any] = {}
    account = settings.azure_account or os.environ.get("AZURE_STORAGE_ACCOUNT", "")
    if account:
        config["account_name"] = account
    key = os.environ.get("AZURE_STORAGE_ACCESS_KEY", "")
    if key:
        config["account_key"] = key
    if settings.service_endpoint:
        config["endpoint"] = settings.service_endpoint
    return config


def describe_failure(exc: BaseException) -> str:
    """A short, secret-free reason for a store's exception."""
    text = str(exc)
    if "MissingAccount" in text or "Account must be specified" in text:
        return "no storage account is set (AZURE_STORAGE_ACCOUNT)"
    if "service account file" in text:
        return ("the service account key file (gcsManagedLedgerOffloadServiceAccountKeyFile) cannot be read "
                "or decoded")
    if "NoSuchBucket" in text or "ContainerNotFound" in text:
        return "the bucket does not exist"
    if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)) or any(c in text for c in _CREDENTIAL_CODES):
        return "the store refused the credentials"
    if isinstance(exc, (NotFoundError, FileNotFoundError)):
        return "the object does not exist"
    if "169.254.169.254" in text or "169.254.170.2" in text:
        return ("no credentials were found (the AWS environment variables, ~/.aws files and the instance "
                "metadata service gave none)")
    if "error sending request" in text or "Connection refused" in text or "timed out" in text.lower():
        return "the store is unreachable (connection failed or timed out after the bounded retries)"
    if "InvalidRange" in text or "Range Not Satisfiable" in text:
        return "the object is shorter than its index says"
    return f"the store failed ({type(exc).__name__})"
