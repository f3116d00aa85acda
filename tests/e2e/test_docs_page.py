"""The API documentation pages in headless Chromium with no network: they render from the broker alone.

Checks: with every host but loopback unreachable (a proxy that refuses, which the test first
proves by a fetch that fails), ``/docs`` renders Swagger UI with every operation of the API and
``/redoc`` renders ReDoc with the API's title, every resource either page loaded came from the
broker (except the Redocly logo ReDoc always links to, which it hides when it does not load), and
neither page logged a script error. A screenshot of each goes to the screenshots
folder (``tests/e2e/conftest.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import pytest
from selenium.webdriver import Chrome as WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e.chromium import chromium_driver, page_errors, screenshot, set_viewport
from tests.standalone import standalone_process

pytestmark = pytest.mark.browser

WAIT_S = 30.0
NO_NETWORK = ("--proxy-server=http://127.0.0.1:9",)
"""Every host but loopback (which Chromium never proxies) goes through a proxy that refuses."""
OUTSIDE_URL = "http://docs-assets.example/swagger-ui.css"
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
"""Hard-coded in ReDoc's sidebar link "API docs by Redocly"; hidden when it fails to load."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with standalone_process(tmp_path_factory.mktemp("docs-broker") / "data") as (url, _):
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    driver = chromium_driver(tmp_path_factory.mktemp("docs-profile"), NO_NETWORK)
    try:
        set_viewport(driver, 1280, 800)
        yield driver
    finally:
        driver.quit()


def loaded_resources(driver: WebDriver) -> list[str]:
    names: list[str] = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return names


def wait_for(driver: WebDriver, css: str, text: str, what: str) -> list[WebElement]:
    """The elements matching ``css`` once one of them shows ``text`` (bounded wait)."""
    def found(_: WebDriver) -> list[WebElement] | Literal[False]:
        elements = driver.find_elements(By.CSS_SELECTOR, css)
        return elements if any(text in element.text for element in elements) else False
    elements: list[WebElement] = WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(found, message=what)
    return elements


def test_the_browser_reaches_nothing_but_loopback(browser: WebDriver, broker: str) -> None:
    browser.get(f"{broker}/healthz")
    outcome = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        f"fetch('{OUTSIDE_URL}').then(() => done('reached'), () => done('unreachable'));")
    assert outcome == "unreachable"
    page_errors(browser)  # the refused fetch is logged; it is not the page's error


def test_swagger_ui_renders_every_operation_from_the_brokers_own_assets(
        browser: WebDriver, broker: str, screenshots_dir: Path) -> None:
    browser.get(f"{broker}/docs")
    operations = wait_for(browser, ".opblock", "/healthz", "Swagger UI's operations")
    spec = httpx.get(f"{broker}/openapi.json", timeout=30).json()
    documented = sum(len(methods) for methods in spec["paths"].values())
    assert len(operations) == documented > 50
    assert "/admin/v2/namespaces/{tenant}/{namespace}/messageTTL" in browser.find_element(By.TAG_NAME, "body").text
    resources = loaded_resources(browser)
    assert any(r.endswith("/docs/assets/swagger-ui-bundle.js") for r in resources)
    assert all(r.startswith(broker) for r in resources), resources
    screenshot(browser, screenshots_dir / "docs-swagger-ui.png")
    assert page_errors(browser) == []


def test_redoc_renders_from_the_brokers_own_assets(browser: WebDriver, broker: str, screenshots_dir: Path) -> None:
    browser.get(f"{broker}/redoc")
    titles = wait_for(browser, "h1", "Magnetar", "ReDoc's title")
    assert [t.text for t in titles] == ["Magnetar (0.1.0)"]
    assert "/admin/v2/namespaces/{tenant}/{namespace}/messageTTL" in browser.find_element(By.TAG_NAME, "body").text
    resources = loaded_resources(browser)
    assert any(r.endswith("/docs/assets/redoc.standalone.js") for r in resources)
    assert all(r.startswith(broker) or r == REDOC_LOGO for r in resources), resources
    screenshot(browser, screenshots_dir / "docs-redoc.png")
    assert page_errors(browser) == []
