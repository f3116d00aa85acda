"""Tiered storage: closed ledgers copied to an object store, read back as if local.

``offloader.py`` names the seam (``LedgerOffloader``, ``OffloadContext``, ``ReadHandle``); the
managed ledger only ever talks to it, never to a driver. Behind it: ``settings.py`` (Pulsar's
configuration keys), ``factory.py`` (``create_offloader``), ``stores.py`` (one object-store
library, obstore, for every driver), ``format.py`` (the offloaded format: data blocks and an
index object) and ``blob_offloader.py`` (offload, read, delete over a store).
"""

from broker.offload.blob_offloader import BlobStoreOffloader, OffloadedLedger, OffloaderStatistics
from broker.offload.factory import create_offloader
from broker.offload.settings import DRIVERS, OffloadSettings

__all__ = ["DRIVERS", "BlobStoreOffloader", "OffloadSettings", "OffloadedLedger", "OffloaderStatistics",
           "create_offloader"]
