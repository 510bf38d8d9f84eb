"""The server in front of the real SGLang: what SGLang sends comes through as SGLang sends it.

Shared-prefix caching, the stream's shape, a client that leaves mid-stream, a prompt over the
context length, the local tokenizer's agreement check, the OpenAI routes, and SGLang's own
preemption. Every test ends with the ledger reconciled and no money held.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.sglang_cpu.launcher import SGLangServer
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.server.harness import RunningServer, running_server
from tests.sglang.conftest import CONTEXT_LENGTH, assert_ledger_settled

SYSTEM = (
    "You are a helpful assistant of the auction. Answer the question briefly and precisely, "
    "and tell the user about the boat on the quiet lake when asked."
)


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("sqlite", tmp_path) as db:
        yield db


@pytest.fixture
def server(sqlite_db: MigratedDatabase, sglang_url: str) -> Iterator[RunningServer]:
    with running_server(sqlite_db, engine_url=sglang_url, max_wait_ms=0) as running:
        yield running


def _generate(
    server: RunningServer, key: str, text: str, new_tokens: int = 4, **extra: Any
) -> dict[str, Any]:
    body = {
        "text": text,
        "bid": "0.2",
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
        **extra,
    }
    with server.client(key) as client:
        reply = client.post("/generate", json=body)
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def test_shared_prefix_siblings_report_sglangs_cached_tokens(server: RunningServer) -> None:
    key = server.create_user("ann")
    first = _generate(server, key, SYSTEM + " Question one: what is a bid?")
    sibling = _generate(server, key, SYSTEM + " Question two: who pays?")
    with httpx.Client(timeout=30) as direct:
        shared = len(
            direct.post(server.settings.engine_url + "/tokenize", json={"prompt": SYSTEM}).json()[
                "tokens"
            ]
        )
    assert first["meta_info"]["cached_tokens"] < shared
    # The sibling finds the shared system prompt in SGLang's radix cache (a token or two of
    # the boundary may differ: byte-level BPE merges across it).
    assert sibling["meta_info"]["cached_tokens"] >= shared - 2
    assert sibling["meta_info"]["cached_tokens"] < sibling["meta_info"]["prompt_tokens"]
    record = server.ledger.find_request(f"ann/{sibling['meta_info']['id']}")
    assert record is None or record.cached_tokens == sibling["meta_info"]["cached_tokens"]
    assert_ledger_settled(server, ["ann"])


def test_the_stream_comes_through_as_sglang_sends_it(server: RunningServer) -> None:
    key = server.create_user("ann")
    body = {
        "text": SYSTEM,
        "bid": "0.3",
        "stream": True,
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
    }
    events: list[bytes] = []
    with server.client(key) as client, client.stream("POST", "/generate", json=body) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line for line in reply.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in events[:-1]]
    assert len(chunks) >= 2
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    # Cumulative text and ids: each chunk extends the one before it.
    for before, after in itertools.pairwise(chunks):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
    assert len(chunks[-1]["output_ids"]) == 12
    # The same request straight to SGLang gives the same text (greedy, same weights).
    direct = httpx.post(
        server.settings.engine_url + "/generate",
        json={"text": SYSTEM, "sampling_params": body["sampling_params"]},
        timeout=60,
    ).json()
    assert chunks[-1]["output_ids"] == direct["output_ids"]
    assert chunks[-1]["text"] == direct["text"]
    assert_ledger_settled(server, ["ann"])


def _engine_idle(engine_url: str) -> bool:
    load = httpx.get(engine_url + "/v1/loads", timeout=10).json()["loads"][0]
    return bool(load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0)


@pytest.mark.anyio
async def test_a_client_that_leaves_mid_stream_is_aborted_at_sglang(server: RunningServer) -> None:
    key = server.create_user("ann", budget=10_000_000)
    engine_url = server.settings.engine_url
    assert engine_url is not None
    body = {
        "text": SYSTEM,
        "bid": "0.4",
        "stream": True,
        # Many seconds of decoding on this CPU if nobody stopped it.
        "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True},
    }

    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as client,
        client.stream("POST", "/generate", json=body) as reply,
    ):
        assert reply.status_code == 200
        seen = 0
        async for line in reply.aiter_lines():
            if line.startswith("data: {") and '"output_ids": []' not in line:
                seen += 1
            if seen >= 2:
                break
    left = time.monotonic()  # the connection is closed here
    while not _engine_idle(engine_url):
        assert time.monotonic() - left < 1.0, "SGLang still runs the abandoned request"
        time.sleep(0.05)
    # The ledger settles the request by the disconnect rule, and reconciles.
    deadline = time.monotonic() + 30
    while server.ledger.balance("ann").held_micros and time.monotonic() < deadline:
        time.sleep(0.05)
    assert_ledger_settled(server, ["ann"])
    assert server.ledger.balance("ann").balance_micros <= 10_000_000


def test_a_prompt_over_the_context_length_is_refused_with_sglangs_words(
    server: RunningServer,
) -> None:
    key = server.create_user("ann", budget=10_000_000)
    too_long = [10 + i % 400 for i in range(CONTEXT_LENGTH + 5)]  # ids in the vocabulary
    with server.client(key) as client:
        reply = client.post("/generate", json={"input_ids": too_long, "bid": "0.5"})
    engine = httpx.post(
        server.settings.engine_url + "/generate", json={"input_ids": too_long}, timeout=30
    )
    assert engine.status_code == 400
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert message in engine.text, (message, engine.text)
    balance = server.ledger.balance("ann")
    assert balance.balance_micros == 10_000_000 and balance.held_micros == 0
    kinds = [entry.kind for entry in server.ledger.entries("ann").entries]
    assert kinds == ["grant"], "no hold was ever placed"
    assert_ledger_settled(server, ["ann"])


def test_ids_outside_the_vocabulary_are_refused_and_sglang_stays_up(
    server: RunningServer, sglang: SGLangServer
) -> None:
    # SGLang states no vocabulary size; the server reads it from the model folder its
    # /model_info names. SGLang itself checks no prompt id: this one would kill its scheduler.
    vocab_size = json.loads((sglang.model / "config.json").read_text())["vocab_size"]
    key = server.create_user("ann", budget=10_000_000)
    with server.client(key) as client:
        reply = client.post(
            "/generate", json={"input_ids": [10, 11, vocab_size], "bid": "0.5", "rid": "poison"}
        )
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "input_ids"
        assert f"token id {vocab_size:,} is outside" in reply.json()["error"]["message"]
        # The engine is still up, and the vocabulary's last id is served.
        edge = client.post(
            "/generate",
            json={
                "input_ids": [10, 11, vocab_size - 1],
                "bid": "0.5",
                "sampling_params": {"max_new_tokens": 2},
            },
        )
    assert edge.status_code == 200, edge.text
    assert sglang.alive()
    kinds = [entry.kind for entry in server.ledger.entries("ann").entries]
    assert kinds.count("hold") == 1, "the refused request placed no hold"
    assert_ledger_settled(server, ["ann"])


def test_the_local_tokenizer_agrees_with_sglangs_tokenize(
    sqlite_db: MigratedDatabase, sglang: SGLangServer, sglang_url: str
) -> None:
    tokenizer = sglang.model / "tokenizer.json"
    with running_server(sqlite_db, engine_url=sglang_url, tokenizer=str(tokenizer)) as server:
        key = server.create_user("ann")
        text = SYSTEM + " Tokenized here, checked there: 0 1 2 ; ( ) { }"
        result = _generate(server, key, text)
        expected = httpx.post(sglang_url + "/tokenize", json={"prompt": text}, timeout=30).json()
        assert result["meta_info"]["prompt_tokens"] == expected["count"]
        assert_ledger_settled(server, ["ann"])


def test_the_openai_routes_through_the_server(server: RunningServer) -> None:
    key = server.create_user("ann")
    with server.client(key) as client:
        completion = client.post(
            "/v1/completions",
            json={"prompt": SYSTEM, "max_tokens": 5, "temperature": 0, "bid": "0.1"},
        )
        chat = client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "What is a bid?"}],
                "max_tokens": 5,
                "temperature": 0,
                "bid": "0.1",
            },
        )
        streamed = client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "Who pays?"}],
                "max_tokens": 5,
                "stream": True,
                "bid": "0.1",
            },
        )
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["finish_reason"] in ("length", "stop")
    assert completion.json()["usage"]["completion_tokens"] >= 1
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert_ledger_settled(server, ["ann"])


def test_chats_are_rendered_with_the_models_template_as_sglangs_chat_route_does(
    server: RunningServer,
) -> None:
    key = server.create_user("ann")
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is a bid?"},
    ]
    request = {"messages": messages, "max_tokens": 6, "temperature": 0}
    with server.client(key) as client:
        ours = client.post("/v1/chat/completions", json={**request, "bid": "0.1"})
    theirs = httpx.post(
        str(server.settings.engine_url) + "/v1/chat/completions", json=request, timeout=60
    )
    assert ours.status_code == 200 and theirs.status_code == 200, (ours.text, theirs.text)
    # The same prompt tokens (the ChatML template, its assistant opening included)...
    rendered = httpx.post(
        str(server.settings.engine_url) + "/tokenize", json={"messages": messages}, timeout=30
    ).json()
    assert ours.json()["usage"]["prompt_tokens"] == theirs.json()["usage"]["prompt_tokens"]
    assert ours.json()["usage"]["prompt_tokens"] == rendered["count"]
    # ...so greedy decoding of the same weights says the same thing.
    assert (
        ours.json()["choices"][0]["message"]["content"]
        == theirs.json()["choices"][0]["message"]["content"]
    )
    assert_ledger_settled(server, ["ann"])
