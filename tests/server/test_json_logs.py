"""`serve --log-format json`: one JSON object a line, each line of a request with its id, user
and batch.

The server runs as `inference-auction serve` in a process of its own, as an operator starts
it; its stderr is read whole after a SIGTERM. The lines of work done for a request outside its
handler (following it at the engine) are checked on a task started the way the dispatcher
starts it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference_auctions.billing import Ledger
from inference_auctions.server.log_format import JsonFormatter
from inference_auctions.server.request_context import RequestFields, request_context
from inference_auctions.server.serving.tickets import Clearance, Ticket
from tests.processes import free_port, wait_until_healthy


def _serve(database: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "inference_auctions.server.cli", "serve"]
    command += ["--port", str(port), "--database-url", f"sqlite:///{database}"]
    command += ["--log-format", "json", "--log-level", "info"]
    command += ["--time-scale", "0.002", "--max-wait-ms", "50"]
    with log_path.open("wb") as log:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)


def test_every_line_is_json_and_a_request_s_lines_name_it(tmp_path: Path) -> None:
    database, port, log_path = tmp_path / "ledger.db", free_port(), tmp_path / "server.log"
    process = _serve(database, port, log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        with Ledger.from_url(f"sqlite:///{database}") as ledger:
            key = ledger.create_user("alice", budget_micros=10_000_000).api_key
            broke = ledger.create_user("bob", budget_micros=0).api_key
        served = httpx.post(
            url + "/generate",
            json={"text": "a b c", "bid": "0.01", "sampling_params": {"max_new_tokens": 3}},
            headers={"Authorization": f"Bearer {key}", "x-request-id": "req-served-1"},
            timeout=30,
        )
        assert served.status_code == 200, served.text
        batch_id = served.json()["meta_info"]["auction"]["batch_id"]
        refused = httpx.post(
            url + "/generate",
            json={"text": "a b c", "bid": "0.5"},
            headers={"Authorization": f"Bearer {broke}", "x-request-id": "req-refused-1"},
            timeout=30,
        )
        assert refused.status_code == 402
    finally:
        process.send_signal(signal.SIGTERM)
        # uvicorn drains, then ends by the signal it caught, as a SIGTERM-ed process does.
        assert process.wait(60) in (0, -signal.SIGTERM)
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line: one JSON object
    assert {"time", "level", "logger", "message", "request_id", "user", "batch"} <= set(records[0])
    assert any(r["logger"] == "inference_auctions.server.app" for r in records)  # the app's own
    by_id: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_id.setdefault(str(record["request_id"]), []).append(record)
    # uvicorn's access line is the request's too, after the auction cleared it.
    (access,) = [r for r in by_id["req-served-1"] if r["logger"] == "uvicorn.access"]
    assert "/generate" in access["message"] and "200" in access["message"]
    assert (access["user"], access["batch"]) == ("alice", batch_id)
    (refusal,) = [r for r in by_id["req-refused-1"] if r["logger"] == "uvicorn.access"]
    assert "402" in refusal["message"]
    assert (refusal["user"], refusal["batch"]) == ("bob", None)  # refused before any batch
    # Lines outside any request (startup, shutdown) carry none.
    startup = [r for r in records if "ready" in r["message"]]
    assert startup and startup[0]["request_id"] is None


@pytest.mark.anyio
async def test_the_task_following_a_request_logs_as_that_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ticket = Ticket(
        user="carol",
        rid="r1",
        ledger_rid="carol/r1",
        tokens=[1, 2, 3],  # type: ignore[arg-type]  # any sequence of ids serves here
        bid_micros=0,
        sampling_params={},
        fingerprint="f",
        request_id="req-follow-1",
    )
    ticket.clearance = Clearance(
        batch_id="batch-7",
        position=0,
        batch_size=1,
        priority=0.0,
        bid_micros=0,
        user_batch_charge_micros=0,
        request_charge_micros=0,
        sequence=1,
    )
    handler = logging.Handler()
    seen: list[str] = []
    formatter = JsonFormatter()
    handler.emit = lambda record: seen.append(formatter.format(record))  # type: ignore[method-assign]
    handler.addFilter(RequestFields())
    log = logging.getLogger("tests.follow")
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    async def follow() -> None:
        log.info("following")

    try:
        await asyncio.create_task(follow(), context=request_context(ticket))
        log.info("outside")  # this task's context was not touched
    finally:
        log.removeHandler(handler)
    following, outside = (json.loads(line) for line in seen)
    assert (following["request_id"], following["user"], following["batch"]) == (
        "req-follow-1",
        "carol",
        "batch-7",
    )
    assert (outside["request_id"], outside["user"], outside["batch"]) == (None, None, None)
