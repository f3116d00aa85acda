"""The web console's view of tiered storage, in a real headless Chromium against a real
``magnetar standalone`` offloading to an S3 API served over HTTP (moto's server).

A topic whose closed ledgers are offloaded (and deleted locally, lag 0) shows, on its Storage
tab, each ledger as ``offloaded`` and the open one as ``local``, with the offload's ``SUCCESS``;
once the store is stopped, another topic's offload shows ``ERROR`` with the error the admin API
gives (the store named, never its secret), ``/metrics`` says the topic's offload fails, and every
one of its ledgers stays ``local``. No page may log a script error.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver import Chrome as WebDriver
from selenium.webdriver.common.by import By

from tests.e2e.chromium import chromium_driver, page_errors, set_viewport
from tests.e2e.test_console import WIDE, Console
from tests.integration.test_tiered_storage import offload_config, wait_offload_status
from tests.offload_store import running_moto_s3
from tests.standalone import standalone_process

pytestmark = pytest.mark.browser

WAIT_S = 30.0
ENTRIES = 12
"""One message per entry, five entries per ledger: two closed ledgers and an open one."""


@pytest.fixture
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    driver = chromium_driver(tmp_path_factory.mktemp("chromium-profile"))
    try:
        set_viewport(driver, *WIDE)
        yield driver
        assert page_errors(driver) == []
    finally:
        driver.quit()


def _fill(http: httpx.Client, topic: str) -> None:
    for i in range(ENTRIES):
        sent = http.post(f"/topics/persistent/public/default/{topic}", json={"messages": [{"payload": f"m{i}"}]})
        assert sent.status_code == 200, sent.text


def _offload(http: httpx.Client, topic: str) -> dict[str, object]:
    admin = f"/admin/v2/persistent/public/default/{topic}"
    last = http.get(f"{admin}/lastMessageId").json()
    assert http.put(f"{admin}/offload", json={"ledgerId": last["ledgerId"], "entryId": last["entryId"]}
                    ).status_code == 204
    return wait_offload_status(http, admin)


def _stored_column(console: Console) -> list[str]:
    return [cell.text for cell in console.driver.find_elements(By.CSS_SELECTOR, "td[data-label='Stored']")]


def test_the_storage_tab_shows_offloaded_ledgers_and_an_offload_the_store_refused(
        tmp_path: Path, browser: WebDriver, screenshots_dir: Path) -> None:
    with running_moto_s3() as moto:
        config = offload_config(tmp_path, managedLedgerOffloadDriver="aws-s3", s3ManagedLedgerOffloadBucket=moto.bucket,
                                s3ManagedLedgerOffloadRegion="us-east-1",
                                s3ManagedLedgerOffloadServiceEndpoint=moto.endpoint,
                                managedLedgerOffloadDeletionLagMs="0")
        with standalone_process(tmp_path / "data", "--config", config, env=moto.env()) as (url, _), \
                httpx.Client(base_url=url, timeout=WAIT_S) as http:
            console = Console(browser, url, screenshots_dir)
            _fill(http, "tiered-ok")
            assert _offload(http, "tiered-ok")["status"] == "SUCCESS"
            console.open("/topic/public/default/tiered-ok/storage")
            # the deletion lag is 0: the next pass deletes the bookies' copies (the page refreshes)
            console.until(lambda: _stored_column(console) == ["offloaded", "offloaded", "local"],
                          "two offloaded ledgers and the open one local")
            assert console.stat("offload") == "SUCCESS"
            console.shoot("offloaded-ledgers")

            _fill(http, "tiered-refused")
            moto.stop()
            status = _offload(http, "tiered-refused")
            assert status["status"] == "ERROR" and moto.endpoint in str(status["lastError"]), status
            assert moto.secret_access_key not in str(status["lastError"])
            console.open("/topic/public/default/tiered-refused/storage")
            console.until(lambda: console.stat("offload") == "ERROR", "the offload's error")
            shown = console.text("[data-offload-error] .error-message")
            assert shown == status["lastError"], shown
            assert _stored_column(console) == ["local", "local", "local"]
            assert 'magnetar_topic_offload_failing{' in http.get("/metrics").text
            console.shoot("offload-error")
