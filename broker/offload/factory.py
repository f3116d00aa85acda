"""The offloader factory: settings in, a ``LedgerOffloader`` of the configured driver out.

Role: the one place a broker turns ``OffloadSettings`` (Pulsar's ``managedLedgerOffloadDriver``
and its keys) into an offloader; every driver is a ``BlobStoreOffloader`` over the obstore
store ``stores.open_store`` builds. Invariant: an unknown driver or missing bucket/URI fails
here, in one ``OffloadConfigError`` line, before anything is offloaded.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.offload.blob_offloader import BlobStoreOffloader
from broker.offload.settings import OffloadSettings
from broker.offload.stores import open_store


def create_offloader(settings: OffloadSettings, *, publishing: Callable[[], bool] | None = None) -> BlobStoreOffloader:
    """The offloader of ``settings``; ``publishing`` says whether the broker takes publishes now
    (what an offload yields to; None: never yield). Raises ``OffloadConfigError``."""
    settings.validate()
    return BlobStoreOffloader(settings, open_store(settings), publishing=publishing)
