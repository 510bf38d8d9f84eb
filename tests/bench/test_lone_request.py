"""`bench.lone_request` pairs each request through the server with one straight to the engine,
in alternating order, and reads what the server added."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from bench.lone_request import _arguments, closed_loop, engine, front, lone_pairs
from bench.serving_ledger import audit, create_users, fresh_database


def test_the_pairs_alternate_and_the_difference_is_the_server_s(
    tmp_path: Path,
) -> None:
    with (
        engine("emulator", tmp_path, 4) as engine_url,
        fresh_database("sqlite", tmp_path, "") as url,
    ):
        users = create_users(url, 1)
        server = front(engine_url, url, tmp_path)
        try:
            model = httpx.get(engine_url + "/v1/models", timeout=30).json()["data"][0]["id"]
            steps: list[None] = []
            figures = lone_pairs(
                engine_url,
                server.url,
                users.keys[0],
                model,
                "chat",
                10,
                0,
                lambda: steps.append(None),
            )
            rate = closed_loop(server.url, users.keys[0], model, 2, 1.0)
        finally:
            server.stop()
        ledger = audit(url)
    assert len(steps) == 10 and figures.pairs == 10
    # The server's side bid: every request it served is settled on the ledger, which balances.
    assert ledger.served >= 10 and ledger.clean
    assert figures.added_p50 == pytest.approx(figures.front_p50 - figures.direct_p50, abs=50)
    assert figures.direct_p50 > 0 and figures.front_p50 > 0
    assert rate > 0


def test_too_few_pairs_is_refused() -> None:
    with pytest.raises(SystemExit):
        _arguments(["--pairs", "3"])
