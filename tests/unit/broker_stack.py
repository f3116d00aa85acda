"""A real broker stack for tests: embedded storage, bookie, RocksDB metadata, ledgers, cache."""

from __future__ import annotations

from dataclasses import dataclass

from broker.bookkeeper.bookie import BookieClient, LocalBookie
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.cursor import CursorManager
from broker.entry_cache import EntryCache
from broker.entry_format import Message, encode_entry
from broker.managed_ledger import ManagedLedger
from broker.managed_ledger_adds import AddResult
from broker.managed_ledger_config import ManagedLedgerConfig
from broker.managed_ledger_factory import ManagedLedgerFactory
from broker.metadata import RocksDBMetadataStore
from broker.offload.offloader import LedgerOffloader
from storage import LedgerStorage, StorageConfig


class FakeClock:
    """Injected time (seconds) that moves only when a test says so."""

    def __init__(self, now_s: float = 1_700_000_000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@dataclass
class Stack:
    storage: LedgerStorage
    store: RocksDBMetadataStore
    ledgers: LedgerManager
    factory: ManagedLedgerFactory
    clock: FakeClock
    cache: EntryCache

    def open(self, name: str, config: ManagedLedgerConfig | None = None) -> tuple[ManagedLedger, CursorManager]:
        ml = self.factory.open(name, config or ManagedLedgerConfig.test_min())
        return ml, CursorManager(ml, self.ledgers, self.store)

    def close(self) -> None:
        self.factory.close_all()
        self.store.close()
        self.storage.close()


def open_stack(data_dir: str, clock: FakeClock | None = None, storage_config: StorageConfig | None = None, *,
               offloader: LedgerOffloader | None = None) -> Stack:
    clock = clock or FakeClock()
    storage = LedgerStorage.open(f"{data_dir}/bookie", storage_config or StorageConfig.test_min())
    store = RocksDBMetadataStore(f"{data_dir}/metadata", clock=clock)
    ledgers = LedgerManager(store, BookieClient([LocalBookie("local", storage)]), clock)
    cache = EntryCache(1 << 20, clock=clock)
    factory = ManagedLedgerFactory(store, ledgers, cache, clock, offloader=offloader)
    return Stack(storage, store, ledgers, factory, clock, cache)


def append_messages(ml: ManagedLedger, payloads: list[bytes], *, key: str | None = None) -> AddResult:
    """``payloads`` as one entry of ``ml`` (straight to the managed ledger), waited for."""
    entry = encode_entry([Message(payload=p, key=key) for p in payloads], producer_name="test", sequence_id=0,
                         publish_time_ms=0)
    return ml.append([entry], [len(payloads)]).result(timeout=10)[0]
