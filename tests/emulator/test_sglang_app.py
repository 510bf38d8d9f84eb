"""The emulator's HTTP contract: SGLang's endpoints, bodies and error shapes, over real HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from inference_auctions.server.engine.builtin_tokenizer import encode
from tests.engine.conftest import emulator

META_KEYS = [
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "forward_entry_time",
    "prefill_finished_time",
    "queue_time",
    "reasoning_tokens",
    "completion_tokens",
    "cached_tokens",
    "e2e_latency",
    "request_received_ts",
    "first_token_latency",
    "request_finished_ts",
    "decode_throughput",
]


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with emulator(time_scale=0.01) as (url, _), httpx.Client(base_url=url, timeout=10) as http:
        yield http


def _events(response: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in response.text.split("\n\n") if line]


def test_generate_returns_sglang_meta_info_in_its_order(client: httpx.Client) -> None:
    body = {"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 4}, "rid": "m1"}
    response = client.post("/generate", json=body)
    assert response.status_code == 200
    output = response.json()
    assert list(output["meta_info"]) == META_KEYS
    meta = output["meta_info"]
    assert meta["id"] == "m1"
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert meta["prompt_tokens"] == len(encode("The quick brown fox"))
    assert meta["completion_tokens"] == 4 == len(output["output_ids"])
    assert meta["first_token_latency"] <= meta["e2e_latency"]
    assert encode(output["text"]) == output["output_ids"]


def test_a_streamed_generate_is_server_sent_events_ending_with_done(client: httpx.Client) -> None:
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}, "stream": True}
    response = client.post("/generate", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    *outputs, done = _events(response)
    assert done == "[DONE]"
    chunks = [json.loads(event) for event in outputs]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None, None]
    assert len(chunks[-1]["output_ids"]) == 3


@pytest.mark.parametrize(
    ("interval", "chunk_tokens"),
    [
        (None, [1, 2, 3, 4, 5, 6, 7, 8]),
        (0, [1, 2, 3, 4, 5, 6, 7, 8]),  # SGLang reads a falsy interval as its default, 1
        (1, [1, 2, 3, 4, 5, 6, 7, 8]),
        (3, [1, 4, 7, 8]),  # the first token, every third after it, and the final chunk
        (64, [1, 8]),
    ],
)
def test_stream_interval_sends_the_first_token_then_every_kth_as_sglang_does(
    client: httpx.Client, interval: int | None, chunk_tokens: list[int]
) -> None:
    sampling: dict[str, Any] = {"max_new_tokens": 8}
    if interval is not None:
        sampling["stream_interval"] = interval
    body = {"input_ids": [5, 6, 7, 8], "sampling_params": sampling, "stream": True}
    *outputs, done = _events(client.post("/generate", json=body))
    assert done == "[DONE]"
    chunks = [json.loads(event) for event in outputs]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == chunk_tokens
    # Coarser chunks, the same answer: the final one is whole.
    whole = client.post("/generate", json={**body, "stream": False}).json()
    assert chunks[-1]["output_ids"] == whole["output_ids"]
    assert chunks[-1]["text"] == whole["text"]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            {"input_ids": [1], "sampling_params": {"max_new_token": 3}},
            "unknown field `max_new_token`, expected one of `max_new_tokens`, `stop`,",
        ),
        ({"input_ids": [1], "priority": "high"}, 'invalid type: string "high", expected i64'),
        ({"input_ids": [1], "stream": "yes"}, 'invalid type: string "yes", expected a boolean'),
        ({"input_ids": ["a"]}, 'invalid type: string "a", expected a sequence'),
    ],
)
def test_a_body_that_breaks_the_json_contract_is_a_plain_400(
    client: httpx.Client, body: dict[str, Any], error: str
) -> None:
    for stream in (False, True):
        response = client.post("/generate", json={**body, "stream": body.get("stream", stream)})
        assert response.status_code == 400
        assert response.json()["error"].startswith(error)


def test_bad_input_is_a_400_with_a_message_or_an_error_event_when_streamed(
    client: httpx.Client,
) -> None:
    response = client.post("/generate", json={"sampling_params": {"max_new_tokens": 1}})
    assert response.status_code == 400
    message = "Either text, input_ids or input_embeds should be provided."
    assert response.json() == {"error": {"message": message}}
    streamed = client.post("/generate", json={"stream": True})
    assert streamed.status_code == 200
    error, done = _events(streamed)
    assert json.loads(error)["error"]["message"] == message
    assert done == "[DONE]"


def test_a_duplicate_rid_in_flight_is_a_400(client: httpx.Client) -> None:
    long = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 5000}, "rid": "dup"}
    with client.stream("POST", "/generate", json={**long, "stream": True}) as first:
        # Keep the line iterator: dropping it closes the connection, which aborts the request.
        lines = first.iter_lines()
        next(lines)  # the first request is running
        response = client.post("/generate", json={**long, "rid": "dup"})
        assert response.status_code == 400
        assert response.json() == {"error": {"message": "Duplicate request ID detected: dup"}}


def test_a_client_that_goes_away_aborts_its_request(client: httpx.Client) -> None:
    body = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 5000}, "stream": True}
    with client.stream("POST", "/generate", json=body) as response:
        next(response.iter_lines())  # then the client closes the connection
    deadline = time.monotonic() + 5
    while client.get("/v1/loads").json()["loads"][0]["num_running_reqs"]:
        assert time.monotonic() < deadline, "the abandoned request still runs"
        time.sleep(0.01)


def test_a_client_that_stops_waiting_for_a_plain_answer_aborts_it(client: httpx.Client) -> None:
    body = {"input_ids": [3, 5], "sampling_params": {"max_new_tokens": 5000}}
    with pytest.raises(httpx.ReadTimeout):
        client.post("/generate", json=body, timeout=httpx.Timeout(10, read=0.1))
    deadline = time.monotonic() + 5
    while client.get("/v1/loads").json()["loads"][0]["num_running_reqs"]:
        assert time.monotonic() < deadline, "the abandoned request still runs"
        time.sleep(0.01)


def test_abort_request_ends_a_stream_with_an_abort(client: httpx.Client) -> None:
    body = {"input_ids": [8], "sampling_params": {"max_new_tokens": 5000}, "stream": True}
    with client.stream("POST", "/generate", json={**body, "rid": "stop-me"}) as response:
        lines = response.iter_lines()
        next(lines)
        assert client.post("/abort_request", json={"rid": "stop-me"}).status_code == 200
        events = [line for line in lines if line.startswith("data: ")]
    last = json.loads(events[-2][len("data: ") :])
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert events[-1] == "data: [DONE]"


def test_tokenize_and_detokenize(client: httpx.Client) -> None:
    tokens = client.post("/tokenize", json={"prompt": "Hello, world!"}).json()
    assert tokens["tokens"] == encode("Hello, world!")
    assert tokens["count"] == len(tokens["tokens"])
    assert tokens["max_model_len"] == 23_000
    batch = client.post("/v1/tokenize", json={"prompt": ["a b", "c"]}).json()
    assert batch["count"] == [2, 1]
    text = client.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["text"]
    assert text == "Hello, world!"
    output = client.post("/generate", json={"input_ids": [1], "sampling_params": {}}).json()
    decoded = client.post("/v1/detokenize", json={"tokens": output["output_ids"]}).json()
    assert decoded["text"] == output["text"]
    assert len(output["output_ids"]) == 128  # SGLang's default max_new_tokens


def test_information_endpoints(client: httpx.Client) -> None:
    for path in ("/health", "/health_generate", "/ready"):
        assert client.get(path).status_code == 200
    models = client.get("/v1/models").json()
    assert models["data"][0]["max_model_len"] == 23_000
    assert client.get("/model_info").json() == client.get("/get_model_info").json()
    info = client.get("/server_info").json()
    assert info["schedule_policy"] == "fcfs"
    assert info["enable_priority_scheduling"] and info["schedule_low_priority_values_first"]
    assert info["version"].endswith("emulator")
    assert info["emulator"]["cost_model"]["decode_seconds_per_step"] == 0.025
    loads = client.get("/v1/loads").json()["loads"]
    assert set(loads[0]) >= {"num_running_reqs", "num_waiting_reqs", "token_usage"}


def test_metrics_expose_sglang_counters(client: httpx.Client) -> None:
    client.post("/generate", json={"input_ids": [9, 9, 9], "sampling_params": {}})
    text = client.get("/metrics").text
    for series in (
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:cached_tokens_total",
        "sglang:num_requests_total",
        "sglang:evicted_tokens_total",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:e2e_request_latency_seconds_count",
        "sglang:queue_time_seconds_sum",
        "sglang:num_running_reqs",
        "sglang:token_usage",
    ):
        assert series in text


def test_flush_cache_waits_for_an_idle_engine(client: httpx.Client) -> None:
    body = {"input_ids": [7], "sampling_params": {"max_new_tokens": 5000}, "stream": True}
    with client.stream("POST", "/generate", json=body) as response:
        lines = response.iter_lines()
        next(lines)
        busy = client.post("/flush_cache")
    assert busy.status_code == 400
    deadline = time.monotonic() + 5
    while (idle := client.get("/flush_cache")).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert idle.text == "Cache flushed.\n"


def test_an_invalid_json_body_is_a_400(client: httpx.Client) -> None:
    response = client.post(
        "/generate", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["code"] == 400


def test_the_context_length_refusals_are_sglangs() -> None:
    # SGLang 0.5.23 refuses a prompt of at least the context length, and a prompt plus an
    # explicit max_new_tokens of at least it; a prompt plus the default is clipped instead.
    with emulator(cache_tokens=100) as (url, _), httpx.Client(base_url=url, timeout=10) as http:
        limit = http.post("/tokenize", json={"prompt": "x"}).json()["max_model_len"]
        assert limit == 100

        def generate(prompt: int, **sampling: int) -> httpx.Response:
            body = {"input_ids": list(range(1, prompt + 1)), "sampling_params": sampling}
            return http.post("/generate", json=body)

        too_long = generate(100)
        assert too_long.status_code == 400
        assert "The input (100 tokens) is longer than the model's context length (100 tokens)." in (
            too_long.text
        )
        total = generate(90, max_new_tokens=10)
        assert total.status_code == 400
        assert (
            "Requested token count exceeds the model's maximum context length of 100 tokens. "
            "You requested a total of 100 tokens: 90 tokens from the input messages and 10 "
            "tokens for the completion."
        ) in total.text
        assert generate(90, max_new_tokens=9).status_code == 200
        assert generate(99).status_code == 200
