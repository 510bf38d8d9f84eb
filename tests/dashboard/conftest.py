"""Fixtures of the dashboard tests: a real server on each ledger backend, and a headless
Chromium for the browser tests (Debian's `chromium` and `chromium-driver`, driven by
Selenium). Without the browser those tests skip, or fail when
INFERENCE_AUCTION_REQUIRE_BROWSER=1 (set by CI)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.db_fixtures import MigratedDatabase, ledger, ledger_db
from tests.server.harness import RunningServer, running_server

__all__ = ["ledger", "ledger_db", "server"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def server(ledger_db: MigratedDatabase) -> Iterator[RunningServer]:
    """The auction server with the embedded engine, on SQLite and on PostgreSQL."""
    with running_server(ledger_db) as running:
        yield running


def _browser_problem() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e '.[dev]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.exists(path) or shutil.which(os.path.basename(path))):
            return f"{path} is missing (apt-get install -y chromium chromium-driver)"
    return None


def require_browser() -> None:
    """Skip (or fail, under INFERENCE_AUCTION_REQUIRE_BROWSER=1) without Chromium."""
    problem = _browser_problem()
    if problem is None:
        return
    if os.environ.get("INFERENCE_AUCTION_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{problem} (INFERENCE_AUCTION_REQUIRE_BROWSER=1)", pytrace=False)
    pytest.skip(problem)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium with a fresh profile and its network log switched on."""
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="dashboard-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1440,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver_path = CHROMEDRIVER if os.path.exists(CHROMEDRIVER) else shutil.which("chromedriver")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
