"""Remote bookies behind the ``BookieClient`` seam: what a cluster broker writes its ledgers to.

Role: ``RemoteBookie`` is a ``Bookie`` (the shape ``LedgerHandle`` already uses in-process)
whose calls travel over ``broker/bookkeeper/bookie_network.py`` to a ``magnetar bookie`` process;
``RemoteBookieClient`` is the ``BookieClient`` of a cluster broker: it knows the bookies
registered in the coordination service and picks ensembles from them. Everything above the seam
(write sets, ack quorums, ordered completion, LAC, fencing, ensemble changes) is unchanged.

Reads go through a small read-ahead cache per bookie: a read that misses asks the bookie for a
range (the entries of ``entry..entry + read_ahead_entries - 1`` it holds) and keeps the rest,
so a catch-up reader pays one round trip per range instead of one per entry, as the bookie's
own read cache does for the disk. Entries are immutable once written, so a cached copy is
never stale; the cache is bounded in bytes and forgets a ledger when it is deleted.

Invariants: an add's future resolves only with the bookie's OK, sent after its journal fsync;
every failure of the network surfaces as ``BookieUnavailable`` (or a storage error the bookie
answered), which the ledger treats as a failed bookie.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

from broker.bookkeeper.bookie import Bookie, BookieClient, BookieUnavailable, StoredEntry, all_added, unpack_entry
from broker.bookkeeper.bookie_network import BookieConnection, BookieNetwork, BookieNetworkConfig
from broker.errors import NoSuchEntry, NoSuchLedger, NotEnoughBookies
from broker.limits import GROUP_BYTES_MAX
from broker.metadata.coordination import Coordination
from storage import Kind, Response, encode_add, encode_ledger_op, encode_read, encode_read_range

_STORED_HEADER = struct.Struct(">qq")  # as broker/bookkeeper/bookie.py packs it: piggybacked LAC, ledger length


@dataclass(frozen=True)
class RemoteBookieStats:
    bookie_id: str
    adds: int
    reads: int
    read_ahead_hits: int
    range_reads: int
    cached_bytes: int


class RemoteBookie:
    """One ``magnetar bookie`` at ``bookie_id`` (``host:port``)."""

    def __init__(self, bookie_id: str, network: BookieNetwork, client: RemoteBookieClient | None = None) -> None:
        self.bookie_id = bookie_id
        self._network = network
        self._connection: BookieConnection = network.connection(bookie_id)
        self._client = client
        self._cache: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._cache_bytes = 0
        self._cache_lock = threading.Lock()
        self.counters = dict.fromkeys(("adds", "reads", "read_ahead_hits", "range_reads"), 0)

    @property
    def available(self) -> bool:
        registered = self._client is None or self.bookie_id in self._client.registered()
        return registered and not self._connection.backing_off

    def statistics(self) -> RemoteBookieStats:
        c = self.counters
        return RemoteBookieStats(self.bookie_id, c["adds"], c["reads"], c["read_ahead_hits"], c["range_reads"],
                                 self._cache_bytes)

    # --- writes --------------------------------------------------------------------------------
    def add_entries(self, ledger_id: int, entry_ids: Sequence[int], lac: int,
                    entries: Sequence[tuple[int, bytes]], *, recovery: bool = False) -> Future[int]:
        """The entries in ADD requests of at most ``GROUP_BYTES_MAX`` bytes (a larger entry
        alone in its own) and at most half the connection's bound on adds in flight each, so a
        request never waits for an idle connection; one request for a usual group (a single
        entry is a group of one), one future for them all."""
        chunks: list[list[tuple[int, list[bytes]]]] = [[]]
        size = 0
        pack = _STORED_HEADER.pack
        entries_max = max(1, self._network.config.inflight_adds_max // 2)
        for entry_id, (length_bytes, payload) in zip(entry_ids, entries, strict=True):
            if chunks[-1] and (size + len(payload) > GROUP_BYTES_MAX or len(chunks[-1]) >= entries_max):
                chunks.append([])
                size = 0
            chunks[-1].append((entry_id, [pack(lac, length_bytes), payload]))
            size += len(payload)
        if len(chunks) == 1:
            return self._add(ledger_id, chunks[0], recovery)
        return all_added([partial(self._add, ledger_id, chunk, recovery) for chunk in chunks], entry_ids[-1])

    def _add(self, ledger_id: int, chunk: list[tuple[int, list[bytes]]], recovery: bool) -> Future[int]:
        self._connection.reserve_add(len(chunk))
        request_id = self._network.next_request_id()
        try:
            result: Future[int] = self._network.submit(self._connection, request_id,
                                                       encode_add(request_id, ledger_id, chunk, recovery=recovery),
                                                       adds=len(chunk), value=_entry_id)
        except BaseException:
            self._connection.release_add(len(chunk))
            raise
        self.counters["adds"] += len(chunk)
        return result

    def fence(self, ledger_id: int) -> Future[None]:
        request_id = self._network.next_request_id()
        result: Future[None] = self._network.submit(self._connection, request_id,
                                                    [encode_ledger_op(Kind.FENCE, request_id, ledger_id)],
                                                    value=_nothing)
        return result

    def delete_ledger(self, ledger_id: int) -> None:
        self._forget(ledger_id)
        request_id = self._network.next_request_id()
        try:
            self._call([encode_ledger_op(Kind.DELETE, request_id, ledger_id)], request_id)
        except NoSuchLedger:
            return

    # --- reads ---------------------------------------------------------------------------------
    def read_entry(self, ledger_id: int, entry_id: int) -> StoredEntry:
        self.counters["reads"] += 1
        with self._cache_lock:
            cached = self._cache.pop((ledger_id, entry_id), None)
            if cached is not None:
                self._cache_bytes -= len(cached)
                self.counters["read_ahead_hits"] += 1
                return unpack_entry(cached)
        config = self._network.config
        request_id = self._network.next_request_id()
        self.counters["range_reads"] += 1
        response = self._call([encode_read_range(request_id, ledger_id, entry_id,
                                                 entry_id + config.read_ahead_entries - 1,
                                                 entries_max=config.read_ahead_entries,
                                                 bytes_max=config.read_ahead_bytes_max)], request_id)
        found: bytes | None = None
        with self._cache_lock:
            for got_id, data in response.entries:
                if got_id == entry_id:
                    found = data
                elif got_id > entry_id:
                    self._remember(ledger_id, got_id, data)
        if found is None:
            raise NoSuchEntry(f"entry {ledger_id}:{entry_id} is not on bookie {self.bookie_id}")
        return unpack_entry(found)

    def read_payloads(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        return [entry.payload for entry in self.read_entries(ledger_id, first_entry_id, last_entry_id)]

    def read_entries(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[StoredEntry]:
        """Entries ``first..last``, in as few READ_RANGE requests as the response bound allows
        (each answer carries at least its first entry, so every request makes progress)."""
        config = self._network.config
        stored: list[StoredEntry] = []
        next_id = first_entry_id
        while next_id <= last_entry_id:
            request_id = self._network.next_request_id()
            self.counters["range_reads"] += 1
            response = self._call([encode_read_range(request_id, ledger_id, next_id, last_entry_id,
                                                     entries_max=last_entry_id - next_id + 1,
                                                     bytes_max=config.read_ahead_bytes_max)], request_id)
            for got_id, data in response.entries:
                if got_id != next_id:
                    break
                stored.append(unpack_entry(data))
                next_id += 1
            else:
                if response.entries:
                    continue
            raise NoSuchEntry(f"entry {ledger_id}:{next_id} is not on bookie {self.bookie_id}")
        self.counters["reads"] += len(stored)
        return stored

    def _last_entry(self, ledger_id: int) -> Response | None:
        request_id = self._network.next_request_id()
        try:
            return self._call([encode_read(request_id, ledger_id, -1)], request_id)
        except (NoSuchLedger, NoSuchEntry):
            return None

    def last_entry_id(self, ledger_id: int) -> int:
        response = self._last_entry(ledger_id)
        return -1 if response is None else response.entry_id

    def read_last_add_confirmed(self, ledger_id: int) -> int:
        response = self._last_entry(ledger_id)
        return -1 if response is None else unpack_entry(response.data).lac

    def _call(self, parts: list[bytes], request_id: int) -> Response:
        response = self._network.wait(self._network.submit(self._connection, request_id, parts))
        error = response.error()
        if error is not None:
            raise error
        return response

    # --- the read-ahead cache (under its lock) ----------------------------------------------------
    def _remember(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        key = (ledger_id, entry_id)
        if key in self._cache:
            return
        self._cache[key] = data
        self._cache_bytes += len(data)
        limit = self._network.config.read_cache_bytes_max
        while self._cache_bytes > limit and self._cache:
            _, evicted = self._cache.popitem(last=False)
            self._cache_bytes -= len(evicted)

    def _forget(self, ledger_id: int) -> None:
        with self._cache_lock:
            for key in [k for k in self._cache if k[0] == ledger_id]:
                self._cache_bytes -= len(self._cache.pop(key))


def _entry_id(response: Response) -> int:
    return response.entry_id


def _nothing(_: Response) -> None:
    return None


class RemoteBookieClient(BookieClient):
    """The bookies registered with ``coordination``, reached over one ``BookieNetwork``."""

    def __init__(self, coordination: Coordination, config: BookieNetworkConfig | None = None) -> None:
        # The base class's list of fixed bookies is replaced by the registered ones.
        self._coordination = coordination
        self._network = BookieNetwork(config)
        self._bookies: dict[str, Bookie] = {}
        self._remote: dict[str, RemoteBookie] = {}
        self._next = 0
        self._lock = threading.Lock()

    @property
    def network(self) -> BookieNetwork:
        return self._network

    def registered(self) -> list[str]:
        return self._coordination.available_bookies()

    def bookie(self, bookie_id: str) -> RemoteBookie:
        with self._lock:
            bookie = self._remote.get(bookie_id)
            if bookie is None:
                if ":" not in bookie_id:
                    raise BookieUnavailable(f"unknown bookie {bookie_id}")
                bookie = self._remote[bookie_id] = RemoteBookie(bookie_id, self._network, self)
            return bookie

    def bookies(self) -> list[Bookie]:
        return [self.bookie(b) for b in self.registered()]

    def new_ensemble(self, size: int, *, exclude: Sequence[str] = ()) -> list[str]:
        """``size`` distinct registered bookies not backing off after a failure, rotating."""
        ids = [b for b in self.registered() if b not in exclude and not self.bookie(b)._connection.backing_off]
        if len(ids) < size:
            raise NotEnoughBookies(f"need {size} available bookies, have {len(ids)}")
        with self._lock:
            start = self._next % len(ids)
            self._next += 1
        return [ids[(start + i) % len(ids)] for i in range(size)]

    def close(self) -> None:
        self._network.close()
