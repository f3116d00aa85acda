"""Shared fixtures: temporary data directories and the storage presets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
