"""A real auction server for SDK tests: `inference-auction serve` on a free port, with the
embedded engine emulator and a SQLite ledger file; users are created in that ledger."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from billing import Ledger
from billing.migrate import upgrade
from tests.processes import free_port, wait_until_healthy

CLI = [sys.executable, "-c", "from server.cli import main; main()"]


@dataclass
class LiveServer:
    """A running server and its ledger."""

    url: str
    database_url: str
    ledger: Ledger
    process: subprocess.Popen[bytes]

    def new_user(self, budget_micros: int = 10**9, period: str = "none") -> tuple[str, str]:
        """A fresh user (name, API key) with `budget_micros` granted per `period`."""
        name = "u" + secrets.token_hex(4)
        created = self.ledger.create_user(name, budget_micros=budget_micros, period=period)
        return name, created.api_key


@contextmanager
def live_server(tmp: Path, **settings: object) -> Iterator[LiveServer]:
    """Start a server (settings as `INFERENCE_AUCTION_*` variables); stop it afterwards."""
    database_url = f"sqlite:///{tmp / 'ledger.db'}"
    upgrade(database_url)
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
            [*CLI, "serve", "--log-level", "warning"], env=env, stdout=output, stderr=output
        )
    url = f"http://127.0.0.1:{port}"
    ledger = Ledger.from_url(database_url)
    try:
        try:
            wait_until_healthy(url, process, timeout=60)
        except RuntimeError as error:
            raise RuntimeError(f"{error}:\n{log.read_text()}") from None
        yield LiveServer(url=url, database_url=database_url, ledger=ledger, process=process)
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        ledger.close()
