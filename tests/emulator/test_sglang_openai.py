"""The emulator's OpenAI-compatible routes, `/v1/chat/completions` and `/v1/completions`, over
real HTTP: SGLang's response shapes, streaming, stop strings, errors, and the official client."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from inference_auctions.server.emulator.sglang_openai import render_chat, sendable, stop_cut
from inference_auctions.server.engine.builtin_tokenizer import encode
from tests.engine.conftest import emulator

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Name three rivers"}]}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with emulator(time_scale=0.01) as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=10) as http:
        yield http


def _events(response: httpx.Response) -> list[Any]:
    events = [line[len("data: ") :] for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


def test_a_chat_completion_has_sglangs_shape_and_counts_the_rendered_prompt(
    client: httpx.Client,
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Name "}, {"type": "text", "text": "one"}],
        },
    ]
    body = {"model": "any-name", "messages": messages, "max_tokens": 5, "rid": "chat-1"}
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200
    answer = reply.json()
    assert answer["id"] == "chat-1"
    assert answer["object"] == "chat.completion"
    assert answer["model"] == "any-name"
    assert abs(answer["created"] - time.time()) < 60
    [choice] = answer["choices"]
    assert choice["index"] == 0
    assert choice["finish_reason"] == "length"
    assert choice["message"]["role"] == "assistant"
    content = choice["message"]["content"]
    assert len(encode(content)) == 5
    prompt = render_chat([("system", "Be brief."), ("user", "Name one")])
    assert prompt == "<|system|>\nBe brief.\n<|user|>\nName one\n<|assistant|>\n"
    assert answer["usage"]["prompt_tokens"] == len(encode(prompt))
    assert answer["usage"]["completion_tokens"] == 5
    assert answer["usage"]["total_tokens"] == len(encode(prompt)) + 5


def test_a_streamed_chat_sends_the_role_then_the_same_text_in_deltas(client: httpx.Client) -> None:
    whole = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 6}).json()
    body = {**CHAT, "max_completion_tokens": 6, "stream": True}
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.headers["content-type"].startswith("text/event-stream")
    chunks = _events(reply)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"]["content"] for c in chunks[1:]]
    assert len(deltas) == 6  # one per token
    assert "".join(deltas) == whole["choices"][0]["message"]["content"]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons == [None] * 6 + ["length"]


def test_a_streamed_completion_ends_with_usage_when_asked(client: httpx.Client) -> None:
    body = {"model": "m", "prompt": [7, 8, 9], "max_tokens": 3, "stream": True}
    options = {"stream_options": {"include_usage": True}}
    chunks = _events(client.post("/v1/completions", json={**body, **options}))
    assert {c["object"] for c in chunks} == {"text_completion"}
    *text_chunks, usage = chunks
    assert len(text_chunks) == 3
    assert usage["choices"] == []
    assert usage["usage"]["prompt_tokens"] == 3
    assert usage["usage"]["completion_tokens"] == 3
    plain = _events(client.post("/v1/completions", json=body))
    assert all(c["usage"] is None for c in plain)
    assert len(plain) == 3


def test_a_completion_defaults_to_16_tokens_and_takes_one_prompt_in_a_list(
    client: httpx.Client,
) -> None:
    answer = client.post("/v1/completions", json={"model": "m", "prompt": ["Once upon"]}).json()
    assert answer["object"] == "text_completion"
    assert answer["usage"]["completion_tokens"] == 16
    assert len(encode(answer["choices"][0]["text"])) == 16
    assert answer["usage"]["prompt_tokens"] == len(encode("Once upon"))


def _text(client: httpx.Client, tokens: int) -> str:
    body = {"model": "m", "prompt": "stop here", "max_tokens": tokens}
    text: str = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    return text


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_ends_the_completion_before_it(client: httpx.Client, stream: bool) -> None:
    text = _text(client, 12)
    stop = text.split()[3]  # a word in the middle
    before = text[: text.index(stop)]
    body = {"model": "m", "prompt": "stop here", "max_tokens": 12, "stop": ["zzz", stop]}
    reply = client.post("/v1/completions", json={**body, "stream": stream})
    if stream:
        chunks = _events(reply)
        sent = "".join(c["choices"][0]["text"] for c in chunks)
        final = chunks[-1]["choices"][0]
    else:
        final = reply.json()["choices"][0]
        sent = final["text"]
    assert sent == before  # the stop string itself never reaches the client
    assert final["finish_reason"] == "stop"
    assert final["matched_stop"] == stop
    if not stream:
        # The engine stopped there: fewer tokens than asked for were generated and counted.
        assert reply.json()["usage"]["completion_tokens"] < 12


def test_the_engine_is_released_once_a_stop_string_matched(client: httpx.Client) -> None:
    text = _text(client, 4)
    body = {"model": "m", "prompt": "stop here", "max_tokens": 5000, "stop": text.split()[1]}
    assert client.post("/v1/completions", json=body).status_code == 200
    deadline = time.monotonic() + 5
    while client.get("/v1/loads").json()["loads"][0]["num_running_reqs"]:
        assert time.monotonic() < deadline, "the stopped request still runs"
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {**CHAT, "n": 2}, "n"),
        ("/v1/chat/completions", {"model": "m"}, "messages"),
        ("/v1/chat/completions", {"model": "m", "messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": CHAT["messages"]}, "model"),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "robot"}]}, "messages[0].role"),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        ("/v1/chat/completions", {**CHAT, "temperature": 3}, "temperature"),
        ("/v1/chat/completions", {**CHAT, "top_p": "high"}, "top_p"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": -1}, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 2.5}, "max_completion_tokens"),
        ("/v1/chat/completions", {**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream"),
        ("/v1/completions", {"model": "m", "prompt": ["one", "two"]}, "prompt"),
        ("/v1/completions", {"model": "m", "prompt": []}, "prompt"),
        ("/v1/completions", {"model": "m"}, "prompt"),
        ("/v1/completions", {"model": "m", "prompt": "x", "seed": "s"}, "seed"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    client: httpx.Client, path: str, body: dict[str, Any], param: str
) -> None:
    for stream in (False, True):
        sent = body if "stream" in body else {**body, "stream": stream}
        reply = client.post(path, json=sent)
        assert reply.status_code == 400
        error = reply.json()
        assert error["object"] == "error"
        assert error["type"] == "BadRequestError"
        assert error["code"] == 400
        assert error["param"] == param
        field = param.rsplit(".", maxsplit=1)[-1].split("[", maxsplit=1)[0]
        assert field in error["message"]  # the text names it too


def test_a_body_that_is_not_json_is_a_400(client: httpx.Client) -> None:
    reply = client.post("/v1/chat/completions", content=b"{not json")
    assert reply.status_code == 400
    assert reply.json()["type"] == "BadRequestError"


def test_a_prompt_longer_than_the_context_is_a_400(client: httpx.Client) -> None:
    body = {"model": "m", "prompt": list(range(1, 30_000)), "max_tokens": 1}
    reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 400
    assert "context length" in reply.json()["message"]


def test_stop_helpers_cut_at_the_earliest_match_and_hold_back_partial_ones() -> None:
    assert stop_cut("one two three", ("three", "two")) == ("one ", "two")
    assert stop_cut("one two", ()) == ("one two", None)
    # "thr" may still become "three": it is held back until the text says otherwise.
    assert sendable("one two thr", ("three",)) == len("one two ")
    assert sendable("one two thx", ("three",)) == len("one two thx")
    assert sendable("abc", ()) == 3


def test_the_official_openai_client_talks_to_the_emulator(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(
        model="emulated", messages=[{"role": "user", "content": "Hello"}], max_tokens=4
    )
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 4
    content = chat.choices[0].message.content
    assert content is not None
    assert len(encode(content)) == 4
    stream = client.chat.completions.create(
        model="emulated",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=4,
        stream=True,
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == content
    completion = client.completions.create(model="emulated", prompt="Hello", max_tokens=2)
    assert completion.choices[0].text
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 2
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="emulated", messages=[{"role": "user", "content": "Hello"}], n=2
        )
    assert "`n` must be 1" in str(refused.value)
