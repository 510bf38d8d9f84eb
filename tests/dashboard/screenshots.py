"""Take the README's screenshots of the dashboard: a server under minutes of real traffic.

    .venv/bin/python -m tests.dashboard.screenshots docs/ --minutes 3

Eight users with different budgets and bids send waves of requests that share a few system
prompts; then headless Chromium signs in as the operator and as one user and captures each
view, whole, as docs/dashboard-operator.png and docs/dashboard-user.png.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.dashboard.chromium import chromium
from tests.db_fixtures import migrated_database
from tests.server.harness import RunningServer, running_server

USERS = {  # name: (budget in credits, period, value of full priority in credits)
    "acme-research": (40, "month", 0.60),
    "batch-etl": (25, "month", 0.08),
    "chatbot-prod": (60, "month", 0.45),
    "docs-indexer": (10, "month", 0.05),
    "eval-harness": (15, "week", 0.20),
    "finetune-data": (20, "month", 0.12),
    "growth-team": (8, "day", 0.30),
    "helpdesk": (30, "month", 0.35),
}
PROMPTS = [f"System prompt {k}: you are a careful assistant for team {k}. " * 6 for k in range(4)]


async def _wave(server: RunningServer, keys: dict[str, str], size: int, wave: int) -> None:
    async def one(i: int) -> None:
        name = random.choice(list(keys))
        value = USERS[name][2]
        bid = round(value * random.uniform(0.4, 1.0), 6)
        async with server.async_client(keys[name]) as client:
            await client.post(
                "/generate",
                json={
                    "text": random.choice(PROMPTS) + f"Question {wave}-{i}?",
                    "bid": f"{bid:.6f}",
                    "rid": f"w{wave}-{i}",
                    "sampling_params": {"max_new_tokens": random.randint(8, 64)},
                },
            )

    await asyncio.gather(*(one(i) for i in range(size)))


async def _traffic(server: RunningServer, keys: dict[str, str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    wave = 0
    while time.monotonic() < deadline:
        # Busy and quiet spells, so that rates, sizes and the queue visibly move.
        phase = (wave // 8) % 3
        await _wave(server, keys, random.randint(4, 12) * (1 + phase), wave)
        wave += 1
        await asyncio.sleep(random.uniform(0.2, 1.5) / (1 + phase))


def _capture(driver: Any, target: Path) -> None:
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    target.write_bytes(base64.b64decode(shot["data"]))
    print("wrote", target)


def _sign_in(driver: Any, url: str, key: str, view: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.delete_all_cookies()
    driver.get(url + "/dashboard")
    field = WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "api-key"))
    field.send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "#sign-in-form button[type=submit]").click()
    WebDriverWait(driver, 20).until(
        lambda d: d.execute_script("return document.body.dataset.ready") == view
    )


def main() -> None:
    """Run the traffic, then capture both views."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--minutes", type=float, default=3.0)
    args = parser.parse_args()
    random.seed(17)
    settings = {
        "batch_size": 16,
        "max_wait_ms": 40,
        "max_inflight": 12,
        "emulator_time_scale": 0.05,
    }
    with (
        migrated_database("sqlite", Path(tempfile.mkdtemp(prefix="dashboard-shots-"))) as db,
        running_server(db, **settings) as server,
        chromium() as driver,
    ):
        keys = {
            name: server.ledger.create_user(
                name, budget_micros=budget * 1_000_000, period=period
            ).api_key
            for name, (budget, period, _) in USERS.items()
        }
        root = server.create_user("root", admin=True)
        seconds = args.minutes * 60
        _sign_in(driver, server.url, root, "market")  # the live chart fills while traffic runs
        # A script's own event loop, between blocking browser steps.
        asyncio.run(_traffic(server, keys, seconds))
        args.folder.mkdir(parents=True, exist_ok=True)
        time.sleep(3)
        _capture(driver, args.folder / "dashboard-operator.png")
        _sign_in(driver, server.url, keys["chatbot-prod"], "account")
        time.sleep(2)
        _capture(driver, args.folder / "dashboard-user.png")


if __name__ == "__main__":
    main()
