"""The offloader of every driver: a closed ledger into a data object and an index object.

Role: ``BlobStoreOffloader`` is the ``LedgerOffloader`` (``offloader.py``) over one obstore store
(``stores.py``), writing and reading the format of ``format.py``. ``offload`` reads the source
ledger in runs and streams its blocks into ONE data object by a multipart upload (as Pulsar's
blob-store offloader does: one object per attempt keeps listing, deletion and the index small; blocks are
found by byte range, so nothing is gained from one object per block), then writes the index object.
``open`` reads and verifies the index once and returns an ``OffloadedLedger``, a ``ReadHandle`` that
answers ``read(first, last)`` with one range GET per block covering the range, verifying each
block's crc32c; fetched blocks are kept in the offloader's one block cache
(``OFFLOAD_BLOCK_CACHE_BYTES_MAX`` for every copy and reader together, always the last one), so a
sequential reader fetches each block once (the read-ahead). ``open`` and ``delete`` go to the store
the copy's recorded ``driver_metadata`` names, which may differ from today's settings. ``delete``
removes an attempt; ``list_attempts`` and ``delete_orphans`` find and remove the other attempts of a
ledger.

Invariants: the index is written only after the data object is durable, so an index names a complete
data object; an attempt without an index is an orphan no reader opens. Memory of an offload is
bounded in bytes whatever the ledger's size: one block being built (``max_block_size_bytes``, or one
larger entry; held as chunks of ``OFFLOAD_UPLOAD_CHUNK_BYTES``, ``format.py``, and let go of before
the next is built), one source run (``OFFLOAD_SOURCE_RUN_ENTRIES_MAX`` entries, about
``read_buffer_size_bytes``), and ``OFFLOAD_UPLOAD_REQUESTS_MAX + 1`` parts of
``OFFLOAD_UPLOAD_PART_BYTES`` (``broker/limits.py``). An open ``OffloadedLedger`` holds only its
index; fetched blocks are the block cache's, bounded for the whole broker (plus the blocks readers
are fetching at the moment). Every store failure is an ``OffloadError`` (reads:
``OffloadReadError``) naming the ledger, the object, the driver and the bucket or URI, never a
secret; the store's requests have bounded timeouts and retries.
"""

from __future__ import annotations

import bisect
import glob
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import obstore
from obstore.exceptions import BaseError, NotFoundError

from broker.errors import InvalidRequest, MagnetarError, NoSuchEntry, OffloadError, OffloadReadError
from broker.limits import (
    OFFLOAD_BLOCK_CACHE_BYTES_MAX,
    OFFLOAD_INDEX_OBJECT_BYTES_MAX,
    OFFLOAD_PACING_SLICE_S,
    OFFLOAD_SOURCE_RUN_ENTRIES_MAX,
    OFFLOAD_STORE_HANDLES_MAX,
    OFFLOAD_UPLOAD_PART_BYTES,
    OFFLOAD_UPLOAD_REQUESTS_MAX,
)
from broker.offload.format import (
    BlockInfo,
    CorruptOffload,
    OffloadIndex,
    data_object_name,
    decode_block,
    encode_blocks,
    index_object_name,
)
from broker.offload.offloader import ReadHandle
from broker.offload.settings import S3_DRIVERS, OffloadSettings
from broker.offload.stores import describe_failure, filesystem_directory, open_store
from broker.quotas import RateLimiter

if TYPE_CHECKING:
    from obstore.store import ObjectStore

_STORE_ERRORS = (BaseError, OSError)


@dataclass(frozen=True)
class OffloaderStatistics:
    """What an offloader did since it was built."""

    offloads: int = 0
    objects_written: int = 0
    bytes_written: int = 0
    objects_deleted: int = 0
    reads: int = 0
    read_bytes: int = 0
    errors: int = 0
    last_error: str = ""


@dataclass
class _Counters:
    lock: threading.Lock = field(default_factory=threading.Lock)
    values: OffloaderStatistics = field(default_factory=OffloaderStatistics)

    def add(self, **deltas: int) -> None:
        with self.lock:
            now = asdict(self.values)
            self.values = OffloaderStatistics(**{**now, **{k: now[k] + v for k, v in deltas.items()}})

    def failed(self, error: MagnetarError) -> MagnetarError:
        with self.lock:
            now = asdict(self.values)
            self.values = OffloaderStatistics(**{**now, "errors": now["errors"] + 1, "last_error": str(error)})
        return error


class _FlowPermits:
    """How fast offloads read from the bookies, every offload of one offloader together: at most
    Pulsar's ``managedLedgerOffloadFlowPermitsPerSecond`` bytes per second at all times (-1:
    unthrottled) and, while this broker takes publishes (``publishing``), at most
    ``managedLedgerOffloadFlowPermitsPerSecondWhilePublishing``: an offload yields the machine
    to the publish path while there is one and goes at full speed while there is none. A
    publishing spell starts with one second's permits (what was read before it is not charged to
    it). A run is never split: one larger than a second's permits is read, and the next run waits
    it off. The wait is in the offload's own thread, nothing else waits on it, in sleeps of at
    most ``OFFLOAD_PACING_SLICE_S`` so an offload that waited for publishing speeds up within one
    slice of publishing counting as stopped (``OFFLOAD_PUBLISHING_WINDOW_S`` after the last
    publish). Of a wait, the part the cap at all times would not have needed counts as waited
    for publishing."""

    def __init__(self, permits_per_second: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, *, while_publishing_per_second: int = -1,
                 publishing: Callable[[], bool] | None = None) -> None:
        self._clock = clock
        self._always = RateLimiter(0, permits_per_second, 1.0, clock) if permits_per_second > 0 else None
        self._while_publishing_per_second = while_publishing_per_second if publishing is not None else -1
        self._publishing = publishing
        self._spell: RateLimiter | None = None
        """The permits of the publishing spell now (None: nothing is being published)."""
        self._lock = threading.Lock()
        self._sleep = sleep
        self.waited_s = 0.0
        self.waited_for_publishing_s = 0.0

    def acquire(self) -> None:
        """Return once the bytes read so far are paid for."""
        if self._always is None and self._while_publishing_per_second <= 0:
            return
        while True:
            with self._lock:
                always_s, publishing_s = self._delays_locked()
                delay_s = min(max(always_s, publishing_s), OFFLOAD_PACING_SLICE_S)
                if delay_s <= 0:
                    return
                self.waited_s += delay_s
                self.waited_for_publishing_s += max(0.0, min(delay_s, publishing_s) - min(delay_s, always_s))
            self._sleep(delay_s)

    def _delays_locked(self) -> tuple[float, float]:
        """Seconds until the permits at all times and those of a publishing spell are paid."""
        always_s = 0.0
        if self._always is not None:
            self._always.refill()
            always_s = self._always.delay_s()
        if self._while_publishing_per_second <= 0 or self._publishing is None or not self._publishing():
            self._spell = None
            return always_s, 0.0
        if self._spell is None:
            self._spell = RateLimiter(0, self._while_publishing_per_second, 1.0, self._clock)
        self._spell.refill()
        return always_s, self._spell.delay_s()

    def consumed(self, size_bytes: int) -> None:
        with self._lock:
            for limiter in (self._always, self._spell):
                if limiter is not None:
                    limiter.consume(0, size_bytes)


class _BlockCache:
    """The blocks of offloaded copies fetched last, all copies of one offloader together,
    bounded in bytes (``OFFLOAD_BLOCK_CACHE_BYTES_MAX``; the block fetched last is kept even
    when it alone is larger): what a sequential reader reads next is usually in the block it
    read last."""

    def __init__(self, capacity_bytes: int) -> None:
        self._capacity_bytes = capacity_bytes
        self._blocks: OrderedDict[tuple[str, int], tuple[list[bytes], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int]) -> list[bytes] | None:
        with self._lock:
            found = self._blocks.get(key)
            if found is None:
                return None
            self._blocks.move_to_end(key)
            return found[0]

    def put(self, key: tuple[str, int], entries: list[bytes], size_bytes: int) -> None:
        with self._lock:
            if key in self._blocks:
                return
            self._blocks[key] = (entries, size_bytes)
            self._bytes += size_bytes
            while len(self._blocks) > 1 and self._bytes > self._capacity_bytes:
                _, (_, evicted_bytes) = self._blocks.popitem(last=False)
                self._bytes -= evicted_bytes

    @property
    def size_bytes(self) -> int:
        return self._bytes


@dataclass(frozen=True)
class _Place:
    """One store and the settings that name it (for messages)."""

    settings: OffloadSettings
    store: ObjectStore

    def where(self) -> str:
        return f"{self.settings.driver} {self.settings.location()}"


class BlobStoreOffloader:
    """A ``LedgerOffloader`` over one object store (and, for reading and deleting copies
    recorded elsewhere, over the stores their ``driver_metadata`` names)."""

    def __init__(self, settings: OffloadSettings, store: ObjectStore, *,
                 block_cache_bytes: int = OFFLOAD_BLOCK_CACHE_BYTES_MAX,
                 publishing: Callable[[], bool] | None = None) -> None:
        self.settings = settings
        self._home = _Place(settings, store)
        self._elsewhere: OrderedDict[tuple[tuple[str, str], ...], _Place] = OrderedDict()
        self._elsewhere_lock = threading.Lock()
        self._counters = _Counters()
        self.blocks = _BlockCache(block_cache_bytes)
        self.flow_permits = _FlowPermits(settings.flow_permits_per_second,
                                         while_publishing_per_second=settings.flow_permits_per_second_while_publishing,
                                         publishing=publishing)

    @property
    def driver_name(self) -> str:
        return self.settings.driver

    def driver_metadata(self) -> dict[str, str]:
        s = self.settings
        fields = {"bucket": s.bucket, "region": s.region, "serviceEndpoint": s.service_endpoint,
                  "fileSystemURI": s.file_system_uri}
        return {k: v for k, v in fields.items() if v}

    def statistics(self) -> dict[str, Any]:
        return {**asdict(self._counters.values), "flow_waited_ms": round(self.flow_permits.waited_s * 1000),
                "flow_waited_for_publishing_ms": round(self.flow_permits.waited_for_publishing_s * 1000)}

    def offload(self, source: ReadHandle, uuid: str, extra_metadata: dict[str, str]) -> None:
        ledger_id, lac = source.ledger_id, source.last_add_confirmed
        data_name = data_object_name(ledger_id, uuid)
        blocks: list[BlockInfo] = []
        stream = _BlockStream(source, blocks, self._run_entries(source), self.settings.max_block_size_bytes,
                              self.flow_permits)
        try:
            if lac < 0:
                obstore.put(self._home.store, data_name, b"", use_multipart=False)
            else:
                obstore.put(self._home.store, data_name, stream, use_multipart=True,
                            chunk_size=OFFLOAD_UPLOAD_PART_BYTES, max_concurrency=OFFLOAD_UPLOAD_REQUESTS_MAX)
            self._counters.add(objects_written=1, bytes_written=stream.offset)
            index = OffloadIndex(ledger_id=ledger_id, last_add_confirmed=lac, length_bytes=source.length_bytes,
                                 data_object=data_name, data_object_length_bytes=stream.offset,
                                 max_block_size_bytes=self.settings.max_block_size_bytes, blocks=tuple(blocks),
                                 extra_metadata=dict(extra_metadata))
            raw = index.encode()
            obstore.put(self._home.store, index_object_name(ledger_id, uuid), raw, use_multipart=False)
        except _STORE_ERRORS as exc:
            if stream.source_error is not None:
                raise self._fail(OffloadError(f"offload of ledger {ledger_id} stopped: reading the ledger failed: "
                                              f"{stream.source_error}")) from None
            raise self._fail(self._store_error(self._home, "offload", ledger_id, data_name, exc)) from None
        except MagnetarError as exc:
            raise self._fail(OffloadError(f"offload of ledger {ledger_id} stopped: reading the ledger failed: "
                                          f"{exc}")) from None
        self._counters.add(offloads=1, objects_written=1, bytes_written=len(raw))

    def _run_entries(self, source: ReadHandle) -> int:
        entries = source.last_add_confirmed + 1
        average = max(1, source.length_bytes // entries) if entries > 0 else 1
        return max(1, min(OFFLOAD_SOURCE_RUN_ENTRIES_MAX, self.settings.read_buffer_size_bytes // average))

    def open(self, ledger_id: int, uuid: str, driver_metadata: dict[str, str], driver_name: str = "") -> ReadHandle:
        name = index_object_name(ledger_id, uuid)
        place = self._place(driver_name, driver_metadata)
        try:
            result = obstore.get(place.store, name)
            if result.meta["size"] > OFFLOAD_INDEX_OBJECT_BYTES_MAX:
                raise CorruptOffload(f"index object of {result.meta['size']} bytes passes "
                                     f"{OFFLOAD_INDEX_OBJECT_BYTES_MAX}")
            index = OffloadIndex.decode(bytes(result.bytes()))
        except _STORE_ERRORS as exc:
            raise self._fail(self._store_error(place, "open", ledger_id, name, exc, read=True)) from None
        except CorruptOffload as exc:
            raise self._fail(self._read_error(place, ledger_id, name, str(exc))) from None
        if index.ledger_id != ledger_id or index.data_object != data_object_name(ledger_id, uuid):
            raise self._fail(self._read_error(place, ledger_id, name, f"the index is ledger {index.ledger_id}'s"))
        return OffloadedLedger(self, place, index)

    def delete(self, ledger_id: int, uuid: str, driver_metadata: dict[str, str], driver_name: str = "") -> None:
        """The index first (no reader trusts the attempt from then on), then the data; in a
        directory also the staging files (``{data object}#N``) of a multipart upload that was
        killed midway, which the store itself never removes. (An object store keeps such an
        upload open, unlisted: a bucket lifecycle rule that aborts incomplete multipart uploads
        after a day removes it, as the stores advise.)"""
        place = self._place(driver_name, driver_metadata)
        for name in (index_object_name(ledger_id, uuid), data_object_name(ledger_id, uuid)):
            try:
                obstore.delete(place.store, name)
            except (NotFoundError, FileNotFoundError):
                continue
            except _STORE_ERRORS as exc:
                raise self._fail(self._store_error(place, "delete", ledger_id, name, exc)) from None
            self._counters.add(objects_deleted=1)
        if place.settings.driver == "filesystem":
            directory = Path(filesystem_directory(place.settings.file_system_uri))
            for staging in directory.glob(f"{glob.escape(data_object_name(ledger_id, uuid))}#*"):
                staging.unlink(missing_ok=True)

    def list_attempts(self, ledger_id: int) -> dict[str, bool]:
        """Every attempt of ``ledger_id`` in this offloader's store: ``uuid`` → whether its index
        exists.
        Object stores list in key order from ``offset`` on, so the listing stops at the first
        other key; a directory lists in no order and is read whole."""
        prefix = f"{ledger_id}-"
        sorted_listing = self.settings.driver != "filesystem"
        attempts: dict[str, bool] = {}
        try:
            for chunk in obstore.list(self._home.store, None, offset=f"{ledger_id}-"):
                for meta in chunk:
                    path = meta["path"]
                    if not path.startswith(prefix):
                        if sorted_listing:
                            return attempts
                        continue
                    uuid = path[len(prefix):]
                    is_index = uuid.endswith("-index")
                    uuid = uuid.removesuffix("-index")
                    attempts[uuid] = attempts.get(uuid, False) or is_index
        except _STORE_ERRORS as exc:
            raise self._fail(self._store_error(self._home, "listing the attempts", ledger_id, prefix + "*",
                                               exc)) from None
        return attempts

    def delete_orphans(self, ledger_id: int, keep_uuid: str | None) -> list[str]:
        """Delete every attempt of ``ledger_id`` but ``keep_uuid`` (the one recorded complete, or
        None for all); returns the uuids deleted."""
        orphans = [uuid for uuid in self.list_attempts(ledger_id) if uuid != keep_uuid]
        for uuid in orphans:
            self.delete(ledger_id, uuid, {})
        return orphans

    def fetch_block(self, place: _Place, index: OffloadIndex, block_index: int) -> list[bytes]:
        """The entries of one block of an opened copy: one range GET, verified."""
        info = index.blocks[block_index]
        try:
            raw = obstore.get_range(place.store, index.data_object, start=info.offset, length=info.length)
            entries = decode_block(bytes(raw), info, index.block_entry_count(block_index))
        except _STORE_ERRORS as exc:
            raise self._fail(self._store_error(place, "read", index.ledger_id, index.data_object, exc,
                                               read=True)) from None
        except CorruptOffload as exc:
            raise self._fail(self._read_error(place, index.ledger_id, index.data_object, str(exc))) from None
        self._counters.add(reads=1, read_bytes=info.length)
        return entries

    def _fail(self, error: MagnetarError) -> MagnetarError:
        return self._counters.failed(error)

    def _place(self, driver_name: str, driver_metadata: dict[str, str]) -> _Place:
        """The store a copy was written to: this offloader's, or the one its recorded driver and
        ``driver_metadata`` name (another driver, bucket, endpoint or directory; built once, the
        ``OFFLOAD_STORE_HANDLES_MAX`` most recently used kept). ``aws-s3`` and ``s3`` are one
        kind of store."""
        driver = driver_name or self.settings.driver
        same_kind = driver == self.settings.driver or {driver, self.settings.driver} <= set(S3_DRIVERS)
        if same_kind and (not driver_metadata or driver_metadata == self.driver_metadata()):
            return self._home
        key = (("driver", driver), *sorted(driver_metadata.items()))
        with self._elsewhere_lock:
            place = self._elsewhere.get(key)
            if place is None:
                settings = replace(self.settings, driver=driver, bucket=driver_metadata.get("bucket", ""),
                                   region=driver_metadata.get("region", ""),
                                   service_endpoint=driver_metadata.get("serviceEndpoint", ""),
                                   file_system_uri=driver_metadata.get("fileSystemURI", ""))
                settings.validate()
                place = self._elsewhere[key] = _Place(settings, open_store(settings))
                while len(self._elsewhere) > OFFLOAD_STORE_HANDLES_MAX:
                    self._elsewhere.popitem(last=False)
            self._elsewhere.move_to_end(key)
            return place

    @staticmethod
    def _store_error(place: _Place, what: str, ledger_id: int, name: str, exc: BaseException, *,
                     read: bool = False) -> OffloadError:
        cls = OffloadReadError if read else OffloadError
        return cls(f"{what} of ledger {ledger_id} failed: object {name} on {place.where()}: {describe_failure(exc)}")

    @staticmethod
    def _read_error(place: _Place, ledger_id: int, name: str, reason: str) -> OffloadReadError:
        return OffloadReadError(f"read of offloaded ledger {ledger_id} failed: object {name} on {place.where()}: "
                                f"{reason}")


class _BlockStream:
    """The data object's bytes as an iterator of blocks, read from ``source`` in runs; records
    each block's ``BlockInfo`` and keeps the source's failure (the upload only sees that the
    iterator stopped with an error)."""

    def __init__(self, source: ReadHandle, blocks: list[BlockInfo], run_entries: int, block_bytes: int,
                 flow_permits: _FlowPermits) -> None:
        self._source = source
        self._flow_permits = flow_permits
        self._blocks = blocks
        self._run_entries = run_entries
        self._block_bytes = block_bytes
        self.offset = 0
        self.source_error: MagnetarError | None = None
        self._iter = self._generate()

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return next(self._iter)

    def _entries(self) -> Iterator[tuple[int, bytes]]:
        lac = self._source.last_add_confirmed
        for first in range(0, lac + 1, self._run_entries):
            last = min(lac, first + self._run_entries - 1)
            self._flow_permits.acquire()
            try:
                run = self._source.read(first, last)
            except MagnetarError as exc:
                self.source_error = exc
                raise
            self._flow_permits.consumed(sum(map(len, run)))
            yield from zip(range(first, last + 1), run, strict=True)

    def _generate(self) -> Iterator[bytes]:
        """The blocks' pieces as ``encode_blocks`` built them (chunks of about
        ``OFFLOAD_UPLOAD_CHUNK_BYTES``), each handed to the uploader as it is."""
        for block in encode_blocks(self._entries(), self._block_bytes):
            self._blocks.append(BlockInfo(block.first_entry_id, self.offset, block.length, block.crc32c))
            self.offset += block.length
            yield from block.pieces
            block.pieces.clear()  # handed over: the next block is built without this one held


class OffloadedLedger:
    """A ``ReadHandle`` of an offloaded copy: entries by range GETs of verified blocks."""

    def __init__(self, offloader: BlobStoreOffloader, place: _Place, index: OffloadIndex) -> None:
        self._offloader = offloader
        self._place = place
        self.index = index
        self.ledger_id = index.ledger_id
        self._starts = [b.first_entry_id for b in index.blocks]

    @property
    def last_add_confirmed(self) -> int:
        return self.index.last_add_confirmed

    @property
    def length_bytes(self) -> int:
        return self.index.length_bytes

    @property
    def extra_metadata(self) -> dict[str, str]:
        return dict(self.index.extra_metadata)

    def read(self, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        """Entries ``first..last`` inclusive, as ``LedgerHandle.read`` answers them."""
        if first_entry_id > last_entry_id:
            raise InvalidRequest(f"empty range {first_entry_id}..{last_entry_id}")
        if first_entry_id < 0 or last_entry_id > self.last_add_confirmed:
            raise NoSuchEntry(f"range {first_entry_id}..{last_entry_id} passes the LAC {self.last_add_confirmed} "
                              f"of offloaded ledger {self.ledger_id}")
        out: list[bytes] = []
        block_index = bisect.bisect_right(self._starts, first_entry_id) - 1
        while len(out) < last_entry_id - first_entry_id + 1:
            entries = self._block(block_index)
            start = self._starts[block_index]
            lo = max(first_entry_id, start) - start
            hi = min(last_entry_id, start + len(entries) - 1) - start
            out.extend(entries[lo:hi + 1])
            block_index += 1
        return out

    def read_entry(self, entry_id: int) -> bytes:
        return self.read(entry_id, entry_id)[0]

    def _block(self, block_index: int) -> list[bytes]:
        """A block's entries: from the offloader's block cache, else one range GET (outside
        any lock: two readers of one block may both fetch it)."""
        key = (self.index.data_object, block_index)
        cached = self._offloader.blocks.get(key)
        if cached is not None:
            return cached
        entries = self._offloader.fetch_block(self._place, self.index, block_index)
        self._offloader.blocks.put(key, entries, self.index.blocks[block_index].length)
        return entries
