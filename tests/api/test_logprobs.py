"""Logprobs in front of the embedded emulator: refused by name, before any money moves
(in front of a real SGLang they are passed through: tests/sglang/test_logprobs.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.security.conftest import ledger_snapshot
from tests.server.harness import RunningServer


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/generate", {"text": "hi", "return_logprob": True}, "return_logprob"),
        ("/v1/completions", {"prompt": "hi", "logprobs": 2}, "logprobs"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "logprobs": True},
            "logprobs",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
            "top_logprobs",
        ),
    ],
)
def test_the_emulator_refuses_logprobs_by_name(
    server: RunningServer, path: str, body: dict[str, Any], field: str
) -> None:
    key = server.create_user("ann")
    before = ledger_snapshot(server.ledger.engine)
    with server.client(key) as client:
        reply = client.post(path, json={**body, "bid": "0.5"})
        assert ledger_snapshot(server.ledger.engine) == before, "no money moved"
        # Not asking is fine, OpenAI's explicit null included.
        plain = {k: v for k, v in body.items() if k != field}
        if field == "logprobs":
            plain["logprobs"] = None
        assert client.post(path, json={**plain, "bid": "0"}).status_code == 200
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field
    assert error["message"].startswith(field + ":") and "emulator" in error["message"]
