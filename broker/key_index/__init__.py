"""The key index: per topic partition, key → version → offset (and the entry holding it), in RocksDB.

Role: an *event stream* is the messages with one key in one partition; its *version* is the
0-based number of the key's message (-1: the key has none). The key index numbers keyed
messages as they are appended, checks what a conditional append expects of its keys, and keeps
``(partition, key, version) → (offset, ledger, entry)`` so that one key's events are read
without scanning the partition (``broker/event_streams.py``).

The package, along the write path and then below it:

- ``reservations.py``: ``KeyReservation`` and the *tail*: versions given under the managed
  ledger's offset lock, visible once their entry is durable, withdrawn when it fails;
- ``rows.py``: the RocksDB layout and one partition's rows and watermarks;
- ``partition.py``: ``PartitionKeys``, a partition's tail and rows together: reads of a key's
  versions, writing confirmed reservations in batches, recovery after a restart, trimming;
- ``index.py``: ``KeyIndex``, the broker's one RocksDB and indexer thread, and its statistics.

Import from the package; its modules are its own business.

Invariants: a key's versions are dense and in offset order; a version, once acknowledged, never
changes; under the offset lock only dictionary work happens, never a RocksDB write; the index
is always a consistent prefix of its partition, rebuilt from the entries after the watermark on
open; the tail holds at most ``PENDING_ROWS_MAX`` rows (beyond, appends are refused with the
retriable ``KeyIndexBusy``); keys are at most ``KEY_BYTES_MAX`` bytes.
"""

from broker.key_index.index import KeyIndex, KeyIndexStats
from broker.key_index.partition import PartitionKeys
from broker.key_index.reservations import KeyReservation
from broker.key_index.rows import StreamRow

__all__ = ["KeyIndex", "KeyIndexStats", "KeyReservation", "PartitionKeys", "StreamRow"]
