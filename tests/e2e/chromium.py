"""Headless Chromium driven by Selenium, for the web console's and the API documentation's tests.

Role: start Debian's ``chromium`` through ``chromium-driver`` (both at fixed paths: no driver is
looked up or downloaded), with a fresh profile directory and the flags a closed network needs
(no background networking, component updates or sync, which would otherwise keep trying to
reach the internet), and set the page's viewport exactly (screenshots at 1280x800 and at a
narrow width), via the DevTools protocol rather than the window size, which includes no
browser chrome in headless mode but is not guaranteed to equal the viewport.

``make test`` installs the two packages when they are missing (``make check-chromium``); run
without them, the tests fail with a message naming them.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-extensions", "--disable-default-apps", "--mute-audio", "--window-size=1280,800")
PAGE_LOAD_TIMEOUT_S = 30
FULL_PAGE_HEIGHT_PX_MAX = 6000
"""A full-page screenshot is cut at this height."""


def chromium_driver(profile_dir: Path, extra_flags: tuple[str, ...] = ()) -> webdriver.Chrome:
    for binary, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(binary).exists() and shutil.which(Path(binary).name) is None:
            pytest.fail(f"{binary} is missing: install Debian's chromium and chromium-driver "
                        f"('apt-get install chromium chromium-driver', or 'make check-chromium'); "
                        f"package {package} provides it")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, *extra_flags):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile_dir}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
    return driver


def set_viewport(driver: webdriver.Chrome, width_px: int, height_px: int) -> None:
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width_px, "height": height_px, "deviceScaleFactor": 1, "mobile": False})


def screenshot(driver: webdriver.Chrome, path: Path, *, full_page: bool = False) -> Path:
    """The viewport as PNG; with ``full_page``, the whole page (up to ``FULL_PAGE_HEIGHT_PX_MAX``),
    taken by making the viewport as tall as the page, so the layout is the one at this width
    without a scrollbar, and then setting the viewport back."""
    width_px, height_px = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    if full_page:
        content_px = int(driver.execute_script("return document.documentElement.scrollHeight"))
        set_viewport(driver, width_px, min(max(content_px, height_px), FULL_PAGE_HEIGHT_PX_MAX))
    try:
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    finally:
        if full_page:
            set_viewport(driver, width_px, height_px)
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def page_errors(driver: webdriver.Chrome) -> list[str]:
    """Script errors the page logged since the last call. Failed requests are left out: the
    console shows refused calls (401, 403, 404) as messages on purpose, and Chromium logs each."""
    entries: list[dict[str, Any]] = driver.get_log("browser")  # type: ignore[no-untyped-call]
    return [entry["message"] for entry in entries
            if entry["level"] == "SEVERE" and "Failed to load resource" not in entry["message"]]
