"""The web console in a real headless Chromium against real ``magnetar standalone`` processes.

What a person would do, checked by its effect on the broker through its public APIs: the
overview's figures and charts move while a WebSocket producer runs; a topic (and a partitioned
topic) created in the console exists for the admin API, and so do a tenant, a namespace, its
retention, TTL and deduplication policies and a role's grant; a message produced in the console
reaches a WebSocket consumer with its key and properties; one key's event stream, appended with
expected versions between other keys' messages, shows only its events in version order, by pages,
and with an event produced in the console; a cursor reset by message id and by
time in the console changes the subscription's backlog as admin ``stats`` report it; the live
tail shows what a WebSocket producer sends, holds it while paused and keeps at most its bound
of rows; bad input shows what is wrong where it is (a produce form's broken properties named by
the field, a bad message id by exactly the API's message); a topic that does not exist is one
line with a way back to its namespace; a subscription row opens its consumers as ``stats`` give
them; a peek shows a subscription's next messages and leaves its backlog as it was; a namespace
or tenant that is not empty is refused deletion with the API's message, and deleted once empty;
the overview's subscription figure says what it counts; the Cluster page shows brokers, bookies
and each bundle's owner (or the API's refusal to name one); a namespace's topics filter and page;
a topic's Schema tab shows every version and the compatibility strategy; with token
authentication on, a wrong token is refused with the API's message, a role with namespace
grants produces and browses while the admin pages tell it why it may not see them, and a
superuser sees the overview. No page may log a script error.

One browser serves the module; each broker is a child process stopped by PID. Every wait is a
condition with a deadline (``WAIT_S``), never a sleep. Screenshots of the main pages, at
1280x800 and at 420 px wide (the whole page), go to the folder printed at the end of the run.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver import Chrome as WebDriver
from selenium.webdriver.common.alert import Alert
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from consumers.cli.tokens import create_token
from tests.e2e.chromium import chromium_driver, page_errors, screenshot, set_viewport
from tests.integration.ws_client import b64, open_ws, produce, recv_frame, send_frame, unb64, ws_base
from tests.standalone import standalone_process

pytestmark = pytest.mark.browser

WAIT_S = 30.0
WIDE = (1280, 800)
NARROW = (420, 900)
PRODUCER_RUN_S_MAX = 60.0
PRODUCER_MESSAGES_MAX = 200_000
SECRET = b"console-e2e-secret-key-of-32-byt"
NS = "persistent/public/default"

T = TypeVar("T")


# --- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    driver = chromium_driver(tmp_path_factory.mktemp("chromium-profile"))
    try:
        set_viewport(driver, *WIDE)
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with standalone_process(tmp_path_factory.mktemp("console-broker") / "data") as (url, _):
        yield url


@pytest.fixture(scope="module")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("console-secured")
    (folder / "secret.key").write_bytes(SECRET)
    (folder / "standalone.conf").write_text(
        f"authenticationEnabled=true\ntokenSecretKey=file://{folder / 'secret.key'}\nsuperUserRoles=admin\n")
    with standalone_process(folder / "data", "--config", str(folder / "standalone.conf")) as (url, _):
        yield url


@pytest.fixture(autouse=True)
def no_script_errors(browser: WebDriver) -> Iterator[None]:
    page_errors(browser)  # what an earlier test left
    yield
    assert page_errors(browser) == []


# --- driving the page --------------------------------------------------------------------------
class Console:
    def __init__(self, driver: WebDriver, url: str, screenshots: Path) -> None:
        self.driver = driver
        self.url = url
        self.screenshots = screenshots

    def open(self, route: str) -> None:
        self.driver.get(f"{self.url}/console#{route}")

    def until(self, condition: Callable[[], T | None], what: str) -> T:
        # a refresh replaces the figures' elements: one found just before it is read after it is gone
        value = WebDriverWait(self.driver, WAIT_S, poll_frequency=0.1,
                              ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda _: condition(), message=f"waiting for {what}")
        assert value is not None
        return value

    def find(self, css: str, within: WebElement | None = None) -> WebElement | None:
        found = (within or self.driver).find_elements(By.CSS_SELECTOR, css)
        return found[0] if found else None

    def visible(self, css: str) -> WebElement:
        def shown() -> WebElement | None:
            element = self.find(css)
            return element if element is not None and element.is_displayed() else None

        return self.until(shown, css)

    def one(self, css: str, within: WebElement | None = None) -> WebElement:
        element = self.find(css, within)
        assert element is not None, css
        return element

    def text(self, css: str) -> str:
        element = self.find(css)
        return element.text if element is not None else ""

    def type(self, name: str, text: str) -> WebElement:
        element = self.visible(f"[name='{name}']")
        element.clear()
        element.send_keys(text)
        return element

    def submit(self, name: str) -> None:
        """Press the submit button of the form holding the field ``name``."""
        form = self.visible(f"[name='{name}']").find_element(By.XPATH, "./ancestor::form")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

    def click(self, text: str) -> None:
        def enabled() -> WebElement | None:
            return next((b for b in self.driver.find_elements(By.TAG_NAME, "button")
                         if b.text == text and b.is_displayed() and b.is_enabled()), None)

        self.until(enabled, f"button {text}").click()

    def answer_confirm(self, accept: bool) -> str:
        """Answer the confirmation dialog the page opened (waiting for it); its text."""
        alert = self.until(lambda: _open_alert(self.driver), "a confirmation dialog")
        text = alert.text
        if accept:
            alert.accept()
        else:
            alert.dismiss()
        return text

    def stat(self, name: str) -> str:
        element = self.find(f"[data-stat='{name}'] .stat-value")
        return element.get_attribute("data-value") or "" if element is not None else ""

    def shoot(self, name: str) -> None:
        """The page at 1280x800, and whole at 420 px wide."""
        screenshot(self.driver, self.screenshots / f"{name}-1280x800.png")
        set_viewport(self.driver, *NARROW)
        try:
            self.until(lambda: self.driver.execute_script("return window.innerWidth") == NARROW[0], "narrow layout")
            screenshot(self.driver, self.screenshots / f"{name}-420px-full.png", full_page=True)
        finally:
            set_viewport(self.driver, *WIDE)


def _open_alert(driver: WebDriver) -> Alert | None:
    try:
        alert = driver.switch_to.alert
        _ = alert.text
        return alert
    except NoAlertPresentException:
        return None


@pytest.fixture
def console(browser: WebDriver, broker: str, screenshots_dir: Path) -> Console:
    return Console(browser, broker, screenshots_dir)


class BackgroundProducer:
    """A WebSocket producer sending until stopped (bounded in time and count)."""

    def __init__(self, url: str, topic: str) -> None:
        self.endpoint = f"{ws_base(url)}/ws/v2/producer/{NS}/{topic}"
        self.sent = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        assert self.error is None, self.error

    def _run(self) -> None:
        deadline = time.monotonic() + PRODUCER_RUN_S_MAX
        try:
            with open_ws(self.endpoint) as ws:
                while not self._stop.is_set() and time.monotonic() < deadline and self.sent < PRODUCER_MESSAGES_MAX:
                    results = produce(ws, [f"load {self.sent + i}" for i in range(20)])
                    assert all(r["result"] == "ok" for r in results), results
                    self.sent += len(results)
        except BaseException as exc:  # reported by __exit__
            self.error = exc


def admin(url: str, token: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, timeout=30, headers=headers)


# --- tests -------------------------------------------------------------------------------------
def test_overview_figures_and_charts_move_while_a_producer_runs(console: Console) -> None:
    console.open("/overview")
    console.until(lambda: console.stat("health") == "ok", "the health figure")
    assert console.stat("readOnly") == "writable"
    before = int(console.stat("msgInCounter"))
    with BackgroundProducer(console.url, "overview-load") as producer:
        console.until(lambda: float(console.stat("msgRateIn") or 0) > 0, "a message rate in")
        console.until(lambda: int(console.stat("msgInCounter")) > before, "the messages-in counter to grow")
        console.until(lambda: float(console.stat("fsyncP50") or 0) > 0, "an fsync latency")
        console.until(lambda: float(console.stat("loopStallMax") or 0) > 0, "an event loop stall figure")
        console.until(lambda: int(console.one("canvas.chart-canvas").get_attribute("data-points") or 0) >= 3,
                      "points on the charts")
        console.until(lambda: producer.sent > 0, "the producer to send")
        console.shoot("overview")
    assert console.stat("uptime") and float(console.stat("uptime")) > 0


def test_the_charts_begin_with_the_brokers_last_minutes(console: Console) -> None:
    """Traffic before the page was opened is on its charts: the broker samples its rates (the
    overview's ``history``) and the page begins with them, not with its own first poll."""
    def history() -> list[dict[str, float]]:
        with admin(console.url) as client:
            samples: list[dict[str, float]] = client.get("/admin/v2/broker-stats/overview").json()["history"]
            return samples

    with BackgroundProducer(console.url, "history-load"):
        console.until(lambda: any(s["msgRateIn"] > 0 for s in history()), "a sampled rate in")
    opened_ms = int(time.time() * 1000)
    sampled = [s for s in history() if s["timestamp"] < opened_ms]
    console.open("/overview")
    chart = console.one("canvas.chart-canvas")
    console.until(lambda: int(chart.get_attribute("data-points") or 0) > len(sampled), "the sampled points")
    assert int(chart.get_attribute("data-first-at") or opened_ms) <= sampled[0]["timestamp"] < opened_ms


def test_a_topic_created_in_the_console_exists_for_the_admin_api(console: Console) -> None:
    console.open("/ns/public/default")
    console.visible("[name='topic']")
    console.type("topic", "console-made")
    console.submit("topic")
    console.until(lambda: "Created persistent://public/default/console-made" in console.text(".notice-ok"),
                  "the creation notice")
    console.type("topic", "console-parts")
    console.type("partitions", "3")
    console.submit("topic")
    console.until(lambda: "with 3 partitions" in console.text(".notice-ok"), "the partitioned creation notice")
    with admin(console.url) as client:
        assert "persistent://public/default/console-made" in client.get("/admin/v2/persistent/public/default").json()
        assert client.get("/admin/v2/persistent/public/default/console-parts/partitions").json() == {"partitions": 3}
    console.until(lambda: console.find("tr[data-topic='console-parts']") is not None, "the new row")
    row = console.one("tr[data-topic='console-parts']")
    assert console.one("td[data-label='Partitions']", row).text == "3"
    again = console.type("topic", "console-made")
    console.type("partitions", "0")
    console.submit("topic")
    console.until(lambda: "already exists" in console.text(".action-slot .error-message"), "the API's refusal")
    assert again.get_attribute("value") == "console-made"
    console.shoot("namespace")


def test_namespace_policies_and_permissions_set_in_the_console_reach_the_admin_api(console: Console) -> None:
    console.open("/tenants")
    console.type("tenant", "console-tenant")
    console.type("adminRoles", "ops, audit")
    console.submit("tenant")
    console.until(lambda: "Tenant console-tenant created" in console.text(".notice-ok"), "the tenant")
    console.type("nsTenant", "console-tenant")
    console.type("namespace", "events")
    console.submit("namespace")
    console.until(lambda: console.find("a[href='#/ns/console-tenant/events']") is not None, "the namespace link")
    console.shoot("tenants")
    console.one("a[href='#/ns/console-tenant/events']").click()
    console.type("retentionMinutes", "-1")
    console.type("retentionMB", "512")
    console.submit("retentionMinutes")
    assert "512 MB" in console.answer_confirm(accept=True)  # a bound where there was none keeps less
    console.until(lambda: "Retention saved" in console.text(".notice-ok"), "the retention notice")
    console.type("ttlSeconds", "3600")
    console.submit("ttlSeconds")
    assert "3600 s" in console.answer_confirm(accept=True)
    console.until(lambda: "TTL saved" in console.text(".notice-ok"), "the TTL notice")
    Select(console.visible("[name='dedup']")).select_by_value("false")
    console.submit("dedup")
    console.until(lambda: "Deduplication saved" in console.text(".notice-ok"), "the dedup notice")
    console.type("role", "reporting")
    console.one("[name='produce']").click()  # consume only
    console.submit("role")
    console.until(lambda: console.text("td[data-label='Actions']") == "consume", "the grant in the table")
    with admin(console.url) as client:
        policies = client.get("/admin/v2/namespaces/console-tenant/events").json()
        assert client.get("/admin/v2/tenants/console-tenant").json()["adminRoles"] == ["ops", "audit"]
    assert policies["retention_policies"] == {"retentionTimeInMinutes": -1, "retentionSizeInMB": 512}
    assert policies["message_ttl_in_seconds"] == 3600 and policies["deduplicationEnabled"] is False
    assert policies["auth_policies"]["namespace_auth"] == {"reporting": ["consume"]}
    console.type("retentionMinutes", "-2")
    console.submit("retentionMinutes")
    console.until(lambda: "retentionTimeInMinutes must be -1 (unlimited) or 0..2147483647 minutes, not -2"
                  in console.text(".error-message"), "the API's refusal, stating the bound")


def test_the_retention_form_shows_what_the_broker_keeps_and_saves_only_what_was_changed(console: Console) -> None:
    """A namespace on the broker's default (unlimited) shows -1/-1 in words; Save without an edit
    stores nothing (it once stored 0/0, "keep nothing consumed"); a change that keeps less asks
    first, and saves nothing when refused."""
    with admin(console.url) as client:
        assert client.put("/admin/v2/namespaces/public/keep-all").status_code in (200, 204)
    console.open("/ns/public/keep-all")
    console.until(lambda: console.visible("[name='retentionMinutes']").get_attribute("value") == "-1",
                  "the broker's default retention in the form")
    assert console.visible("[name='retentionMB']").get_attribute("value") == "-1"
    assert console.text("[data-meaning='retention']") == "unlimited time, unlimited size (the broker's default)"
    assert console.text("[data-meaning='ttl']") == "messages never expire"
    console.submit("retentionMinutes")
    console.until(lambda: "Retention unchanged" in console.text(".notice-ok"), "the unchanged notice")
    console.submit("ttlSeconds")
    console.until(lambda: "TTL unchanged" in console.text(".notice-ok"), "the unchanged notice")
    console.type("retentionMinutes", "0")
    console.type("retentionMB", "0")
    assert console.text("[data-meaning='retention']").startswith("nothing consumed kept by time")
    console.submit("retentionMinutes")
    asked = console.answer_confirm(accept=False)
    assert "instead of unlimited time, unlimited size" in asked and "deleted" in asked, asked
    console.until(lambda: "Retention not changed" in console.text(".notice-ok"), "the refusal notice")
    with admin(console.url) as client:
        policies = client.get("/admin/v2/namespaces/public/keep-all").json()
        assert policies.get("retention_policies") is None, policies
        assert client.get("/admin/v2/namespaces/public/keep-all/retention").json() == {
            "retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    console.submit("retentionMinutes")
    console.answer_confirm(accept=True)
    console.until(lambda: "Retention saved" in console.text(".notice-ok"), "the retention notice")
    console.until(lambda: "(set on this namespace)" in console.text("[data-meaning='retention']"), "its source")
    console.shoot("retention")
    with admin(console.url) as client:
        assert client.get("/admin/v2/namespaces/public/keep-all").json()["retention_policies"] == {
            "retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
    console.click("Use the broker's default")
    console.answer_confirm(accept=True)
    console.until(lambda: "(the broker's default)" in console.text("[data-meaning='retention']"), "the default again")
    with admin(console.url) as client:
        assert client.get("/admin/v2/namespaces/public/keep-all").json().get("retention_policies") is None


def test_a_message_produced_in_the_console_reaches_a_websocket_consumer(console: Console) -> None:
    consumer_url = (f"{ws_base(console.url)}/ws/v2/consumer/{NS}/console-produce/ws-sub"
                    "?subscriptionInitialPosition=Earliest")
    with open_ws(consumer_url) as consumer:
        console.open("/topic/public/default/console-produce/messages")
        console.type("key", "order-17")
        console.type("properties", '{"origin": "console", "kind": "test"}')
        console.type("payload", '{"hello": "from the console", "n": 1}')
        console.submit("payload")
        console.until(lambda: "Stored: message id" in console.text(".notice-ok"), "the publish result")
        message = recv_frame(consumer)
        send_frame(consumer, {"messageId": message["messageId"]})
    assert unb64(message["payload"]) == b'{"hello": "from the console", "n": 1}'
    assert message["key"] == "order-17" and message["properties"] == {"origin": "console", "kind": "test"}
    console.click("Show it")
    card = console.visible("article.message.highlight")
    assert "order-17" in card.text and "origin=console" in card.text
    Select(console.visible("[name='view']")).select_by_value("json")
    console.until(lambda: '"hello": "from the console"' in console.text("article.message.highlight pre.json"),
                  "the pretty JSON payload")
    Select(console.visible("[name='view']")).select_by_value("hex")
    console.until(lambda: "7b 22 68 65 6c 6c 6f" in console.text("article.message.highlight pre.hex"),
                  "the hex payload")
    Select(console.visible("[name='view']")).select_by_value("json")
    console.shoot("messages")


def test_a_key_stream_shows_only_its_events_in_version_order(console: Console) -> None:
    path = "/topics/persistent/public/default/console-stream"
    appends = [(-1, [("order-7", "opened"), ("order-8", "other"), ("order-7", "item added")]),
               (1, [("order-8", "other again"), ("order-7", "item removed"), ("order-7", "paid")])]
    with admin(console.url) as client:
        for expected, events in appends:
            body = {"expectedKeyVersions": {"order-7": expected},
                    "messages": [{"key": key, "payload": payload} for key, payload in events]}
            answer = client.post(path, json=body)
            assert answer.status_code == 200, answer.text
        assert client.get(f"{path}/keys/order-7").json()["version"] == 3
    console.open("/topic/public/default/console-stream/messages")
    console.type("streamKey", "order-7")
    console.submit("streamKey")

    def shown() -> list[tuple[str, str]]:
        """(version, payload) of each card, read in one go (the list may be replaced meanwhile)."""
        cards = console.driver.execute_script(
            "return Array.from(document.querySelectorAll('article.message'), "
            "(card) => [card.dataset.version || '', card.querySelector('pre').textContent]);")
        return [(version, text) for version, text in cards]

    stream = [("0", "opened"), ("1", "item added"), ("2", "item removed"), ("3", "paid")]
    console.until(lambda: shown() == stream or None, "the stream of order-7 in version order")
    assert "versions 0 \u2013 3 of 0 \u2013 3" in console.text(".list-summary")
    console.type("count", "2")
    console.type("fromVersion", "1")
    console.submit("fromVersion")
    console.until(lambda: shown() == stream[1:3] or None, "versions 1 and 2")
    console.click("Later ▶")
    console.until(lambda: shown() == stream[3:] or None, "the next page, version 3")
    console.type("count", "20")
    console.type("key", "order-7")
    console.type("payload", "shipped")
    console.submit("payload")
    console.until(lambda: "version 4 of key order-7" in console.text(".notice-ok"), "the new event's version")
    console.click("Show its stream")
    console.until(lambda: shown() == [*stream, ("4", "shipped")] or None, "the stream with the new event")
    assert console.one("article.message.highlight").get_attribute("data-version") == "4"
    console.shoot("stream")


def test_bad_input_shows_the_api_error_message(console: Console) -> None:
    broken = '{"origin": '
    body = f'{{"producerName":"magnetar-console","messages":[{{"payload":"x","properties":{broken}}}]}}'
    with admin(console.url) as client:
        client.put("/admin/v2/persistent/public/default/console-bad")
        expected_produce = client.post("/topics/persistent/public/default/console-bad", content=body,
                                       headers={"content-type": "application/json"}).json()
        expected_id = client.get("/topics/persistent/public/default/console-bad/offsetOf",
                                 params={"messageId": "zz:1"}).json()
    assert expected_produce["code"] == "invalid_request" and expected_id["code"] == "invalid_request"
    console.open("/topic/public/default/console-bad/messages")
    console.type("properties", broken)
    console.type("payload", "x")
    console.submit("payload")
    produce_error = console.visible(".produce-form + .action-slot .error")
    # named by the form's field, not by a column of a request the user never saw
    assert produce_error.get_attribute("data-code") == "invalid_properties"
    shown = console.one(".error-message", produce_error).text
    assert shown.startswith("Properties: not a JSON object (") and expected_produce["message"] not in shown, shown
    console.type("properties", '["a"]')
    console.submit("payload")
    console.until(lambda: console.text(".produce-form + .action-slot .error-message")
                  == "Properties: a JSON object of names and values, not an array", "the refusal of an array")
    console.type("messageId", "zz:1")
    console.submit("messageId")
    console.until(lambda: console.text(".panel .action-slot .error-message") == expected_id["message"],
                  "the API's message about the message id")
    with admin(console.url) as client:
        assert client.get("/topics/persistent/public/default/console-bad/offsets").json()["offsets"][
            "persistent://public/default/console-bad"]["next"] == 0  # the refused produce wrote nothing


def test_reset_cursor_in_the_console_changes_the_backlog(console: Console) -> None:
    topic = "/admin/v2/persistent/public/default/console-cursor"
    with admin(console.url) as client:
        ids = [client.post("/topics/persistent/public/default/console-cursor",
                           json={"messages": [{"payload": f"m{i}"}]}).json()["messagePublishResults"][0]["messageId"]
               for i in range(10)]
        assert client.put(f"{topic}/subscription/audit", json="latest").status_code == 204

        def backlog() -> int:
            return int(client.get(f"{topic}/stats").json()["subscriptions"]["audit"]["msgBacklog"])

        assert backlog() == 0
        console.open("/topic/public/default/console-cursor/overview")
        console.until(lambda: console.find("[name='subscription'] option[value='audit']") is not None,
                      "the subscription in the actions")
        Select(console.visible("[name='subscription']")).select_by_value("audit")
        console.type("resetMessageId", ids[3])
        console.submit("resetMessageId")
        console.until(lambda: "reset to offset 3" in console.text(".notice-ok"), "the reset notice")
        assert backlog() == 7
        console.until(lambda: console.text("tr[data-subscription='audit'] td[data-label='Backlog']") == "7",
                      "the table to show the new backlog")
        console.type("resetTime", "0")
        console.submit("resetTime")
        console.until(lambda: "reset to messages published from" in console.text(".notice-ok"), "the time reset")
        assert backlog() == 10
        console.type("resetMessageId", "not-an-id!")
        console.submit("resetMessageId")
        console.until(lambda: "not-an-id!" in console.text(".action-slot .error-message"), "the API's refusal")
        assert backlog() == 10
    console.shoot("topic")
    console.open("/topic/public/default/console-cursor/storage")
    console.until(lambda: console.find("td[data-label='Cursor']") is not None, "the cursors table")
    console.shoot("ledgers")


def test_live_tail_shows_what_a_websocket_producer_sends_and_holds_it_while_paused(console: Console) -> None:
    with admin(console.url) as client:
        assert client.put("/admin/v2/persistent/public/default/console-tail").status_code == 204
    console.open("/topic/public/default/console-tail/tail")
    console.click("Start")
    console.until(lambda: console.find(".tail-status[data-state='live']") is not None, "the tail to be live")
    rows = "table.tail tbody tr"
    endpoint = f"{ws_base(console.url)}/ws/v2/producer/{NS}/console-tail"
    with open_ws(endpoint) as producer:
        produce(producer, [f"tail-{i}" for i in range(5)], key="k")
        console.until(lambda: len(console.driver.find_elements(By.CSS_SELECTOR, rows)) == 5, "five rows")
        shown = [e.text for e in console.driver.find_elements(By.CSS_SELECTOR, f"{rows} td.tail-payload")]
        assert shown == [f"tail-{i}" for i in reversed(range(5))]
        console.click("Pause")
        console.until(lambda: console.find(".tail-status[data-state='paused']") is not None, "the pause")
        produce(producer, [f"held-{i}" for i in range(3)])
        console.until(lambda: "3 waiting" in console.text(".tail-counter"), "three held messages")
        assert len(console.driver.find_elements(By.CSS_SELECTOR, rows)) == 5
        console.click("Resume")
        console.until(lambda: len(console.driver.find_elements(By.CSS_SELECTOR, rows)) == 8, "the held rows")
    console.shoot("tail")
    with admin(console.url) as client:
        many = {"messages": [{"payload": f"bulk-{i}"} for i in range(250)]}
        assert client.post("/topics/persistent/public/default/console-tail", json=many).status_code == 200
    console.until(lambda: "258 received · 200 shown" in console.text(".tail-counter"), "the bounded rows")
    assert len(console.driver.find_elements(By.CSS_SELECTOR, rows)) == 200
    assert console.text(f"{rows}:first-child td.tail-payload") == "bulk-249"
    console.click("Stop")
    console.until(lambda: console.find(".tail-status[data-state='stopped']") is not None, "the tail to stop")


def test_with_token_auth_a_wrong_token_is_refused_and_a_permitted_one_works(
        browser: WebDriver, secured_broker: str, screenshots_dir: Path) -> None:
    console = Console(browser, secured_broker, screenshots_dir)
    superuser = create_token("admin", secret_key=SECRET)
    with admin(secured_broker, superuser) as client:
        assert client.post("/admin/v2/namespaces/public/default/permissions/app",
                           json=["produce", "consume"]).status_code == 204
        assert client.put("/admin/v2/persistent/public/default/secured").status_code == 204
        refused = httpx.get(f"{secured_broker}/admin/v2/broker-stats/overview",
                            headers={"Authorization": "Bearer not-a-token"}).json()["message"]
    console.open("/overview")
    console.until(lambda: "authentication required" in console.text(".auth-panel .error-message"),
                  "the request for a token")
    console.type("token", "not-a-token")
    console.submit("token")
    console.until(lambda: console.text(".auth-panel .error-message") == refused, "the API's refusal of the token")
    assert "not kept" in console.text(".auth-panel .notice-warn")
    console.shoot("token")

    console.type("token", create_token("app", secret_key=SECRET))
    console.submit("token")
    console.until(lambda: "Signed in as app" in console.text("#banner"), "the sign-in")
    console.until(lambda: "is not a superuser" in console.text(".status-slot .error-message"), "the overview's 403")
    console.open("/topic/public/default/secured/messages")
    console.type("payload", "from a permitted role")
    console.submit("payload")
    console.until(lambda: "Stored: message id" in console.text(".notice-ok"), "the publish result")
    console.click("Show it")
    console.until(lambda: "from a permitted role" in console.text("article.message.highlight pre"),
                  "the message read back through the range read")
    with admin(secured_broker, superuser) as client:
        stored = client.get("/topics/persistent/public/default/secured/messages", params={"offset": 0}).json()
        assert [unb64(m["payload"]) for m in stored["messages"]] == [b"from a permitted role"]
    console.open("/topic/public/default/secured/overview")
    console.until(lambda: "is not an admin of tenant" in console.text(".panel .error-message"), "the stats' 403")
    console.shoot("forbidden")

    console.click("Change")
    console.type("token", superuser)
    console.submit("token")
    console.open("/overview")
    console.until(lambda: console.stat("health") == "ok", "the overview for a superuser")
    console.click("Sign out")
    console.until(lambda: "no token" in console.text("#who"), "the sign-out")


def test_payload_views_render_text_json_and_hex_of_binary_data(console: Console) -> None:
    with admin(console.url) as client:
        body = {"payloadEncoding": "base64", "messages": [{"payload": b64(bytes(range(0, 40)))}]}
        assert client.post("/topics/persistent/public/default/console-binary", json=body).status_code == 200
    console.open("/topic/public/default/console-binary/messages")
    console.until(lambda: console.find("article.message") is not None, "the newest messages")
    # the text view (the default) shows binary as hex, not as mojibake
    assert console.text("article.message .binary-note") == "Binary (not UTF-8 text): shown as hex."
    assert console.text("article.message pre.hex").startswith("00000000  00 01 02 03")
    Select(console.visible("[name='view']")).select_by_value("hex")
    console.until(lambda: console.text("article.message pre.hex").startswith("00000000  00 01 02 03"),
                  "the hex dump")
    Select(console.visible("[name='view']")).select_by_value("json")
    console.until(lambda: "Not JSON" in console.text("article.message"), "the note that it is not JSON")


def test_search_finds_messages_by_key_property_text_and_time(console: Console) -> None:
    """The Messages tab's search reads the partition and shows only what matches every condition
    given, and says what it read."""
    topic = "/topics/persistent/public/default/console-search"
    with admin(console.url) as client:
        early = [{"payload": f"order {i} shipped" if i % 3 == 0 else f"order {i} paid", "key": f"k{i % 4}",
                  "properties": {"region": "eu" if i % 2 else "us"}} for i in range(40)]
        assert client.post(topic, json={"messages": early}).status_code == 200
        time.sleep(0.05)  # a publish time after the first batch's
        between_ms = int(time.time() * 1000)
        time.sleep(0.05)
        late = [{"payload": "order late shipped", "key": "k0", "properties": {"region": "eu"}}]
        assert client.post(topic, json={"messages": late}).status_code == 200
    console.open("/topic/public/default/console-search/messages")
    console.until(lambda: console.find("article.message") is not None, "the newest messages")
    console.one("details.search-panel summary").click()

    def search(**fields: str) -> list[str]:
        for name in ("searchKey", "searchProperty", "searchText", "searchFrom", "searchTo"):
            console.type(name, fields.get(name, ""))
        console.one("form.search button[type='submit']").click()
        console.until(lambda: console.text(".list-summary").startswith("Search: ")
                      or console.find(".action-slot .error") is not None, "the search's summary or its refusal")
        return [card.text for card in console.driver.find_elements(By.CSS_SELECTOR, "article.message pre.payload")]

    # keys k0 at i = 0, 4, ..., 36; "shipped" at i % 3 == 0; region eu at odd i: i = 12, 24, 36 are k0 & shipped
    assert search(searchKey="k0", searchText="shipped") == ["order 0 shipped", "order 12 shipped",
                                                            "order 24 shipped", "order 36 shipped",
                                                            "order late shipped"]
    assert search(searchKey="k0", searchProperty="region=eu") == ["order late shipped"]
    console.shoot("search")
    assert search(searchText="late") == ["order late shipped"]
    assert console.text(".list-summary") == "Search: 1 matching in offsets 0 \u2013 40 (41 read, to the end)."
    assert search(searchText="shipped", searchFrom=str(between_ms)) == ["order late shipped"]
    assert search(searchText="shipped", searchTo=str(between_ms))[-1] == "order 39 shipped"
    search(searchProperty="region")
    assert "Property: write name=value" in console.text(".action-slot .error")


def test_a_missing_topic_is_one_clear_message_with_a_link_to_its_namespace(console: Console) -> None:
    """No figures, no 404 boxes and no action forms for a topic that does not exist: one line
    naming it and a way back to its namespace, on every tab, and the page creates nothing."""
    for tab in ("overview", "messages", "storage"):
        console.open(f"/topic/public/default/console-missing/{tab}")
        message = console.visible(".missing-topic")
        assert message.text.startswith("persistent://public/default/console-missing does not exist"), message.text
        back = console.one(".missing-topic a")
        assert (back.get_attribute("href") or "").endswith("#/ns/public/default")
        assert console.driver.find_elements(By.CSS_SELECTOR, "#main .error, #main form, #main .tabs") == []
    console.shoot("missing-topic")
    console.one(".missing-topic a").click()
    console.visible("[name='topic']")  # the namespace page, where the topic can be created
    with admin(console.url) as client:
        assert client.get("/admin/v2/persistent/public/default/console-missing/stats").status_code == 404


def test_a_subscription_row_expands_to_its_consumers(console: Console) -> None:
    """Each consumer's name, address, connected since, permits, unacked messages and rate, as
    the topic's ``stats`` give them (Pulsar's ConsumerStats names)."""
    with admin(console.url) as client:
        assert client.put("/admin/v2/persistent/public/default/console-consumers").status_code == 204
    url = (f"{ws_base(console.url)}/ws/v2/consumer/{NS}/console-consumers/watch"
           "?consumerName=watcher-1&receiverQueueSize=10&subscriptionType=Shared")
    with open_ws(url) as consumer, open_ws(f"{ws_base(console.url)}/ws/v2/producer/{NS}/console-consumers") as producer:
        produce(producer, [f"c{i}" for i in range(3)])
        for _ in range(3):
            recv_frame(consumer)  # delivered, not acknowledged
        with admin(console.url) as client:
            def held() -> dict[str, object] | None:
                stats = client.get("/admin/v2/persistent/public/default/console-consumers/stats").json()
                found: dict[str, object] = stats["subscriptions"]["watch"]["consumers"][0]
                return found if found["unackedMessages"] == 3 else None

            expected = console.until(held, "three unacknowledged messages in the stats")
        assert str(expected["address"]).startswith("/127.0.0.1:"), expected
        assert str(expected["connectedSince"]).endswith("Z") and "msgRateOut" in expected, expected
        console.open("/topic/public/default/console-consumers/overview")
        console.until(lambda: console.find("tr[data-subscription='watch'] button.consumers-toggle"),
                      "the consumers button of the subscription").click()
        row = console.visible("[data-consumers-of='watch'] tr[data-consumer='watcher-1']")
        assert console.one("td[data-label='Address']", row).text == str(expected["address"])[1:]
        assert console.one("td[data-label='Connected since']", row).text.startswith(
            str(expected["connectedSince"])[:4])
        assert console.one("td[data-label='Unacked']", row).text == "3"
        assert console.one("td[data-label='Permits']", row).text == str(expected["availablePermits"])
        assert console.one("td[data-label='Out']", row).text.endswith("msg/s")
        console.until(lambda: console.find("[data-consumers-of='watch'] tr[data-consumer='watcher-1']") is not None
                      and console.find("tr[data-subscription='watch']") is not None
                      and console.text("tr[data-subscription='watch'] td[data-label='Consumers']").startswith("1"),
                      "the consumers still shown after a refresh")
        console.shoot("consumers")


def test_peek_shows_a_subscriptions_next_messages_and_leaves_its_backlog(console: Console) -> None:
    topic = "/admin/v2/persistent/public/default/console-peek"
    with admin(console.url) as client:
        body = {"messages": [{"payload": f'{{"n": {i}}}', "key": f"k{i}"} for i in range(5)]}
        assert client.post("/topics/persistent/public/default/console-peek", json=body).status_code == 200
        assert client.put(f"{topic}/subscription/audit", json="earliest").status_code == 204
        assert client.post(f"{topic}/subscription/audit/skip/1").status_code == 204

        def backlog() -> int:
            return int(client.get(f"{topic}/stats").json()["subscriptions"]["audit"]["msgBacklog"])

        assert backlog() == 4
        console.open("/topic/public/default/console-peek/overview")
        console.until(lambda: console.find("[name='subscription'] option[value='audit']") is not None,
                      "the subscription in the actions")
        Select(console.visible("[name='subscription']")).select_by_value("audit")
        console.type("peekCount", "3")
        console.submit("peekCount")

        def peeked() -> list[str] | None:
            texts = [e.text for e in console.driver.find_elements(By.CSS_SELECTOR, ".peeked article.message pre")]
            return texts if len(texts) == 3 else None

        assert console.until(peeked, "three peeked messages") == ['{"n": 1}', '{"n": 2}', '{"n": 3}']
        assert "k1" in console.text(".peeked article.message")
        Select(console.visible(".peeked [name='peekView']")).select_by_value("hex")
        console.until(lambda: console.text(".peeked article.message pre.hex").startswith("00000000  7b 22 6e"),
                      "the peeked payload in hex")
        console.driver.execute_script("document.querySelector('.peeked').scrollIntoView()")
        console.shoot("peek")
        assert backlog() == 4
        console.type("peekCount", "9")
        console.submit("peekCount")
        console.until(lambda: "4 messages in the backlog of audit" in console.text(".peeked .list-summary"),
                      "the note that the backlog holds fewer")
        assert backlog() == 4


def test_deleting_a_namespace_or_tenant_that_is_not_empty_is_refused_with_the_apis_message(
        console: Console) -> None:
    with admin(console.url) as client:
        assert client.put("/admin/v2/tenants/console-doomed",
                          json={"adminRoles": [], "allowedClusters": ["standalone"]}).status_code == 204
        assert client.put("/admin/v2/namespaces/console-doomed/events").status_code == 204
        assert client.put("/admin/v2/persistent/console-doomed/events/left").status_code == 204
        refused_ns = client.delete("/admin/v2/namespaces/console-doomed/events").json()["message"]
        refused_tenant = client.delete("/admin/v2/tenants/console-doomed").json()["message"]
    console.open("/ns/console-doomed/events")
    console.click("Delete namespace")
    assert "console-doomed/events" in console.answer_confirm(accept=False)
    console.click("Delete namespace")
    console.answer_confirm(accept=True)
    console.until(lambda: console.text(".namespace-actions .error-message") == refused_ns, "the API's refusal")
    console.open("/tenants")
    console.until(lambda: console.find("tr[data-tenant='console-doomed'] button") is not None, "the tenant's row")
    console.one("tr[data-tenant='console-doomed'] button").click()
    console.answer_confirm(accept=True)
    console.until(lambda: console.text(".action-slot .error-message") == refused_tenant, "the API's refusal")
    with admin(console.url) as client:
        assert client.delete("/admin/v2/persistent/console-doomed/events/left").status_code == 204
    console.open("/ns/console-doomed/events")
    console.click("Delete namespace")
    console.answer_confirm(accept=True)
    console.until(lambda: "Namespace console-doomed/events deleted" in console.text(".notice-ok"), "the deletion")
    console.one("#main a[href='#/tenants']").click()
    console.until(lambda: console.find("tr[data-tenant='console-doomed'] button") is not None, "the tenants page")
    console.one("tr[data-tenant='console-doomed'] button").click()
    console.answer_confirm(accept=True)
    console.until(lambda: "Tenant console-doomed deleted" in console.text(".notice-ok"), "the tenant's deletion")
    with admin(console.url) as client:
        assert "console-doomed" not in client.get("/admin/v2/tenants").json()


def test_the_overview_counts_the_subscriptions_of_topics_not_loaded(console: Console) -> None:
    """The overview's "Subscriptions" is every topic's, loaded or not: a subscription of a topic
    unloaded here still counts, and the figure is the API's."""
    topic = "/admin/v2/persistent/public/default/console-unloaded"
    with admin(console.url) as client:
        assert client.put(f"{topic}/subscription/kept", json="earliest").status_code == 204
        assert "kept" in client.get(f"{topic}/subscriptions").json()
        loaded_before = client.get("/admin/v2/broker-stats/overview").json()["loaded"]["subscriptions"]
        unloaded_at_ms = int(time.time() * 1000)
        assert client.put(f"{topic}/unload").status_code == 204
        deadline = time.monotonic() + 15
        while (body := client.get("/admin/v2/broker-stats/overview").json())["subscriptions"]["countedAtMs"] is None \
                or body["subscriptions"]["countedAtMs"] < unloaded_at_ms:
            assert time.monotonic() < deadline, "no count after the unload"
            time.sleep(0.05)
    assert body["loaded"]["subscriptions"] == loaded_before - 1  # "kept" is on a topic no longer loaded
    total = body["subscriptions"]["total"]
    assert total >= body["loaded"]["subscriptions"] + 1  # ...and still counted
    console.open("/overview")
    console.until(lambda: console.stat("subscriptions") == str(total), "the API's subscription count")
    assert console.text("[data-stat='subscriptions'] .stat-label") == "Subscriptions"


def test_the_cluster_page_shows_brokers_bookies_and_bundle_owners_as_the_api_gives_them(console: Console) -> None:
    """Brokers of each cluster, the bookies, and each namespace bundle with its owner; standalone
    refuses bundle owners (not a cluster) and the page says so in the API's words."""
    with admin(console.url) as client:
        brokers = client.get("/admin/v2/brokers/standalone").json()
        bookies = [b["bookieId"] for b in client.get("/admin/v2/bookies/all").json()["bookies"]]
        boundaries = client.get("/admin/v2/namespaces/public/default/bundles").json()["boundaries"]
        owners = client.get("/admin/v2/namespaces/public/default/bundles/owners")
    assert owners.status_code == 405 and owners.json()["code"] == "not_allowed", owners.text
    assert len(brokers) == 1 and bookies
    console.open("/cluster")
    broker_row = console.visible(f"tr[data-broker='{brokers[0]}']")
    assert console.one("td[data-label='Cluster']", broker_row).text == "standalone"
    for bookie in bookies:
        console.visible(f"tr[data-bookie='{bookie}']")
    bundle = f"{boundaries[0]}_{boundaries[1]}"
    row = console.visible(f"tr[data-namespace='public/default'][data-bundle='{bundle}']")
    assert owners.json()["message"] in console.one("td[data-label='Owner']", row).text
    console.shoot("cluster")


def test_a_namespace_topic_list_filters_by_name_and_pages(console: Console) -> None:
    names = [f"page-{i:02d}" for i in range(30)]
    with admin(console.url) as client:
        assert client.put("/admin/v2/namespaces/public/paging").status_code in (200, 204)
        for name in names:
            assert client.put(f"/admin/v2/persistent/public/paging/{name}").status_code == 204

    def rows() -> list[str]:
        return list(console.driver.execute_script(
            "return Array.from(document.querySelectorAll('.topics-slot tr[data-topic]'), (r) => r.dataset.topic);"))

    console.open("/ns/public/paging")
    console.until(lambda: rows() == names[:20] or None, "the first page of 20 topics")
    assert "topics 1 \u2013 20 of 30" in console.text(".topics-summary")
    console.click("Next ▶")
    console.until(lambda: rows() == names[20:] or None, "the second page")
    console.type("topicFilter", "page-1")
    console.until(lambda: rows() == names[10:20] or None, "the topics matching page-1, from the first page")
    assert "10 matching" in console.text(".topics-summary")
    console.shoot("namespace-topics")
    console.type("topicFilter", "nothing-like-it")
    console.until(lambda: "No topic matches" in console.text(".topics-slot"), "the empty result")


def test_the_schema_tab_shows_every_version_and_the_namespaces_compatibility_strategy(console: Console) -> None:
    fields = [{"name": "id", "type": "string"}]
    definitions = []
    with admin(console.url) as client:
        assert client.put("/admin/v2/namespaces/public/schemas").status_code in (200, 204)
        assert client.put("/admin/v2/namespaces/public/schemas/schemaCompatibilityStrategy",
                          json="ALWAYS_COMPATIBLE").status_code == 204
        assert client.put("/admin/v2/persistent/public/schemas/orders").status_code == 204
        for extra in ([], [{"name": "amount", "type": ["null", "long"], "default": None}]):
            definition = {"type": "record", "name": "Order", "fields": fields + extra}
            definitions.append(definition)
            answer = client.post("/admin/v2/schemas/public/schemas/orders/schema",
                                 json={"type": "JSON", "schema": json.dumps(definition), "properties": {"by": "e2e"}})
            assert answer.status_code == 200, answer.text
        versions = client.get("/admin/v2/schemas/public/schemas/orders/schemas").json()["getSchemaResponses"]
    assert [v["version"] for v in versions] == [0, 1]
    console.open("/topic/public/schemas/orders/schema")
    console.until(lambda: console.text("[data-stat='schemaStrategy'] .stat-value") == "ALWAYS_COMPATIBLE",
                  "the namespace's strategy")
    for version in versions:
        row = console.visible(f"tr[data-version='{version['version']}']")
        assert console.one("td[data-label='Type']", row).text == "JSON"
        assert console.one("td[data-label='Properties']", row).text == "by=e2e"
    console.one("tr[data-version='1'] summary").click()
    console.until(lambda: '"amount"' in console.text("tr[data-version='1'] pre"), "the second version's definition")
    console.shoot("schema")
