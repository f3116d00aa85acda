"""The broker's errors: one hierarchy (rooted at ``MagnetarError``) mapped to HTTP once, in api/.

Policy lives on each class: ``code`` (stable, machine-readable), ``http_status`` and
``retriable``. ``ERRORS_BY_CODE`` is the registry from code to class. Storage errors are part of
the same hierarchy and re-exported here, so ``api`` needs nothing from ``storage``.
"""

from __future__ import annotations

from typing import Any

from storage import (
    CorruptEntry,
    InvalidArgument,
    LedgerFenced,
    MagnetarError,
    NoSuchEntry,
    NoSuchLedger,
    StorageBusy,
    StorageClosed,
    StorageError,
    StorageFull,
    StorageIOError,
    StorageReadOnly,
    WriteCacheFull,
)


class BrokerError(MagnetarError):
    code = "broker_error"

    def details(self) -> dict[str, Any]:
        """Fields a transport adds to the error's ``{code, message}`` (none by default)."""
        return {}


class NotFound(BrokerError):
    code = "not_found"
    http_status = 404


class AlreadyExists(BrokerError):
    code = "already_exists"
    http_status = 409


class BadVersion(BrokerError):
    """A metadata compare-and-set lost: the stored version differs from the expected one."""

    code = "bad_version"
    http_status = 409
    retriable = True


class InvalidRequest(BrokerError):
    """A request the broker cannot carry out as given; ``field``, when set, names the request
    field at fault (transports map it onto their own error codes)."""

    code = "invalid_request"
    http_status = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class OffsetMismatch(BrokerError):
    """Conditional append refused: the partition's next offset is not the expected one."""

    code = "offset_mismatch"
    http_status = 409

    def __init__(self, message: str, *, expected_offset: int, next_offset: int) -> None:
        super().__init__(message)
        self.expected_offset = expected_offset
        self.next_offset = next_offset


class KeyVersionMismatch(BrokerError):
    """Conditional append refused: a key's stream is not at the expected version. Nothing was
    written; ``current_key_versions`` holds the current version of every key the append expected
    something of (-1: the key has no message)."""

    code = "key_version_mismatch"
    http_status = 409

    def __init__(self, message: str, *, current_key_versions: dict[str, int]) -> None:
        super().__init__(message)
        self.current_key_versions = current_key_versions

    def details(self) -> dict[str, Any]:
        return {"currentKeyVersions": self.current_key_versions}


class DcbConditionFailed(BrokerError):
    """A DCB append refused: an event matching its condition's query follows the condition's
    position. Nothing was written; ``position`` is the first such event's (offset + 1)."""

    code = "dcb_condition_failed"
    http_status = 409

    def __init__(self, message: str, *, position: int) -> None:
        super().__init__(message)
        self.position = position

    def details(self) -> dict[str, Any]:
        return {"position": self.position}


class DcbIndexMoved(BrokerError):
    """A DCB append's condition was checked against key index segments that a checkpoint
    replaced before the append took its offset: checked again (``DCB_APPEND_ATTEMPTS_MAX``
    times), then refused as retriable. Nothing was written."""

    code = "dcb_index_moved"
    http_status = 503
    retriable = True


class KeyIndexBusy(BrokerError):
    """The key index is too far behind the appends it must index: retry shortly."""

    code = "key_index_busy"
    http_status = 503
    retriable = True


class TopicNotOwned(BrokerError):
    """A cluster broker was asked for a topic whose bundle another broker owns (or is being
    assigned to): the transport sends the client there (HTTP 307 with the owner's address, a
    redirecting LOOKUP answer on the binary protocol). ``owner_url`` is the owner's web service
    URL (``http://host:port``), ``owner_broker`` its broker id, ``pulsar_url`` its binary
    protocol URL ('' when it has none)."""

    code = "topic_redirect"
    http_status = 307
    retriable = True

    def __init__(self, message: str, *, owner_url: str, owner_broker: str, pulsar_url: str = "") -> None:
        super().__init__(message)
        self.owner_url = owner_url
        self.owner_broker = owner_broker
        self.pulsar_url = pulsar_url


class ServiceUnitNotReady(BrokerError):
    """The topic's bundle is between owners (its broker lost its ZooKeeper session, or it is
    being unloaded or split): retry after a short wait, through a lookup."""

    code = "service_unit_not_ready"
    http_status = 503
    retriable = True


class LedgerClosed(BrokerError):
    code = "ledger_closed"
    http_status = 409


class NotEnoughBookies(BrokerError):
    code = "not_enough_bookies"
    http_status = 503
    retriable = True


class DuplicateInFlight(BrokerError):
    """A resend of a message whose first send is still being stored: retry shortly."""

    code = "duplicate_in_flight"
    http_status = 409
    retriable = True


class TopicTerminated(BrokerError):
    code = "topic_terminated"
    http_status = 409


class MessageTooLarge(BrokerError):
    code = "message_too_large"
    http_status = 413


class ProducerBusy(BrokerError):
    code = "producer_busy"
    http_status = 409


class ProducerFenced(ProducerBusy):
    """An exclusive producer took the topic; this producer may not send (Pulsar's ProducerFenced)."""

    code = "producer_fenced"


class IncompatibleSchema(BrokerError):
    """A schema the topic's compatibility strategy refuses."""

    code = "incompatible_schema"
    http_status = 409


class ConsumerBusy(BrokerError):
    code = "consumer_busy"
    http_status = 409


class NotAllowed(BrokerError):
    code = "not_allowed"
    http_status = 405


class NotEmpty(NotAllowed):
    """A tenant or namespace cannot be deleted while it still holds namespaces or topics."""

    code = "not_empty"
    http_status = 409


class CompactionInProgress(BrokerError):
    code = "compaction_in_progress"
    http_status = 409
    retriable = True


class Unauthorized(BrokerError):
    code = "unauthorized"
    http_status = 401


class Forbidden(BrokerError):
    code = "forbidden"
    http_status = 403


class PreconditionFailed(BrokerError):
    code = "precondition_failed"
    http_status = 412


class QuotaExceeded(PreconditionFailed):
    """A namespace or topic quota refused a new topic or subscription (``broker/quotas.py``):
    Pulsar's 412 over HTTP and ``NotAllowedError`` on the binary protocol."""

    code = "quota_exceeded"


class EncryptionRequired(PreconditionFailed):
    """The namespace's ``encryption_required`` refuses a producer that does not encrypt, or a
    message without encryption keys (Pulsar's ``MetadataError`` on the binary protocol)."""

    code = "encryption_required"


class DataLost(BrokerError):
    """The requested position was trimmed by retention. For a key's stream, ``first_version``
    is the first version retention kept (the answer names it as ``firstVersion``)."""

    code = "data_lost"
    http_status = 410

    def __init__(self, message: str, *, first_version: int | None = None) -> None:
        super().__init__(message)
        self.first_version = first_version

    def details(self) -> dict[str, Any]:
        return {} if self.first_version is None else {"firstVersion": self.first_version}


class OffloadError(BrokerError):
    """An offload, a read of an offloaded copy or its deletion failed (the store is down, a
    credential is refused, the bucket is missing, an object is corrupt or missing); the
    message names the ledger and the store, never a secret. Declared here (and re-exported by
    ``broker.offload.offloader``) so that ``ERRORS_BY_CODE`` holds it."""

    code = "offload_error"
    http_status = 503


class OffloadReadError(OffloadError):
    """A read of an offloaded ledger failed: never answered with other data."""

    code = "offload_read_error"


class OffloadConfigError(OffloadError):
    """The offload settings are unusable (an unknown ``managedLedgerOffloadDriver``, a missing
    bucket, a bound out of range): one line naming the key and what is allowed."""

    code = "offload_config_error"
    http_status = 400


def _registry() -> dict[str, type[MagnetarError]]:
    registry: dict[str, type[MagnetarError]] = {}
    pending: list[type[MagnetarError]] = [MagnetarError]
    while pending:
        cls = pending.pop()
        registry[cls.code] = cls
        pending.extend(cls.__subclasses__())
    return registry


ERRORS_BY_CODE = _registry()

__all__ = [
    "ERRORS_BY_CODE",
    "AlreadyExists",
    "BadVersion",
    "BrokerError",
    "CompactionInProgress",
    "ConsumerBusy",
    "CorruptEntry",
    "DataLost",
    "DuplicateInFlight",
    "Forbidden",
    "InvalidArgument",
    "InvalidRequest",
    "KeyIndexBusy",
    "KeyVersionMismatch",
    "LedgerClosed",
    "LedgerFenced",
    "MagnetarError",
    "MessageTooLarge",
    "NoSuchEntry",
    "OffloadConfigError",
    "OffloadError",
    "OffloadReadError",
    "NoSuchLedger",
    "NotAllowed",
    "NotEmpty",
    "NotEnoughBookies",
    "NotFound",
    "OffsetMismatch",
    "PreconditionFailed",
    "QuotaExceeded",
    "ProducerBusy",
    "ProducerFenced",
    "IncompatibleSchema",
    "StorageBusy",
    "StorageClosed",
    "StorageError",
    "StorageFull",
    "StorageIOError",
    "StorageReadOnly",
    "TopicTerminated",
    "Unauthorized",
    "WriteCacheFull",
    "ServiceUnitNotReady",
    "TopicNotOwned",
]
