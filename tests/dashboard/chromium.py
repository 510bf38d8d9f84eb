"""Headless Chromium from Debian (`chromium`, `chromium-driver`), driven by Selenium.

Never a downloaded browser: the binaries are the system's, found at their Debian paths or on
PATH, and the profile is a fresh folder each time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
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
)


def _find(path: str) -> str | None:
    return path if os.path.exists(path) else shutil.which(os.path.basename(path))


def browser_problem() -> str | None:
    """Why no browser can be started here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e '.[dev]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if _find(path) is None:
            return f"{path} is missing (apt-get install -y chromium chromium-driver)"
    return None


def require_browser() -> None:
    """Skip (or fail, under INFERENCE_AUCTION_REQUIRE_BROWSER=1) without Chromium."""
    problem = browser_problem()
    if problem is None:
        return
    if os.environ.get("INFERENCE_AUCTION_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{problem} (INFERENCE_AUCTION_REQUIRE_BROWSER=1)", pytrace=False)
    pytest.skip(problem)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium with a fresh profile, its network log and console log switched on."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="dashboard-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = _find(CHROMIUM) or CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    service = Service(executable_path=_find(CHROMEDRIVER) or CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
