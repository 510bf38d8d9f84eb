"""A real auction server for SDK tests: `inference-auction serve` on a free port, with the
embedded engine emulator and a SQLite ledger file; users are created through its admin API.

Nothing here imports the server: it runs under `INFERENCE_AUCTION_TEST_SERVER_PYTHON` (by
default this interpreter), so the SDK's tests also run from a virtualenv that holds only the
SDK's wheel, against a server started from the server's own environment.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.processes import free_port, wait_until_healthy

SERVER_PYTHON = os.environ.get("INFERENCE_AUCTION_TEST_SERVER_PYTHON") or sys.executable
CLI = [SERVER_PYTHON, "-m", "inference_auctions.server.cli"]


@dataclass
class LiveServer:
    """A running server and an admin key for its ledger."""

    url: str
    database_url: str
    admin_key: str
    process: subprocess.Popen[bytes]

    def new_user(self, budget_micros: int = 10**9, period: str = "none") -> tuple[str, str]:
        """A fresh user (name, API key) with `budget_micros` granted per `period`."""
        name = "u" + secrets.token_hex(4)
        credits = f"{budget_micros // 1_000_000}.{budget_micros % 1_000_000:06d}"
        response = httpx.post(
            f"{self.url}/v1/admin/users",
            json={"name": name, "budget": credits, "period": period},
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=30,
        )
        response.raise_for_status()
        return name, str(response.json()["api_key"])


def serve_takes(option: str) -> bool:
    """Whether this server's `serve` command accepts `option` (a feature it may predate)."""
    shown = subprocess.run(
        [*CLI, "serve", "--help"], capture_output=True, text=True, check=True, timeout=120
    )
    return option in shown.stdout


def _create_admin(env: dict[str, str]) -> str:
    name = "admin-" + secrets.token_hex(3)
    created = subprocess.run(
        [*CLI, "users", "create", name, "--budget", "0", "--admin", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return str(json.loads(created.stdout)["api_key"])


@contextmanager
def live_server(tmp: Path, *args: str, **settings: object) -> Iterator[LiveServer]:
    """Start a server (`args` added to `serve`'s command line, settings as
    `INFERENCE_AUCTION_*` variables); stop it afterwards."""
    database_url = f"sqlite:///{tmp / 'ledger.db'}"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERENCE_AUCTION_")}
    defaults: dict[str, object] = {
        "database_url": database_url,
        "port": port,
        "emulator_time_scale": 0.001,
        "batch_size": 8,
        "max_wait_ms": 20,
        "rate_limit_per_second": 10_000,
        "rate_limit_burst": 10_000,
        "run_jobs": "false",
    }
    for name, value in {**defaults, **settings}.items():
        env[f"INFERENCE_AUCTION_{name.upper()}"] = str(value)
    log = tmp / "server.log"
    with log.open("ab") as output:
        process = subprocess.Popen(
            [*CLI, "serve", "--log-level", "warning", *args], env=env, stdout=output, stderr=output
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_healthy(url, process, timeout=60)
        except RuntimeError as error:
            raise RuntimeError(f"{error}:\n{log.read_text()}") from None
        admin_key = _create_admin(env)  # the server migrated the database before it answered
        yield LiveServer(url=url, database_url=database_url, admin_key=admin_key, process=process)
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
