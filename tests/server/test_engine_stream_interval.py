"""What the server asks of the engine, stream-wise, for each kind of client.

Every request is streamed from the engine, so the server sees its first token (saturation,
deferral). A client that waits for the whole answer gets it built from a chunk per
`engine_stream_interval` tokens (SGLang's per-request `stream_interval`) rather than one per
token; a client that streams gets the stream it asked for. The engine here is `FaultySGLang`
on a loopback port, which records every `/generate` body it receives.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.db_fixtures import MigratedDatabase
from tests.faults.faulty_sglang import FaultySGLang
from tests.server.harness import running_server

INTERVAL = 16

# (path, body, whether the client streams): one of each route and kind.
REQUESTS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "generate-whole": (
        "/generate",
        {"text": "a b c", "bid": "0.01", "sampling_params": {"max_new_tokens": 5}},
        False,
    ),
    "generate-stream": (
        "/generate",
        {"text": "a b c", "bid": "0.01", "sampling_params": {"max_new_tokens": 5}, "stream": True},
        True,
    ),
    "generate-own-interval": (
        "/generate",
        {
            "text": "a b c",
            "bid": "0.01",
            "sampling_params": {"max_new_tokens": 5, "stream_interval": 2},
            "stream": True,
        },
        True,
    ),
    "completion-whole": (
        "/v1/completions",
        {"prompt": "a b", "bid": "0.01", "max_tokens": 5},
        False,
    ),
    "chat-whole": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "a b"}], "bid": "0.01", "max_tokens": 5},
        False,
    ),
    "chat-stream": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "a b"}],
            "bid": "0.01",
            "max_tokens": 5,
            "stream": True,
        },
        True,
    ),
}


@pytest.mark.parametrize("mode", ["priority", "ordered"])
def test_a_whole_answer_is_asked_of_the_engine_in_coarse_chunks(
    ledger_db: MigratedDatabase, mode: str
) -> None:
    faulty = FaultySGLang("ok")
    with (
        faulty.serve() as url,
        running_server(
            ledger_db, engine_url=url, engine_mode=mode, engine_stream_interval=INTERVAL
        ) as server,
    ):
        key = server.create_user("alice")
        with server.client(key) as client:
            for rid, (path, body, _) in REQUESTS.items():
                reply = client.post(path, json={**body, "rid": rid})
                assert reply.status_code == 200, reply.text
                if body.get("stream"):
                    assert reply.text.endswith("data: [DONE]\n\n")
    sent = {received.rid.removeprefix("alice/"): received for received in faulty.received}
    assert sorted(sent) == sorted(REQUESTS)
    for rid, (_, _, client_streams) in REQUESTS.items():
        received = sent[rid]
        assert received.stream, rid  # streamed from the engine either way
        interval = received.sampling_params.get("stream_interval")
        if rid == "generate-own-interval":
            assert interval == 2  # a streaming client's own choice is kept
        elif client_streams:
            assert interval is None, rid  # a chunk per token, as the client reads them
        else:
            assert interval == INTERVAL, rid
    assert server.ledger.reconcile().ok
