"""The key index: each topic partition's event streams, versioned on append, stored with the topic.

Role: an event store's one promise is that a stream's version is exact. The index numbers keyed
messages under the lock that assigns offsets (``partition.py``), keeps the rows that name each
version's offset and entry in segments on ledgers of the topic's own storage (``segment.py``),
records which segments make up the index in the topic's metadata (``checkpoint.py``), and is
opened by whichever broker serves the topic, after a restart, a failover or a bundle move
(``index.py``): it loads the checkpoint and reads only the entries after it. Nothing of it lives
on a broker's local disk. A DCB event's type and tags are numbered too, as derived streams
(``derived.py``), so reads and conditions by tag cost what a key's read costs.

The face: ``KeyIndex`` (the broker's), ``PartitionKeys`` (a partition's: reservations for the
append path, heads and rows for reads), ``KeyReservation``, ``StreamRow``, ``KeyIndexStats``.
"""

from broker.key_index.index import KeyIndex, KeyIndexStats
from broker.key_index.partition import KeyReservation, PartitionKeys
from broker.key_index.segment import StreamRow

__all__ = ["KeyIndex", "KeyIndexStats", "KeyReservation", "PartitionKeys", "StreamRow"]
