"""The SGLang backend's tokenizer cache: bounded in bytes, and never fed by refused requests.

Each test ends with an audit of the money against the answers.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from inference_auctions.billing import Ledger
from inference_auctions.server.engine.sglang_http import SGLangHTTPEngine
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase
from tests.processes import emulated_sglang
from tests.server.harness import TEST_SETTINGS, serve_app
from tests.server.money_audit import audit_money_against_answers

_BOUND = 768 * 1024  # entries of 12 KiB at most


@pytest.fixture(scope="module")
def sglang_url() -> Iterator[str]:
    with emulated_sglang(time_scale=0.002) as url:
        yield url


def test_refused_prompts_leave_nothing_and_the_cache_stays_in_its_bytes(
    ledger_db: MigratedDatabase, sglang_url: str
) -> None:
    # Before: each refused prompt stayed in a cache of 65,536 entries, whatever their size.
    settings = ServerSettings(database_url=ledger_db.url, engine_url=sglang_url, **TEST_SETTINGS)
    engine = SGLangHTTPEngine(sglang_url, tokenize_cache_bytes=_BOUND)
    ledger = Ledger(ledger_db.new_engine())
    broke = ledger.create_user("broke", budget_micros=0).api_key
    payer = ledger.create_user("payer", budget_micros=10_000_000).api_key
    with (
        serve_app(settings, engine=engine) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        for i in range(5):  # prompts bidding what the budget cannot cover: 402
            body = {"text": f"{i} " + "word " * 500, "bid": "1"}
            refused = client.post(
                "/generate", json=body, headers={"Authorization": f"Bearer {broke}"}
            )
            assert refused.status_code == 402
        assert engine.tokenize_cache_bytes == 0
        for i in range(90):  # about 9 KB each with its ids: more than the bound in all
            body = {"rid": f"r{i}", "text": f"{i} " + "word " * 1_000, "bid": "0.01"}
            served = client.post(
                "/generate", json=body, headers={"Authorization": f"Bearer {payer}"}
            )
            assert served.status_code == 200
        assert _BOUND - 20_000 < engine.tokenize_cache_bytes <= _BOUND  # full, not over
    audit_money_against_answers(ledger, {f"payer/r{i}": "served" for i in range(90)})
