"""The metadata store contract, run against every backend: RocksDB, the in-memory twin and
ZooKeeper (a real server, one chroot per store)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.errors import AlreadyExists, BadVersion, InvalidRequest, NotFound, StorageClosed
from broker.metadata import (
    DeleteOp,
    InMemoryMetadataStore,
    MetadataStore,
    Notification,
    NotificationType,
    PutOp,
    RocksDBMetadataStore,
    Stat,
)
from broker.metadata.rocksdb import node_key
from broker.metadata.zookeeper import ZooKeeperMetadataStore

REPO_ROOT = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture(params=["rocksdb", "memory", "zookeeper"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., MetadataStore]]:
    opened: list[MetadataStore] = []

    def factory(clock: Callable[[], float] | None = None) -> MetadataStore:
        store: MetadataStore
        if request.param == "rocksdb":
            store = RocksDBMetadataStore(str(tmp_path / "metadata"), clock=clock)
        elif request.param == "zookeeper":
            zookeeper = request.getfixturevalue("zookeeper")
            store = ZooKeeperMetadataStore.open(f"zk:{zookeeper}/contract-{uuid.uuid4().hex}", clock=clock)
        else:
            store = InMemoryMetadataStore(clock=clock)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: Callable[..., MetadataStore]) -> MetadataStore:
    return make_store()


# --- versions and CAS ---------------------------------------------------------------------------


def test_put_get_and_version_increments(make_store: Callable[..., MetadataStore]) -> None:
    clock = FakeClock(1000.0)
    store = make_store(clock)
    assert store.get("/a") is None and not store.exists("/a")
    created = store.put("/a", b"one")
    assert created == Stat("/a", b"one", 0, 1_000_000, 1_000_000)
    clock.now_s = 1001.5
    modified = store.put("/a", b"two")
    assert modified == Stat("/a", b"two", 1, 1_000_000, 1_001_500)
    assert store.put("/a", b"three").version == 2
    assert store.get("/a") == Stat("/a", b"three", 2, 1_000_000, 1_001_500)
    assert store.exists("/a")


def test_create_only(store: MetadataStore) -> None:
    assert store.put("/t", b"x", expected_version=-1).version == 0
    with pytest.raises(BadVersion):
        store.put("/t", b"y", expected_version=-1)
    with pytest.raises(AlreadyExists):
        store.create("/t", b"y")
    assert store.create("/u", b"z").version == 0
    stat = store.get("/t")
    assert stat is not None and stat.value == b"x" and stat.version == 0


def test_compare_and_set(store: MetadataStore) -> None:
    store.put("/c", b"0")
    assert store.put("/c", b"1", expected_version=0).version == 1
    with pytest.raises(BadVersion):
        store.put("/c", b"stale", expected_version=0)
    with pytest.raises(BadVersion):
        store.put("/missing", b"v", expected_version=0)  # Pulsar: a version on a missing node is a bad version
    assert store.get("/missing") is None
    stat = store.get("/c")
    assert stat is not None and stat.value == b"1" and stat.version == 1
    assert store.statistics().cas_failures == 2


def test_delete_with_version(store: MetadataStore) -> None:
    store.put("/d", b"v")
    store.put("/d", b"w")
    with pytest.raises(BadVersion):
        store.delete("/d", expected_version=0)
    assert store.exists("/d")
    store.delete("/d", expected_version=1)
    assert store.get("/d") is None
    with pytest.raises(NotFound):
        store.delete("/d")
    with pytest.raises(NotFound):
        store.delete("/d", expected_version=1)
    assert store.put("/d", b"again").version == 0  # recreated: versions restart


def test_values_are_bytes_exactly(store: MetadataStore) -> None:
    payload = bytes(range(256)) * 4
    store.put("/bin", payload)
    store.put("/empty", b"")
    assert store.get("/bin") == Stat("/bin", payload, 0, *_times(store, "/bin"))
    empty = store.get("/empty")
    assert empty is not None and empty.value == b""


def _times(store: MetadataStore, path: str) -> tuple[int, int]:
    stat = store.get(path)
    assert stat is not None
    return stat.created_ms, stat.modified_ms


# --- children and subtrees ----------------------------------------------------------------------


def test_children_sorted_with_implicit_parents(store: MetadataStore) -> None:
    for path in ["/ns/b", "/ns/a/x/y/z", "/ns/c", "/ns/a", "/ns/b-x/1", "/ns/b.y", "/ns/a0", "/other"]:
        store.put(path, b"")
    assert store.children("/ns") == ["a", "a0", "b", "b-x", "b.y", "c"]
    assert store.children("/") == ["ns", "other"]
    assert store.children("/ns/a") == ["x"]
    assert store.children("/ns/a/x") == ["y"]
    assert store.children("/ns/a/x/y/z") == []
    assert store.children("/nowhere") == []
    assert store.get("/ns/a/x") is None and not store.exists("/ns") and not store.exists("/")


def test_children_of_deep_and_wide_subtrees(store: MetadataStore) -> None:
    store.put_many({f"/t/{name}/ledgers/{i:04d}": b"" for name in ("p", "q", "r") for i in range(200)})
    store.put("/t/p", b"")
    store.put("/t/pp", b"")
    assert store.children("/t") == ["p", "pp", "q", "r"]
    assert len(store.children("/t/q/ledgers")) == 200
    assert store.children("/t/q/ledgers")[:2] == ["0000", "0001"]


def test_children_unicode_names_sort_by_code_point(store: MetadataStore) -> None:
    names = ["z", "é", "A", "中", "a b", "~"]
    for name in names:
        store.put(f"/u/{name}", b"")
    assert store.children("/u") == sorted(names)


def test_delete_leaves_descendants_delete_recursive_removes_subtree(store: MetadataStore) -> None:
    for path in ["/r", "/r/a", "/r/a/b", "/r/c", "/rr", "/r-1"]:
        store.put(path, b"")
    store.delete("/r")
    assert store.children("/r") == ["a", "c"]
    assert store.delete_recursive("/r") == 3
    assert store.children("/r") == []
    assert store.children("/") == ["r-1", "rr"]
    assert store.delete_recursive("/r") == 0
    assert store.delete_recursive("/") == 2
    assert store.children("/") == []


# --- watches ------------------------------------------------------------------------------------


def test_watch_notifications_and_cancel(store: MetadataStore) -> None:
    seen: list[Notification] = []
    handle = store.watch("/w", seen.append)
    everything: list[Notification] = []
    store.watch("/", everything.append)
    store.put("/w", b"")
    store.put("/w/a", b"1")
    store.put("/w/a", b"2")
    store.put("/wx", b"")  # a sibling with the same characters, not below /w
    store.delete("/w/a")
    assert seen == [
        Notification(NotificationType.CREATED, "/w"),
        Notification(NotificationType.CREATED, "/w/a"),
        Notification(NotificationType.MODIFIED, "/w/a"),
        Notification(NotificationType.DELETED, "/w/a"),
    ]
    assert len(everything) == 5
    assert store.statistics().watches == 2
    handle.cancel()
    handle.cancel()
    store.put("/w/b", b"")
    assert len(seen) == 4 and len(everything) == 6
    assert store.statistics().watches == 1


def test_failed_writes_notify_nothing(store: MetadataStore) -> None:
    seen: list[Notification] = []
    store.watch("/", seen.append)
    store.put("/f", b"")
    with pytest.raises(BadVersion):
        store.put("/f", b"", expected_version=7)
    with pytest.raises(NotFound):
        store.delete("/g")
    assert seen == [Notification(NotificationType.CREATED, "/f")]


def test_failing_callback_does_not_break_store(store: MetadataStore, caplog: pytest.LogCaptureFixture) -> None:
    def explode(_: Notification) -> None:
        raise RuntimeError("boom")

    seen: list[Notification] = []
    store.watch("/", explode)
    store.watch("/", seen.append)
    stat = store.put("/x", b"v")
    assert stat.version == 0 and store.exists("/x") and len(seen) == 1
    assert "boom" in caplog.text


def test_callback_may_use_the_store(store: MetadataStore) -> None:
    mirrored: list[str] = []

    def mirror(notification: Notification) -> None:
        if notification.type is NotificationType.CREATED:
            stat = store.get(notification.path)
            assert stat is not None
            store.put("/mirror" + notification.path, stat.value)
            mirrored.append(notification.path)

    store.watch("/src", mirror)
    store.put("/src/a", b"payload")
    assert mirrored == ["/src/a"]
    copy = store.get("/mirror/src/a")
    assert copy is not None and copy.value == b"payload"


def test_delete_recursive_notifies_each_node(store: MetadataStore) -> None:
    store.put_many({"/d": b"", "/d/a": b"", "/d/a/b": b""})
    seen: list[Notification] = []
    store.watch("/d", seen.append)
    store.delete_recursive("/d")
    assert seen == [Notification(NotificationType.DELETED, p) for p in ("/d/a/b", "/d/a", "/d")]


# --- transactions -------------------------------------------------------------------------------


def test_transaction_applies_all(store: MetadataStore) -> None:
    store.put("/ml/ledgers", b"[1]")
    store.put("/ml/old", b"")
    results = store.transaction(
        [
            PutOp("/ml/ledgers", b"[1,2]", expected_version=0),
            PutOp("/ml/cursor", b"{}", expected_version=-1),
            PutOp("/ml/cursor", b"{1}", expected_version=0),  # sees the op before it
            DeleteOp("/ml/old", expected_version=0),
        ]
    )
    assert [None if r is None else (r.path, r.version) for r in results] == [
        ("/ml/ledgers", 1),
        ("/ml/cursor", 0),
        ("/ml/cursor", 1),
        None,
    ]
    assert store.children("/ml") == ["cursor", "ledgers"]
    cursor = store.get("/ml/cursor")
    assert cursor is not None and cursor.value == b"{1}"
    assert store.transaction([]) == []


def test_transaction_all_or_nothing(store: MetadataStore) -> None:
    store.put("/tx/a", b"a0")
    store.put("/tx/b", b"b0")
    seen: list[Notification] = []
    store.watch("/", seen.append)
    before = store.statistics()
    with pytest.raises(BadVersion):
        store.transaction(
            [
                PutOp("/tx/a", b"a1", expected_version=0),
                PutOp("/tx/new", b"n", expected_version=-1),
                PutOp("/tx/b", b"b1", expected_version=5),  # fails: b is at version 0
                DeleteOp("/tx/a"),
            ]
        )
    with pytest.raises(NotFound):
        store.transaction([PutOp("/tx/a", b"a1"), DeleteOp("/tx/nothing")])
    with pytest.raises(InvalidRequest):
        store.transaction([PutOp("/tx/a", b"a1"), PutOp("bad", b"")])
    assert store.get("/tx/a") == Stat("/tx/a", b"a0", 0, *_times(store, "/tx/a"))
    b = store.get("/tx/b")
    assert b is not None and b.value == b"b0" and b.version == 0
    assert store.get("/tx/new") is None
    assert seen == []
    after = store.statistics()
    assert after.puts == before.puts and after.deletes == before.deletes
    assert after.cas_failures == before.cas_failures + 1


def test_put_many(store: MetadataStore) -> None:
    stats = store.put_many({"/m/a": b"1", "/m/b": b"2"})
    assert [(s.path, s.version) for s in stats] == [("/m/a", 0), ("/m/b", 0)]
    assert [s.version for s in store.put_many({"/m/a": b"3"})] == [1]


# --- JSON ---------------------------------------------------------------------------------------


def test_json_helpers(store: MetadataStore) -> None:
    assert store.get_json("/j") is None
    stat = store.put_json("/j", {"b": 1, "a": [1, 2]}, expected_version=-1)
    assert stat.value == b'{"a":[1,2],"b":1}'
    assert store.get_json("/j") == ({"a": [1, 2], "b": 1}, 0)
    store.put_json("/j", {"a": None}, expected_version=0)
    with pytest.raises(BadVersion):
        store.put_json("/j", {}, expected_version=0)
    assert store.get_json("/j") == ({"a": None}, 1)
    with pytest.raises(InvalidRequest):
        store.put_json("/j", {"x": object()})
    store.put("/raw", b"\xff not json")
    with pytest.raises(InvalidRequest):
        store.get_json("/raw")
    store.put("/list", b"[1]")
    with pytest.raises(InvalidRequest):
        store.get_json("/list")


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["", "a", "a/b", "//", "/a/", "/a//b", "/a/./b", "/a/../b", "/a\x00b", "/a\nb", "/" + "x" * 1024, "/\ud800"],
)
def test_invalid_paths(store: MetadataStore, path: str) -> None:
    with pytest.raises(InvalidRequest):
        store.put(path, b"")
    with pytest.raises(InvalidRequest):
        store.get(path)
    with pytest.raises(InvalidRequest):
        store.children(path)
    with pytest.raises(InvalidRequest):
        store.watch(path, lambda _: None)
    with pytest.raises(InvalidRequest):
        store.delete_recursive(path)


def test_invalid_arguments(store: MetadataStore) -> None:
    longest = "/" + "x" * 1023
    assert store.put(longest, b"").path == longest
    with pytest.raises(InvalidRequest):
        store.put("/", b"")  # the root holds no value
    with pytest.raises(InvalidRequest):
        store.delete("/")
    with pytest.raises(InvalidRequest):
        store.put("/v", b"", expected_version=-2)
    with pytest.raises(InvalidRequest):
        store.put("/v", "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        store.get(42)  # type: ignore[arg-type]
    assert store.get("/") is None


def test_statistics_and_close(store: MetadataStore) -> None:
    store.put("/s", b"")
    store.get("/s")
    store.exists("/nope")
    store.delete("/s")
    stats = store.statistics()
    assert (stats.gets, stats.puts, stats.deletes, stats.cas_failures, stats.watches) == (2, 1, 1, 0, 0)
    store.close()
    store.close()
    with pytest.raises(StorageClosed):
        store.get("/s")
    with pytest.raises(StorageClosed):
        store.put("/s", b"")


# --- concurrency --------------------------------------------------------------------------------


def test_concurrent_cas_increments_lose_no_update(store: MetadataStore) -> None:
    threads_count, attempts_per_thread = 8, 150
    store.put("/counter", b"0")
    successes = [0] * threads_count

    def worker(index: int) -> None:
        for _ in range(attempts_per_thread):
            stat = store.get("/counter")
            assert stat is not None
            try:
                store.put("/counter", str(int(stat.value) + 1).encode(), expected_version=stat.version)
            except BadVersion:
                continue
            successes[index] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    final = store.get("/counter")
    assert final is not None
    assert int(final.value) == sum(successes) == final.version
    assert store.statistics().cas_failures == threads_count * attempts_per_thread - sum(successes)


# --- RocksDB durability -------------------------------------------------------------------------


def test_rocksdb_persists_across_reopen(tmp_path: Path) -> None:
    db_path = str(tmp_path / "meta")
    with RocksDBMetadataStore(db_path, clock=FakeClock(5.0)) as first:
        first.put("/p/a", b"1")
        first.put("/p/a", b"2")
        first.put("/p/b/c", b"3")
        first.put("/gone", b"")
        first.delete("/gone")
    with RocksDBMetadataStore(db_path) as second:
        assert second.get("/p/a") == Stat("/p/a", b"2", 1, 5000, 5000)
        assert second.children("/p") == ["a", "b"]
        assert second.get("/gone") is None
        assert second.put("/p/a", b"3", expected_version=1).version == 2


def test_rocksdb_keys_keep_subtrees_contiguous() -> None:
    keys = sorted(node_key(p) for p in ["/a", "/a/b", "/a/b/c", "/a-b", "/a.b", "/ab", "/a/z"])
    subtree = [k for k in keys if k == node_key("/a") or k.startswith(node_key("/a") + b"\x00")]
    start = keys.index(node_key("/a"))
    assert keys[start : start + len(subtree)] == subtree


def test_rocksdb_write_survives_kill_9(tmp_path: Path) -> None:
    db_path = str(tmp_path / "meta")
    script = (
        "import os, signal, sys\n"
        "from broker.metadata import RocksDBMetadataStore\n"
        "store = RocksDBMetadataStore(sys.argv[1])\n"
        "store.put('/durable', b'before')\n"
        "store.put_many({'/durable': b'after', '/other': b'x'})\n"
        "store.put('/hint', b'unsynced', durable=False)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script, db_path], check=False, env=env, capture_output=True, timeout=60
    )
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()
    with RocksDBMetadataStore(db_path) as store:
        durable = store.get("/durable")
        assert durable is not None and durable.value == b"after" and durable.version == 1
        assert store.exists("/other")
        hint = store.get("/hint")  # not synced, but written: a dead process does not lose it
        assert hint is not None and hint.value == b"unsynced"


# --- ZooKeeper: several clients share one tree ------------------------------------------------------


def _zk_pair(zookeeper: str) -> tuple[ZooKeeperMetadataStore, ZooKeeperMetadataStore]:
    spec = f"zk:{zookeeper}/shared-{uuid.uuid4().hex}"
    return ZooKeeperMetadataStore.open(spec), ZooKeeperMetadataStore.open(spec)


def test_zookeeper_cas_between_sessions_and_unique_ledger_ids(zookeeper: str) -> None:
    first, second = _zk_pair(zookeeper)
    try:
        first.put("/shared", b"a")
        stat = second.get("/shared")
        assert stat is not None and stat.version == 0
        second.put("/shared", b"b", expected_version=0)
        with pytest.raises(BadVersion):
            first.put("/shared", b"stale", expected_version=0)  # the other session's write wins
        ids: list[int] = []
        generators = [first.ledger_id_generator(), second.ledger_id_generator()]

        failures: list[BaseException] = []

        def allocate(generator: Callable[[], int]) -> None:
            try:
                for _ in range(40):
                    ids.append(generator())
            except BaseException as exc:  # reported below: a thread's failure must fail the test
                failures.append(exc)

        threads = [threading.Thread(target=allocate, args=(g,)) for g in generators for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures  # contention between brokers is retried, never an allocation failure
        assert sorted(ids) == list(range(1, 161))  # no id handed out twice, none skipped
    finally:
        first.close()
        second.close()


def test_zookeeper_nodes_of_other_recipes_hold_no_value(zookeeper: str) -> None:
    store = ZooKeeperMetadataStore.open(f"zk:{zookeeper}/raw-{uuid.uuid4().hex}")
    try:
        store.client.create("/ledgers/available/127.0.0.1:3181", b"", ephemeral=True, makepath=True)
        store.client.create("/ledgers/idgen", b"41")
        store.put("/ledgers/7", b"{}")
        assert store.children("/ledgers") == ["7", "available", "idgen"]
        assert store.get("/ledgers/idgen") is None and store.get("/ledgers/available") is None
        store.delete("/ledgers/7")
        assert store.children("/ledgers") == ["available", "idgen"]
    finally:
        store.close()


def test_zookeeper_watch_reports_other_clients_changes_once(zookeeper: str) -> None:
    first, second = _zk_pair(zookeeper)
    seen: list[Notification] = []
    lock = threading.Lock()

    def record(notification: Notification) -> None:
        with lock:
            seen.append(notification)

    def wait_for(expected: Notification) -> None:
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            with lock:
                if expected in seen:
                    return
            time.sleep(0.02)
        raise AssertionError(f"{expected} never reported; got {seen}")

    try:
        first.put("/w/before", b"")  # exists before the watch: no notification for it
        first.watch("/w", record)
        first.put("/w/own", b"mine")  # reported once, synchronously, as with every backend
        assert seen == [Notification(NotificationType.CREATED, "/w/own")]
        second.put("/w/x", b"1")
        wait_for(Notification(NotificationType.CREATED, "/w/x"))
        second.put("/w/x", b"2")
        wait_for(Notification(NotificationType.MODIFIED, "/w/x"))
        second.put("/w/y/z", b"")
        second.put("/w/y", b"")  # a placeholder parent becomes a value
        wait_for(Notification(NotificationType.CREATED, "/w/y"))  # (changes seen before it is read coalesce)
        second.delete("/w/y")  # a value deleted under its child: the znode stays as a placeholder
        wait_for(Notification(NotificationType.DELETED, "/w/y"))
        second.delete("/w/x")
        wait_for(Notification(NotificationType.DELETED, "/w/x"))
        first.delete("/w/own")
        second.put("/elsewhere", b"")
        second.put("/w/last", b"")
        wait_for(Notification(NotificationType.CREATED, "/w/last"))
        with lock:
            own = [n for n in seen if n.path == "/w/own"]
            assert own == [Notification(NotificationType.CREATED, "/w/own"),
                           Notification(NotificationType.DELETED, "/w/own")]  # never echoed back
            assert all(n.path.startswith("/w/") for n in seen) and "/w/before" not in {n.path for n in seen}
    finally:
        first.close()
        second.close()
