"""Logprobs in front of the real SGLang: passed through, natively and in OpenAI's shapes."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.server.harness import RunningServer, running_server
from tests.sglang.conftest import assert_ledger_settled

PROMPT = "The auction serves the highest bid first, and"
GREEDY = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}


@pytest.fixture
def server(tmp_path: Path, sglang_url: str) -> Iterator[RunningServer]:
    db: MigratedDatabase
    with (
        migrated_database("sqlite", tmp_path) as db,
        running_server(db, engine_url=sglang_url, max_wait_ms=0) as running,
    ):
        yield running


def test_native_logprobs_are_sglangs_own(server: RunningServer) -> None:
    key = server.create_user("ann")
    options = {"return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True}
    direct = httpx.post(
        str(server.settings.engine_url) + "/generate",
        json={"text": PROMPT, "sampling_params": GREEDY, **options},
        timeout=60,
    ).json()["meta_info"]
    with server.client(key) as client:
        whole = client.post(
            "/generate", json={"text": PROMPT, "sampling_params": GREEDY, "bid": "0.2", **options}
        )
        streamed = client.post(
            "/generate",
            json={
                "text": PROMPT,
                "sampling_params": GREEDY,
                "bid": "0.2",
                "stream": True,
                **options,
            },
        )
    assert whole.status_code == 200, whole.text
    meta = whole.json()["meta_info"]
    for got in (meta, json.loads(streamed.text.split("data: ")[-2])["meta_info"]):
        tokens = got["output_token_logprobs"]
        assert [t[1] for t in tokens] == [t[1] for t in direct["output_token_logprobs"]]
        for mine, theirs in zip(tokens, direct["output_token_logprobs"], strict=True):
            assert math.isclose(mine[0], theirs[0], abs_tol=1e-4)
        assert len(got["output_top_logprobs"]) == 4
        assert all(len(top) == 2 for top in got["output_top_logprobs"])
    assert_ledger_settled(server, ["ann"])


def test_openai_logprobs_in_openais_shapes(server: RunningServer) -> None:
    key = server.create_user("ann")
    with server.client(key) as client:
        completion = client.post(
            "/v1/completions",
            json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 2, "bid": "0.1"},
        )
        chat = client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 3,
                "temperature": 0,
                "logprobs": True,
                "top_logprobs": 2,
                "bid": "0.1",
            },
        )
        streamed = client.post(
            "/v1/completions",
            json={
                "prompt": PROMPT,
                "max_tokens": 4,
                "temperature": 0,
                "logprobs": 1,
                "stream": True,
                "bid": "0.1",
            },
        )
    assert completion.status_code == 200, completion.text
    choice = completion.json()["choices"][0]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == 4
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert all(lp <= 0 for lp in logprobs["token_logprobs"])
    assert all(len(top) <= 2 for top in logprobs["top_logprobs"])
    assert chat.status_code == 200, chat.text
    content = chat.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(len(t["top_logprobs"]) == 2 for t in content)
    # Streamed: each token's logprob exactly once, across the chunks.
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: {")]
    tokens = [
        t for e in events for t in (json.loads(e)["choices"][0]["logprobs"] or {}).get("tokens", [])
    ]
    assert tokens == logprobs["tokens"]
    assert_ledger_settled(server, ["ann"])
