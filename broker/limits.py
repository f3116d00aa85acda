"""The broker's fixed bounds: every limit of ``broker/`` that is not a ``BrokerConfig`` setting.

Role: one place where a reader finds how large, how many and how long anything the broker holds
or accepts may be: names, messages, policies, reads, caches, retries and waits. The modules
import their bounds from here. The bounds an operator tunes are settings: ``BrokerConfig``
(``broker/config.py``, with their ``standalone.conf`` keys), ``ManagedLedgerConfig`` and
``QuotaDefaults``. README's "All limits" table is generated from this module and the config
classes (``tools/limits_table.py``).

Invariants: every bound carries its unit in its name (``_BYTES``, ``_MS``, ``_S``, ``_ENTRIES``,
``_CHARS``, ...) and a one-line docstring saying what it bounds; this module imports nothing, so
any broker module may import it.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB

# Names and messages.
NAME_BYTES_MAX = 512
"""A topic's full name, and each of its tenant, namespace and local name."""
SUBSCRIPTION_NAME_BYTES_MAX = 256
"""A subscription's name."""
PARTITION_INDEX_MAX = 1_000_000
"""The index in a ``-partition-N`` topic name."""
PARTITIONS_MAX = 1024
"""Partitions of one partitioned topic."""
MESSAGE_SIZE_BYTES_MAX = 5 * MiB
"""One message's payload (Pulsar's ``maxMessageSize``; larger messages are chunked by clients)."""
CLIENT_ENTRY_OVERHEAD_BYTES_MAX = 64 * KiB
"""What a client's own entry may hold beyond its messages' bytes (metadata, batch headers)."""
UNCOMPRESSED_BYTES_MAX = 256 * MiB
"""An entry's declared uncompressed size: a guard against absurd sizes in corrupt metadata."""
KEY_BYTES_MAX = 1024
"""A message key (UTF-8 bytes): keys name event streams in the key index."""
EXPECTED_KEYS_MAX = 10_000
"""Keys one conditional append may expect a version of."""
MESSAGE_ID_TEXT_CHARS_MAX = 256
"""A message id in its text form (``ledger:entry[:partition[:batch]]`` or base64)."""
SCHEMA_BYTES_MAX = 1 * MiB
"""One schema definition."""
PATTERN_BYTES_MAX = 4096
"""A topics pattern (a regular expression run by RE2), before the edge's own bound."""

# Namespace policies: the ranges of accepted values.
RETENTION_TIME_MINUTES_MAX = 2**31 - 1
"""A namespace's ``retentionTimeInMinutes`` (Pulsar's ``int``)."""
RETENTION_SIZE_MB_MAX = 2**43 - 1
"""A namespace's ``retentionSizeInMB`` (8 EiB in bytes)."""
MESSAGE_TTL_SECONDS_MAX = 2**31 - 1
"""A namespace's ``messageTTL``."""
ROLE_NAME_CHARS_MAX = 256
"""A role named in a namespace grant."""
GRANTED_ROLES_MAX = 1000
"""Roles a namespace grants actions to."""
BUNDLES_MAX = 1024
"""Bundles of one namespace."""
ENSEMBLE_SIZE_MAX = 64
"""A persistence policy's ``bookkeeperEnsemble``."""
MARK_DELETE_RATE_MAX = 1_000_000.0
"""A persistence policy's ``managedLedgerMaxMarkDeleteRate`` (cursor positions persisted per second)."""
QUOTA_COUNT_MAX = 2**31 - 1
"""A producer, consumer, subscription or topic count quota (Pulsar's ``int``)."""
QUOTA_RATE_MESSAGES_MAX = 2**31 - 1
"""A publish or dispatch rate in messages per period."""
QUOTA_RATE_BYTES_MAX = 2**63 - 1
"""A publish or dispatch rate in bytes per period."""
QUOTA_RATE_PERIOD_S_MAX = 86_400
"""A dispatch rate's ``ratePeriodInSecond``."""
QUOTA_CONFIG_VALUE_MAX = 2**31 - 1
"""A quota or rate set in ``standalone.conf`` (0: unlimited)."""

# Reads.
READ_BATCH_ENTRIES = 100
"""Entries a reader (and a cursor, by default) reads from the managed ledger at a time."""
READER_READ_BYTES_MAX = 1 * MiB
"""Entry bytes a reader reads ahead at a time unless told otherwise (``dispatcherMaxReadSizeBytes``)."""
CURSOR_READ_BYTES_MAX = 5 * MiB
"""Entry bytes one cursor read returns unless told otherwise (one entry always)."""
READ_STEP_BYTES = 1 * MiB
"""Entry bytes a range read takes from storage per step at most (fewer when the read asks for
fewer bytes: what its last step read past its end is read for nothing)."""
READ_STEP_ENTRIES_MAX = 1000
"""Entries a range read takes from storage per step at most (fewer when it asks for fewer
messages: an entry holds at least one)."""
REPLAY_BATCH_ENTRIES = 100
"""Entries a topic replays from storage per step unless told otherwise."""
LIVE_READ_VERSIONS_MAX = 100
"""Versions a live key reader reads ahead at a time."""
LIVE_READ_BYTES_MAX = 1 * MiB
"""Payload bytes a live key reader reads ahead at most (one message always)."""
COMPACTION_APPEND_ENTRIES = 1000
"""Entries of the compacted ledger written per append (the compactor holds at most these)."""
RECOVERY_ENTRIES_MAX = 10_000_000
"""Entries a ledger recovery reads forward past the last add confirmed."""

# Memory held: caches and remembered state.
HEADS_CACHED_MAX = 100_000
"""Keys whose indexed head each key-index partition keeps in memory (least recently used go first)."""
POSITION_HINT_RANGES_MAX = 64
"""Ranges of entries recently read from a managed ledger whose positions are remembered (where each
range's successor starts among them): about one per sequential reader."""
POSITION_HINT_ENTRIES_MAX = 16_384
"""Entries' positions a managed ledger remembers over those reads (8 bytes each)."""
PARTITION_COUNTS_CACHED_MAX = 100_000
"""Partitioned topics whose partition count is cached."""
ISO_TIME_TEXTS_CACHED_MAX = 4096
"""ISO-8601 texts of whole seconds kept for reuse."""
OWN_DELETES_REMEMBERED_MAX = 100_000
"""Deletes by this broker whose echo from a ZooKeeper ``TreeCache`` is still expected."""
RECENT_ASSIGNMENTS_MAX = 10_000
"""Bundle assignments counted as load until the brokers' load reports catch up."""
TOPIC_WATCHERS_MAX = 10_000
"""Listeners following a namespace's topic list, over the whole broker."""
CURSOR_LEDGER_ENTRIES_MAX = 50_000
"""Entries of a cursor's own ledger before it rolls over (``managedLedgerCursorMaxEntriesPerLedger``)."""
ACKED_RANGES_PERSISTED_MAX = 10_000
"""Acknowledged ranges a cursor persists (Pulsar's ``managedLedgerMaxUnackedRangesToPersist``)."""
METADATA_PATH_BYTES_MAX = 1024
"""A metadata-store path (UTF-8 bytes)."""
METADATA_VALUE_BYTES_MAX = 16 * MiB
"""A metadata-store value."""
ZK_MULTI_OPS_MAX = 2000
"""Znodes one ZooKeeper ``multi`` deletes; a larger tree goes in batches from the leaves up."""
GROUP_BYTES_MAX = 1 * MiB
"""Payload bytes of one ADD_MANY request to a remote bookie (a larger entry goes alone)."""
DELETED_RANGES_SHOWN_MAX = 100
"""A cursor's acknowledged ranges shown in a topic's internal stats."""
UNKNOWN_IDS_REPORTED_MAX = 5
"""Unknown message ids named in one acknowledgement error."""

# Retries and attempts.
ZK_CONFLICT_RETRIES_MAX = 64
"""Reads and retries of one ZooKeeper compare-and-set whose version moved underneath."""
LEDGER_ID_CAS_TRIES_MAX = 200
"""Compare-and-set attempts for one ledger id before the allocation fails."""
SCHEMA_CAS_RETRIES_MAX = 5
"""Attempts to store a schema version against concurrent writers."""
LOOKUP_ATTEMPTS_MAX = 8
"""Rounds of read-owner / assign / acquire in one lookup before it answers 'not ready'."""
POLICY_CAS_ATTEMPTS_MAX = 16
"""Compare-and-set attempts of one namespace policy change."""
CURSOR_RESTORE_ATTEMPTS_MAX = 3
"""Restores of a cursor whose snapshot another broker changed between the read and the claim."""
READER_TRIM_RETRIES_MAX = 3
"""Reads a reader retries when the ledgers under its position were trimmed meanwhile."""
METADATA_MERGES_MAX = 16
"""Attempts to merge a ledger writer's metadata change with a re-replication worker's."""

# Times.
CURSOR_PERSIST_INTERVAL_S_MIN = 0.01
"""A cursor writes its state at most this often; acknowledgements in between share the next write."""
ACK_PERSIST_TIMEOUT_S = 60.0
"""How long an admin acknowledgement waits for its cursor to be stored."""
CURSOR_MOVE_WAIT_S_MAX = 60.0
"""How long a subscription's reset or skip waits for its cursor to move."""
DEAD_LETTER_WAIT_S_MAX = 60.0
"""How long a message moved to a dead-letter topic waits to be stored there."""
ZK_CALL_TIMEOUT_S = 10.0
"""Every bundle-ownership ZooKeeper call waits at most this long (kazoo would queue one forever)."""
ZK_WATCH_LOAD_TIMEOUT_S = 30.0
"""How long a ZooKeeper-backed watch waits for its first load of the tree."""
EPHEMERAL_WAIT_S_MAX = 60.0
"""How long a restarted broker waits for its previous session's load report node to expire."""
FUTURE_TIMEOUT_S = 60.0
"""How long a ledger operation waits for a bookie's answer (fence, recovery read, close)."""
COPY_TIMEOUT_S = 30.0
"""How long re-replication waits for one entry's copy to a new bookie."""
TIMEOUT_CHECK_INTERVAL_S = 0.05
"""How often the bookie client looks for requests past their timeout."""
LOOP_START_TIMEOUT_S = 10.0
"""How long the bookie client waits for its network thread to start or stop."""


# --- subscriptions, dispatch and managed-ledger reads (moved with the split of their modules) ---
PENDING_MESSAGES_MAX = 10_000
"""Messages one dispatch read is sized for at most, and held back in one dispatch round at most."""
REDELIVERY_COUNTS_PERSISTED_MAX = 10_000
"""Redelivery counts a subscription saves with its cursor (the lowest offsets first)."""
DEAD_LETTER_ACK_WAIT_S = 60.0
"""How long moving a message to its dead-letter topic waits for its acknowledgement on the source."""
ENTRIES_REMEMBERED_MAX = 4096
"""Entries a consumer that tracks ids remembers it was handed (their positions), to turn the ids
it is acked with into offsets without reading the entry again (the oldest are forgotten)."""
READ_HANDLES_MAX = 64
"""Read handles of closed ledgers a managed ledger keeps open (the least recently used are closed)."""
OFFLOAD_RETRY_DELAY_MS = 60_000
"""After a failed offload, a topic's offload threshold starts the next one no sooner than this
(the store is not asked again on every maintenance pass)."""
OFFLOAD_ORPHAN_DELETES_PER_SWEEP_MAX = 100
"""Offloaded copies of deleted topics a broker tries to delete again per sweep (one sweep every
``OFFLOAD_RETRY_DELAY_MS``, ``broker/offload/orphans.py``)."""
READ_RUN_ENTRIES_MAX = 256
"""Entries fetched from the bookies in one range read: the bookie reads them from its entry log
in one read (up to its ``read_ahead_bytes_max``), not each through its read cache. (1,000 read
no faster than 256: 2,000-entry reads measured alike in one sitting, ``bench/RESULTS.md``.)"""
LOOKUP_RUN_ENTRIES_MAX = 64
"""Entries of one range read of an offset lookup reading forward from its sparse-index sample
(one is sampled every 64 entries by default, so the offset is within one such run)."""
READ_RUN_BYTES_MAX = 1 * MiB
"""Bytes one range read fetches at most, at the ledger's average entry size (one entry always):
a lookup that reads forward to an offset or a time holds no more than this at once."""
CLOSE_ADDS_WAIT_S = 60.0
"""How long closing a managed ledger waits for its appends in flight to finish."""
LOAD_ATTEMPTS_MAX = 3
"""Loads of one managed ledger tried in a row while another writer changes its ledger list."""

# --- the key index (broker/key_index/): stored with its topic, in segments and a record ---
PENDING_ROWS_MAX = 1_000_000
"""Versions assigned but not yet in a segment, per partition, before appends are refused
(``key_index_busy``, retriable)."""
KEY_INDEX_ENTRY_ROWS_MAX = 900_000
"""Keyed messages and DCB index rows one entry may carry (refused beyond, not retried): below
``PENDING_ROWS_MAX`` by a checkpoint's rows, so replaying the entry after a crash always fits."""
KEY_HEADS_CACHED_MAX = 100_000
"""Keys whose stored head (last version and offset) each partition keeps in memory (least
recently used go first)."""
KEY_INDEX_CHECKPOINT_ROWS = 100_000
"""Confirmed rows in a partition's tail that start a checkpoint at once (and, while entries are
read again on open, the rows written per checkpoint)."""
KEY_INDEX_CHECKPOINT_INTERVAL_S = 10.0
"""The longest confirmed rows wait in the tail, and the longest a record's ``indexedTo`` lags
behind keyless appends (one record write per interval at most)."""
KEY_INDEX_CHECK_INTERVAL_S = 1.0
"""How often the checkpoint thread looks for partitions with a checkpoint due."""
KEY_INDEX_SEGMENTS_MAX = 8
"""Segments a partition keeps before they are merged into one."""
KEY_INDEX_BLOCK_CACHE_BYTES_MAX = 32 * MiB
"""Decoded segment blocks kept in memory, all partitions together."""
SEGMENT_BLOCK_BYTES_MAX = 16 * KiB
"""A segment's data block is cut once it holds this many bytes of rows (one row always fits)."""
SEGMENT_APPEND_ENTRIES = 64
"""Segment entries written per ledger append."""
SEGMENT_WRITE_WAIT_S = 60.0
"""How long a checkpoint waits for one append of a segment's entries."""
CLUSTERS_MAX = 64
"""Clusters a namespace may name in ``replication_clusters``."""

# --- dynamic consistency boundaries (broker/dcb.py): events with a type and tags, in the key index ---
DCB_TYPE_BYTES_MAX = 256
"""An event's type (UTF-8 bytes): a type names a derived stream of the key index."""
DCB_TAG_BYTES_MAX = 256
"""One tag of an event (UTF-8 bytes): a tag names a derived stream of the key index."""
DCB_TAGS_PER_EVENT_MAX = 32
"""Tags of one event (each is a row of the key index)."""
DCB_QUERY_ITEMS_MAX = 32
"""Items of one query (a read's, or an append condition's)."""
DCB_ITEM_TERMS_MAX = 32
"""Types, and tags, one query item names (each bound apart)."""
DCB_EVENTS_PER_APPEND_MAX = 1000
"""Events one DCB append stores (one entry, written whole or not at all)."""
DCB_READ_EVENTS_MAX = 10_000
"""Events one DCB read answers (a longer read is continued after its ``nextAfter``)."""
DCB_READ_ROWS_MAX = 20_000
"""Rows of derived streams one DCB read, or one condition check, examines (each names an entry
to read; a read stops there and says where to go on; a condition with more is refused: name a
rarer tag)."""
DCB_READ_ENTRY_BYTES_MAX = 64 * 1024 * 1024
"""Bytes of stored entries one DCB read, or one condition check, reads to look at candidate
events (an entry holds every event of its append: a read of one event per entry of many reads
them all). A read stops there and says where to go on; a condition that needs more is refused:
name a rarer tag."""
DCB_INDEX_ROWS_PER_PAGE = 1000
"""Rows of one derived stream a DCB read or condition takes from the key index at once."""
DCB_APPEND_ATTEMPTS_MAX = 8
"""Times a conditional DCB append checks its condition again when a key index checkpoint moved
the rows it checked between the check and the append."""

# --- the broker's recent rates (broker/rate_history.py) ---
RATE_HISTORY_SAMPLE_INTERVAL_S = 5.0
"""How often the maintenance pass adds a sample of the broker-wide rates to the history."""
RATE_HISTORY_SAMPLES_MAX = 60
"""Samples of the broker-wide rates kept (5 minutes at the sample interval): the console's
charts start from them."""

# --- the count of every topic's subscriptions (broker/subscription_census.py) ---
SUBSCRIPTION_CENSUS_INTERVAL_S = 30.0
"""How often the maintenance thread walks the metadata store again to count the subscriptions of
topics not loaded here (one read per topic)."""
SUBSCRIPTION_CENSUS_TOPICS_MAX = 100_000
"""Topics one census walk reads; past it the overview's count says it is incomplete."""

# --- tiered storage (broker/offload/): offloads into and reads from an object store ---
OFFLOAD_BLOCK_SIZE_BYTES_MIN = 1 * KiB
"""The smallest max block size an offloader accepts (stores use MiB; tests use small blocks)."""
OFFLOAD_BLOCK_SIZE_BYTES_MAX = 1024 * MiB
"""The largest max block size an offloader accepts: one block is held while offloading."""
OFFLOAD_READ_BUFFER_SIZE_BYTES_MAX = 1024 * MiB
"""The largest read buffer an offloader accepts: how much of a ledger one offload reads at a time."""
OFFLOAD_BLOCK_CACHE_BYTES_MAX = 128 * MiB
"""Blocks of offloaded copies an offloader keeps once fetched, every copy and reader together
(the least recently read go first; the block fetched last stays even when larger): two blocks of
Pulsar's default 64 MiB."""
OFFLOAD_UPLOAD_PART_BYTES = 5 * MiB
"""One part of a data object's multipart upload (S3's smallest part but the last)."""
OFFLOAD_UPLOAD_REQUESTS_MAX = 2
"""Parts of one data object uploaded at once."""
OFFLOAD_UPLOAD_CHUNK_BYTES = 1 * MiB
"""An offload builds each block as chunks of about this size (its entries joined as they are
read; an entry this large is a chunk of its own) and hands them to the uploader: each join is one
short copy under the interpreter lock, never a whole block's, and a block being built costs about
its own bytes, not a Python object per entry."""
OFFLOAD_SOURCE_RUN_ENTRIES_MAX = 256
"""Entries of one range read of a ledger being offloaded (fewer when the read buffer holds fewer
at the ledger's average entry size)."""
OFFLOAD_PUBLISHING_WINDOW_S = 1.0
"""An offload counts this broker as taking publishes while a publish was appended within this
many seconds (it then reads at ``managedLedgerOffloadFlowPermitsPerSecondWhilePublishing``)."""
OFFLOAD_PACING_SLICE_S = 0.1
"""The longest single sleep of an offload waiting for its flow permits: one that waited for
publishing goes back to full speed within this once publishing counts as stopped
(``OFFLOAD_PUBLISHING_WINDOW_S`` after the last publish)."""
OFFLOAD_INDEX_OBJECT_BYTES_MAX = 64 * MiB
"""An index object opened for reading; a larger one is refused as corrupt (a 1 TiB ledger in
64 MiB blocks indexes in under 0.5 MiB)."""
OFFLOAD_STORE_HANDLES_MAX = 8
"""Stores other than its configured one an offloader keeps open, for copies recorded with other
driver metadata (another bucket, endpoint or directory)."""
OFFLOAD_RETRIES_MAX = 10
"""The most retries of one failed store request an offloader may be set to."""
OFFLOAD_RETRY_BACKOFF_INITIAL_MS = 100
"""The first wait before a failed store request is tried again (doubling on each retry)."""
OFFLOAD_RETRY_BACKOFF_MS_MAX = 2000
"""The longest wait between two tries of one store request."""
