"""Where the end-to-end tests put what a person should look at: the web console's screenshots.

``MAGNETAR_SCREENSHOTS_DIR`` picks the folder; otherwise it is a fresh one under pytest's
temporary directory. The folder is printed at the end of the run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SCREENSHOTS_DIR = pytest.StashKey[Path]()


@pytest.fixture(scope="session")
def screenshots_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("MAGNETAR_SCREENSHOTS_DIR")
    folder = Path(chosen) if chosen else tmp_path_factory.mktemp("console-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    request.config.stash[SCREENSHOTS_DIR] = folder
    return folder


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    folder = config.stash.get(SCREENSHOTS_DIR, None)
    if folder is not None:
        terminalreporter.write_line(f"web console screenshots: {folder}")
