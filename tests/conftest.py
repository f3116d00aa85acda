"""Shared fixtures: temporary data directories, the storage presets, and one ZooKeeper server
for the session (Debian's package, started on an ephemeral port, stopped by PID at the end)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.cluster_launcher import ZOOKEEPER_PACKAGE, running_zookeeper, zookeeper_available
from storage import LedgerStorage, StorageConfig


@pytest.fixture
def data_dir(tmp_path: Path) -> str:
    return str(tmp_path / "data")


@pytest.fixture
def storage(data_dir: str) -> Iterator[LedgerStorage]:
    st = LedgerStorage.open(data_dir, StorageConfig.test_min())
    try:
        yield st
    finally:
        st.close()


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``HOST:PORT`` of a ZooKeeper server shared by the session's tests (each uses its own
    chroot). ``make test`` installs Debian's package when it is missing."""
    if not zookeeper_available():
        pytest.fail(f"ZooKeeper is not installed: apt-get install {ZOOKEEPER_PACKAGE} (make test does)")
    with running_zookeeper(tmp_path_factory.mktemp("zookeeper")) as address:
        yield address
