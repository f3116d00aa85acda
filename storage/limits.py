"""The storage's fixed bounds: every limit of the bookie that is not a ``StorageConfig`` setting.

Role: one place where a reader finds how large, how many and how long anything in ``storage/``
may be (records, frames, scans, requests in flight, waits); the modules import their bounds from
here. The bounds an operator tunes (journal groups and files, caches, entry-log size, GC) are
``StorageConfig`` settings (``storage/config.py``). README's "All limits" table is generated
from this module and the config classes (``tools/limits_table.py``).

Invariants: every bound carries its unit in its name (``_BYTES``, ``_MS``, ``_S``, ``_US``,
``_ENTRIES``, ...) and a one-line docstring saying what it bounds; this module imports nothing.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB

# Records and files.
ENTRY_BYTES_MAX = 64 * MiB
"""One entry's payload in an entry-log record; a larger length marks the record as corrupt."""
RECORD_PAYLOAD_BYTES_MAX = 64 * MiB
"""One journal record's payload; a larger length ends the journal's replay there (a torn tail)."""
ENTRY_LOG_SCAN_CHUNK_BYTES = 4 * MiB
"""Bytes read at a time when an entry log is scanned (recovery, compaction)."""
JOURNAL_SCAN_CHUNK_BYTES = 4 * MiB
"""Bytes read at a time when the journal is replayed (a longer record is read whole)."""
FIRST_READ_BYTES = 4 * KiB
"""Bytes read with a record's header, so a small entry takes one read."""
READ_POSITIONS_MAX = 4096
"""Ledgers whose last entry-log read is remembered to tell sequential reads from jumps."""

# Flushes and the journal writer.
SLICE_ITEMS = 256
"""Flush work (entry-log appends, location writes) per slice: about 0.2 ms of holding the interpreter lock."""
SLICE_PAUSE_S = 0.00005
"""Pause between flush slices, so threads waiting for the interpreter lock take it then."""
FLUSH_RETRY_MS = 100
"""How soon a flush that failed transiently is tried again."""
GROUP_NAP_S = 0.0002
"""Longest single nap of the journal writer while it waits for more records of a group."""
CALLER_BACKSTOP_MS = 5.0
"""How often the journal writer looks for records the caller's thread left undrained."""
CALLER_IDLE_S = 1.0
"""The journal writer stops its backstop polling after this long without records at the caller."""
CALLER_FSYNC_US_MAX = 2_000
"""Groups go back to the writer thread while the last fdatasync took longer than this."""
CALLER_FSYNC_CALM_GROUPS = 64
"""Fdatasyncs in a row within ``CALLER_FSYNC_US_MAX`` before the caller's thread writes again
after a slow one: slow syncs come in clusters (writeback, the file system's own commits)."""

# The bookie's network protocol and server.
FRAME_BYTES_MAX = 8 * MiB
"""Largest bookie-protocol frame either side sends or accepts (a 5 MiB entry plus headers fits)."""
RANGE_BYTES_MAX = 4 * MiB
"""Data one READ_RANGE response carries (its first entry is always included)."""
RANGE_ENTRIES_MAX = 1000
"""Entries one READ_RANGE response carries."""
INFLIGHT_REQUESTS_MAX = 8192
"""Requests one bookie connection has unanswered before it stops being read (until half are answered)."""

# ZooKeeper registration.
SESSION_TIMEOUT_S = 10.0
"""ZooKeeper session of a bookie's registration: a bookie silent this long loses its node."""
CONNECT_TIMEOUT_S = 15.0
"""Time to connect to ZooKeeper at start."""
REGISTRATION_WAIT_S_MAX = 60.0
"""How long a registration waits for the node of this bookie's previous session to go."""
