"""Offload settings: which store a broker offloads to, under Pulsar's ``broker.conf`` key names.

Role: ``OffloadSettings`` is the one value the offloader factory (``create_offloader``) takes;
``from_config`` reads Pulsar's keys (``managedLedgerOffloadDriver``, the ``s3ManagedLedger*``,
``gcsManagedLedger*`` and driver-neutral ``managedLedgerOffload*`` keys, ``fileSystemURI``), so
a Pulsar user's broker.conf carries over. The fixed bounds of offloading (upload parts, source
runs, index size, block and buffer ranges) are ``OFFLOAD_*`` in ``broker/limits.py``.

Invariants: a settings value is checked (``validate``) before any store is built: a known
driver, the bucket or URI that driver needs, block and buffer sizes within their bounds; a
failure is one ``OffloadConfigError`` line naming the key. Secrets never live here: S3
credentials come from the standard AWS environment variables and files, GCS from the service
account key file named by ``gcsManagedLedgerOffloadServiceAccountKeyFile``, Azure from
``AZURE_STORAGE_ACCOUNT`` / ``AZURE_STORAGE_ACCESS_KEY`` (Pulsar's variables).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.errors import OffloadConfigError
from broker.limits import (
    OFFLOAD_BLOCK_SIZE_BYTES_MAX,
    OFFLOAD_BLOCK_SIZE_BYTES_MIN,
    OFFLOAD_READ_BUFFER_SIZE_BYTES_MAX,
    OFFLOAD_RETRIES_MAX,
)

MiB = 1024 * 1024

DRIVERS = ("aws-s3", "s3", "google-cloud-storage", "azureblob", "filesystem")
"""Pulsar's ``managedLedgerOffloadDriver`` names this broker knows."""
S3_DRIVERS = ("aws-s3", "s3")
PULSAR_BLOCK_SIZE_BYTES = 64 * MiB
"""Pulsar's default ``s3ManagedLedgerOffloadMaxBlockSizeInBytes``."""
PULSAR_READ_BUFFER_BYTES = 1 * MiB
"""Pulsar's default ``s3ManagedLedgerOffloadReadBufferSizeInBytes``."""


@dataclass(frozen=True)
class OffloadSettings:
    """One configured store. Field names follow Pulsar's keys; ``driver == ""`` means offload
    is not configured."""

    driver: str = ""
    bucket: str = ""
    region: str = ""
    service_endpoint: str = ""
    file_system_uri: str = ""
    max_block_size_bytes: int = PULSAR_BLOCK_SIZE_BYTES
    read_buffer_size_bytes: int = PULSAR_READ_BUFFER_BYTES
    gcs_service_account_key_file: str = ""
    azure_account: str = ""
    flow_permits_per_second: int = -1
    """Bytes per second every offload of this broker together may read from the bookies
    (Pulsar's ``managedLedgerOffloadFlowPermitsPerSecond``; -1 or 0: unthrottled), so an offload
    leaves the publish path its share of the machine."""
    flow_permits_per_second_while_publishing: int = 8_000_000
    """Bytes per second every offload of this broker together may read from the bookies while the
    broker takes publishes (``managedLedgerOffloadFlowPermitsPerSecondWhilePublishing``, a Magnetar
    key; -1 or 0: no yielding, as Pulsar): an offload goes at full speed (or
    ``flow_permits_per_second``) while nothing is published and yields the machine to the publish
    path while something is. 8 MB/s offloads 28.8 GB an hour; under a sustained ingest above it an
    offload falls behind until publishing slows (raise the key, or -1)."""
    request_timeout_ms: int = 30_000
    """One request to the store (Pulsar has no key for it)."""
    connect_timeout_ms: int = 5_000
    """Opening a connection to the store (Pulsar has no key for it)."""
    max_retries: int = 3
    """Retries of one failed request (5xx, connection errors) before the error is raised."""
    retry_timeout_ms: int = 60_000
    """No retry starts later than this after a request's first try."""

    @property
    def enabled(self) -> bool:
        return bool(self.driver)

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> OffloadSettings:
        """Settings from Pulsar's ``broker.conf`` keys; a driver-specific key (``s3…``,
        ``gcs…``) wins over the driver-neutral ``managedLedgerOffload…`` one."""
        driver = config.get("managedLedgerOffloadDriver", "").strip()
        prefix = "gcs" if driver == "google-cloud-storage" else "s3" if driver in S3_DRIVERS else ""

        def key(name: str) -> tuple[str, str]:
            specific = f"{prefix}ManagedLedgerOffload{name}"
            if prefix and config.get(specific, "").strip():
                return specific, config[specific].strip()
            return f"managedLedgerOffload{name}", config.get(f"managedLedgerOffload{name}", "").strip()

        settings = cls(driver=driver, bucket=key("Bucket")[1], region=key("Region")[1],
                       service_endpoint=key("ServiceEndpoint")[1],
                       file_system_uri=config.get("fileSystemURI", "").strip(),
                       max_block_size_bytes=_int(*key("MaxBlockSizeInBytes"), PULSAR_BLOCK_SIZE_BYTES),
                       read_buffer_size_bytes=_int(*key("ReadBufferSizeInBytes"), PULSAR_READ_BUFFER_BYTES),
                       gcs_service_account_key_file=config.get("gcsManagedLedgerOffloadServiceAccountKeyFile",
                                                               "").strip(),
                       flow_permits_per_second=_int("managedLedgerOffloadFlowPermitsPerSecond",
                                                    config.get("managedLedgerOffloadFlowPermitsPerSecond", "").strip(),
                                                    -1),
                       flow_permits_per_second_while_publishing=_int(
                           "managedLedgerOffloadFlowPermitsPerSecondWhilePublishing",
                           config.get("managedLedgerOffloadFlowPermitsPerSecondWhilePublishing", "").strip(),
                           cls.flow_permits_per_second_while_publishing))
        if settings.enabled:
            settings.validate()
        return settings

    def validate(self) -> None:
        if self.driver not in DRIVERS:
            raise OffloadConfigError(f"managedLedgerOffloadDriver {self.driver!r} is not one of "
                                     f"{', '.join(DRIVERS)}")
        if self.driver == "filesystem" and not self.file_system_uri:
            raise OffloadConfigError("the filesystem offload driver needs fileSystemURI (a directory or file:// URI)")
        if self.driver != "filesystem" and not self.bucket:
            raise OffloadConfigError(f"the {self.driver} offload driver needs a bucket "
                                     f"({_bucket_key(self.driver)})")
        if not OFFLOAD_BLOCK_SIZE_BYTES_MIN <= self.max_block_size_bytes <= OFFLOAD_BLOCK_SIZE_BYTES_MAX:
            raise OffloadConfigError(f"the offload max block size {self.max_block_size_bytes} is outside "
                                     f"{OFFLOAD_BLOCK_SIZE_BYTES_MIN}..{OFFLOAD_BLOCK_SIZE_BYTES_MAX} bytes")
        if not 1 <= self.read_buffer_size_bytes <= OFFLOAD_READ_BUFFER_SIZE_BYTES_MAX:
            raise OffloadConfigError(f"the offload read buffer size {self.read_buffer_size_bytes} is outside "
                                     f"1..{OFFLOAD_READ_BUFFER_SIZE_BYTES_MAX} bytes")
        if self.flow_permits_per_second < -1:
            raise OffloadConfigError(f"managedLedgerOffloadFlowPermitsPerSecond {self.flow_permits_per_second} is "
                                     "below -1 (unthrottled)")
        if self.flow_permits_per_second_while_publishing < -1:
            raise OffloadConfigError("managedLedgerOffloadFlowPermitsPerSecondWhilePublishing "
                                     f"{self.flow_permits_per_second_while_publishing} is below -1 (no yielding)")
        if self.request_timeout_ms <= 0 or self.connect_timeout_ms <= 0 or self.retry_timeout_ms <= 0:
            raise OffloadConfigError("offload timeouts must be positive")
        if not 0 <= self.max_retries <= OFFLOAD_RETRIES_MAX:
            raise OffloadConfigError(f"offload max retries {self.max_retries} is outside 0..{OFFLOAD_RETRIES_MAX}")

    def location(self) -> str:
        """Where this store is, for messages and ``driver_metadata`` (never a secret)."""
        if self.driver == "filesystem":
            return self.file_system_uri
        endpoint = f" at {self.service_endpoint}" if self.service_endpoint else ""
        return f"bucket {self.bucket}{endpoint}"


def _bucket_key(driver: str) -> str:
    if driver in S3_DRIVERS:
        return "s3ManagedLedgerOffloadBucket"
    if driver == "google-cloud-storage":
        return "gcsManagedLedgerOffloadBucket"
    return "managedLedgerOffloadBucket"


def _int(key: str, text: str, default: int) -> int:
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise OffloadConfigError(f"{key} {text!r} is not a whole number of bytes") from None
