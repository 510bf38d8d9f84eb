"""What a newcomer trips on, against a real server: typos of top-level fields, messages that
show pydantic's internals, and a 402 that does not say what to do."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.db_fixtures import migrated_database
from tests.security.conftest import ledger_snapshot
from tests.server.harness import RunningServer, running_server

# Keys routers and SGLang's clients add to `/generate` bodies: SGLang ignores them, so must we.
ROUTER_KEYS: dict[str, Any] = {
    "model": "default",
    "log_metrics": True,
    "background": False,
    "no_logs": False,
    "return_bytes": False,
    "return_entropy": False,
    "return_text_in_logprobs": False,
    "return_logprob": False,
    "stream": False,
}
# The names a bid is likely sent under by mistake: the answer's (`bid_micros`), the SDK's
# parameter (`value`), other APIs' (`max_bid`) and SGLang's scheduling field (`priority`).
WRONG_BID_NAMES: dict[str, Any] = {
    "bid_micros": 50_000,
    "value": "0.5",
    "max_bid": "0.5",
    "priority": 3,
    "Bid_Micros": 50_000,
}
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
]


@pytest.fixture(scope="module")
def newcomer_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server on SQLite for the whole module: these tests concern the HTTP layer."""
    folder = tmp_path_factory.mktemp("newcomer")
    with migrated_database("sqlite", Path(folder)) as db, running_server(db) as server:
        yield server


def _error(reply: Any, status: int = 400) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    error: dict[str, Any] = reply.json()["error"]
    return error


def test_openai_names_in_sampling_params_are_refused_with_sglangs(
    newcomer_server: RunningServer,
) -> None:
    key = newcomer_server.create_user("openai-habits")
    cases = {"max_tokens": "max_new_tokens", "seed": "sampling_seed", "temprature": "temperature"}
    before = ledger_snapshot(newcomer_server.ledger.engine)
    with newcomer_server.client(key) as client:
        for sent, meant in cases.items():
            body = {"text": "hi", "bid": "0.1", "sampling_params": {sent: 1}}
            error = _error(client.post("/generate", json=body))
            assert error["param"] == "sampling_params", error
            assert error["message"] == (
                f"sampling_params: unknown sampling parameter {sent!r}; did you mean {meant!r}?"
            )
        # An unknown parameter that is no near miss is still refused, as SGLang refuses it.
        plain = _error(client.post("/generate", json={"text": "hi", "sampling_params": {"x": 1}}))
        assert "did you mean" not in plain["message"]
    assert ledger_snapshot(newcomer_server.ledger.engine) == before


def test_near_misses_of_fields_are_refused_with_a_suggestion(
    newcomer_server: RunningServer,
) -> None:
    key = newcomer_server.create_user("typo")
    cases = [
        ("/generate", {"text": "hi", "bdi": "0.5"}, "unknown field 'bdi'; did you mean 'bid'?"),
        ("/generate", {"text": "hi", "Bid": "0.5"}, "unknown field 'Bid'; did you mean 'bid'?"),
        (
            "/generate",
            {"text": "hi", "sampling_param": {"max_new_tokens": 2}},
            "unknown field 'sampling_param'; did you mean 'sampling_params'?",
        ),
        ("/generate", {"txet": "hi"}, "did you mean 'text'?"),
        ("/generate", {"text": "hi", "RID": "r-1"}, "did you mean 'rid'?"),
        ("/v1/completions", {"prompt": "hi", "max_token": 2}, "did you mean 'max_tokens'?"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "bdi": "1"},
            "did you mean 'bid'?",
        ),
    ]
    before = ledger_snapshot(newcomer_server.ledger.engine)
    with newcomer_server.client(key) as client:
        for path, body, says in cases:
            error = _error(client.post(path, json=body))
            message = error["message"]
            assert message == says if says.startswith("unknown") else says in message, message
            # `param` names the key as sent, the one to fix.
            sent = next(k for k in body if k not in ("text", "prompt", "messages"))
            assert error["param"] == sent, error
    assert ledger_snapshot(newcomer_server.ledger.engine) == before


def test_router_keys_and_openai_labels_stay_accepted(newcomer_server: RunningServer) -> None:
    key = newcomer_server.create_user("router")
    body = {
        "text": "hi",
        "bid": "0.01",
        "sampling_params": {"max_new_tokens": 2},
        **ROUTER_KEYS,
    }
    with newcomer_server.client(key) as client:
        reply = client.post("/generate", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["meta_info"]["auction"]["bid_micros"] == 10_000
        for path, base in ROUTES[1:]:
            extra = {"user": "u-1", "logprobs": None, "top_k": 5, "metadata": {"a": "b"}}
            reply = client.post(path, json={**base, **extra, "bid": "0.01"})
            assert reply.status_code == 200, reply.text
            assert reply.json()["auction"]["bid_micros"] == 10_000


def test_a_bid_under_another_name_is_refused_by_name(newcomer_server: RunningServer) -> None:
    """`{"bid_micros": 50000}` must never be served at bid 0: each likely wrong name of the
    bid, on each generation route, is a 400 that names it and points at `bid`."""
    key = newcomer_server.create_user("wrong-bid-name")
    before = ledger_snapshot(newcomer_server.ledger.engine)
    with newcomer_server.client(key) as client:
        for path, base in ROUTES:
            for name, value in WRONG_BID_NAMES.items():
                error = _error(client.post(path, json={**base, name: value}))
                assert error["param"] == name, (path, error)
                message = error["message"]
                assert message.startswith(f"unknown field {name!r}: the bid is 'bid'"), message
                assert "in credits" in message
    assert ledger_snapshot(newcomer_server.ledger.engine) == before


def test_an_unknown_field_is_refused_not_ignored(newcomer_server: RunningServer) -> None:
    key = newcomer_server.create_user("unknown-field")
    with newcomer_server.client(key) as client:
        for path, base in ROUTES:
            error = _error(client.post(path, json={**base, "my_own_annotation": {"x": 1}}))
            assert error["param"] == "my_own_annotation"
            assert "does not read it" in error["message"], error
        # SGLang's own request keys stay accepted on `/generate` (SGLang ignores them too),
        # but not on the OpenAI routes, which take OpenAI's fields.
        sglang_only = {"return_hidden_states": False, "lora_path": None}
        generate, chat = ROUTES[0], ROUTES[2]
        assert client.post(generate[0], json={**generate[1], **sglang_only}).status_code == 200
        error = _error(client.post(chat[0], json={**chat[1], "return_hidden_states": False}))
        assert error["param"] == "return_hidden_states"


def test_a_missing_bid_is_zero(newcomer_server: RunningServer) -> None:
    key = newcomer_server.create_user("nobid")
    with newcomer_server.client(key) as client:
        reply = client.post(
            "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}}
        )
    assert reply.status_code == 200
    assert reply.json()["meta_info"]["auction"]["bid_micros"] == 0


def test_prompt_errors_speak_plainly(newcomer_server: RunningServer) -> None:
    key = newcomer_server.create_user("plain")
    with newcomer_server.client(key) as client:
        for text in (42, {"a": 1}, ["ok", 3], True):
            error = _error(client.post("/generate", json={"text": text}))
            assert error["message"] == "text must be a string or a list of strings", error
            assert error["param"] == "text"
        missing = _error(client.post("/generate", json={"bid": "0.1"}))
        assert missing["message"].startswith("text is missing")
        assert "'input_ids'" in missing["message"]
        both = _error(client.post("/generate", json={"text": "a", "input_ids": [1]}))
        assert both["message"] == "send either 'text' or 'input_ids', not both"
        stop = _error(client.post("/generate", json={"text": "a", "sampling_params": {"stop": 5}}))
        assert "list[str]" not in stop["message"] and ".str" not in stop["message"]
        assert stop["param"] == "sampling_params.stop"
        prompt = _error(client.post("/v1/completions", json={"max_tokens": 2}))
        assert prompt["message"] == "prompt: this field is required"


def test_payment_required_says_credits_and_what_to_do(newcomer_server: RunningServer) -> None:
    key = newcomer_server.create_user("poor", budget=10_000_000)
    with newcomer_server.client(key) as client:
        error = _error(client.post("/generate", json={"text": "hi", "bid": "20"}), 402)
    message = error["message"]
    assert "bid of 20 credits" in message and "10 credits available" in message, message
    assert "20000000 micro-credits requested" in message
    assert "bid less" in message
    assert error["param"] == "bid"
