"""SGLang's own clients against a real server: its sampling parameters, its route aliases, and
the exact requests its frontend language (`sgl.RuntimeEndpoint`) sends for `gen` and `select`.

The request bodies below are what `sglang/lang/backend/runtime_endpoint.py` (0.5.23) builds;
`bench/sglang_frontend.py` runs the frontend itself against a server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference_auctions.server.api.schemas import SamplingParams
from tests.db_fixtures import migrated_database
from tests.security.conftest import ledger_snapshot
from tests.server.harness import RunningServer, running_server

# `srt/sampling/sampling_params.py` of SGLang 0.5.23: its 27 API fields (../shared/SGLANG.md).
SGLANG_SAMPLING_PARAMS = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
    "n", "beam_width", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval",
    "logit_bias", "sampling_seed", "custom_params", "watermark",
}  # fmt: skip

# A value SGLang accepts for each of them.
ACCEPTED: dict[str, Any] = {
    "max_new_tokens": 4,
    "stop": ["\n\n"],
    "stop_token_ids": [2],
    "stop_regex": ["[.!?]$"],
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "min_p": 0.05,
    "frequency_penalty": 0.1,
    "presence_penalty": -0.1,
    "repetition_penalty": 1.1,
    "min_new_tokens": 1,
    "n": 1,
    "beam_width": 0,
    "json_schema": None,
    "regex": "(yes|no)",
    "ebnf": None,
    "structural_tag": None,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "stream_interval": 2,
    "logit_bias": {"5": -1.5},
    "sampling_seed": 7,
    "custom_params": {"k": [1, 2.5]},
    "watermark": {"key": 1},
}


@pytest.fixture(scope="module")
def sglang_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server on SQLite for the whole module: these tests concern the HTTP contract."""
    folder = tmp_path_factory.mktemp("sglang-clients")
    with migrated_database("sqlite", Path(folder)) as db, running_server(db) as server:
        yield server


def test_exactly_sglangs_sampling_parameters_are_accepted(sglang_server: RunningServer) -> None:
    assert set(SamplingParams.model_fields) == SGLANG_SAMPLING_PARAMS == set(ACCEPTED)
    key = sglang_server.create_user("params")
    with sglang_server.client(key) as client:
        every = client.post("/generate", json={"text": "hi", "sampling_params": ACCEPTED})
        assert every.status_code == 200, every.text
        nulls = dict.fromkeys(SGLANG_SAMPLING_PARAMS)  # null is the default
        reply = client.post("/generate", json={"text": "hi", "sampling_params": nulls})
        assert reply.status_code == 200, reply.text
        refused = [
            ({"max_new_token": 4}, "max_new_token"),  # not a parameter
            ({"choice": ["a"]}, "choice"),
            ({"best_of": None}, "best_of"),  # unknown even when null
            ({"top_k": 0}, "top_k must be -1 (disable) or at least 1"),
            ({"min_new_tokens": 5, "max_new_tokens": 4}, "min_new_tokens must be in"),
            ({"regex": "a", "ebnf": "b"}, "only one of regex, json_schema or ebnf"),
            ({"logit_bias": {"x": 1.0}}, "logit_bias keys must be token ids"),
            ({"stop_regex": 5}, "stop_regex"),
            ({"watermark": "on"}, "watermark"),
            ({"n": 2}, "n"),
        ]
        for params, says in refused:
            reply = client.post("/generate", json={"text": "hi", "sampling_params": params})
            assert reply.status_code == 400, (params, reply.text)
            assert says in reply.json()["error"]["message"], (params, reply.text)


def test_sglangs_deprecated_info_routes_are_served(sglang_server: RunningServer) -> None:
    key = sglang_server.create_user("info")
    with sglang_server.client(key) as client:
        for path in ("/model_info", "/server_info"):
            current, alias = client.get(path), client.get("/get_" + path[1:])
            assert current.status_code == alias.status_code == 200, alias.text
            assert alias.json() == current.json()
        # The model the embedded emulator serves, as `/v1/models` names it.
        assert client.get("/get_model_info").json()["model_path"] == "inference-auction-emulated"
    with sglang_server.client(None) as anonymous:
        assert anonymous.get("/get_model_info").status_code == 401


def _frontend_gen_body(text: str) -> dict[str, Any]:
    """`RuntimeEndpoint.generate` for `sgl.gen("answer", max_new_tokens=16)`."""
    return {
        "text": text,
        "sampling_params": {
            "skip_special_tokens": True,
            "spaces_between_special_tokens": True,
            "max_new_tokens": 16,
            "min_new_tokens": 0,
            "n": 1,
            "stop": [],
            "stop_token_ids": [],
            "stop_regex": None,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
            "min_p": 0.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "ignore_eos": False,
            "regex": None,
            "json_schema": None,
        },
    }


def test_the_frontends_gen_is_served_and_its_select_refused_by_name(
    sglang_server: RunningServer,
) -> None:
    key = sglang_server.create_user("frontend")
    prompt = "Q: Is the sky blue?\nA:"
    with sglang_server.client(key) as client:
        info = client.get("/get_model_info")
        assert info.status_code == 200 and "model_path" in info.json()
        for streamed in (False, True):
            body = {**_frontend_gen_body(prompt), "stream": streamed}
            reply = client.post("/generate", json=body)
            assert reply.status_code == 200, reply.text
        # `select`: first the shared prefix with max_new_tokens 0 (served)...
        prefix = client.post(
            "/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 0}}
        )
        assert prefix.status_code == 200, prefix.text
        prompt_tokens = prefix.json()["meta_info"]["prompt_tokens"]
        # ...then the logprobs of every choice in one batched request: refused, saying why.
        before = ledger_snapshot(sglang_server.ledger.engine)
        choices = {
            "text": [prompt + choice for choice in (" yes", " no")],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "return_text_in_logprobs": True,
            "logprob_start_len": max(prompt_tokens - 2, 0),
        }
        reply = client.post("/generate", json=choices)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "return_logprob"
        for words in ("no logprobs", "emulator", "select", "regex"):
            assert words in error["message"], error
        assert ledger_snapshot(sglang_server.ledger.engine) == before
