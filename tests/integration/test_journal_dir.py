"""``magnetar standalone --journal-dir``: the embedded bookie's journal on its own directory
(its own disk, in production), the entry logs and index under ``--data-dir``.

Checks, on a real ``magnetar standalone`` process: acknowledged messages' journal records are in
the journal directory and nowhere under the data directory, and they survive a restart.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from consumers.launcher import running_standalone


def test_journal_directory_is_honoured(tmp_path: Path) -> None:
    data, journal = tmp_path / "data", tmp_path / "journal-disk"
    body = {"producerName": "p", "messages": [{"payload": f"m{i}"} for i in range(10)]}
    with running_standalone(data, "--journal-dir", str(journal)) as (url, _):
        response = httpx.post(f"{url}/topics/persistent/public/default/j", json=body, timeout=30)
        assert response.status_code == 200
        assert all(r["errorCode"] == 0 for r in response.json()["messagePublishResults"])
    assert list(journal.glob("*.jnl")) and (journal / "lastMark").exists()
    assert not list(data.rglob("*.jnl")) and (data / "bookie" / "entrylogs").is_dir()
    with running_standalone(data, "--journal-dir", str(journal)) as (url, _):
        read = httpx.get(f"{url}/topics/persistent/public/default/j/messages", params={"offset": 0},
                         headers={"accept": "application/json"}, timeout=30).json()
        assert [m["offset"] for m in read["messages"]] == list(range(10))
