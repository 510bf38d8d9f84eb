"""OpenAI tool calling through the auction server on the real SGLang, read by the `openai` client.

The model has random weights, so what it says is noise: `required` and a named function are
held to calls by the JSON-schema constraint the server sends (as SGLang's own chat route
builds it), and under `auto` a `regex` (one of SGLang's extra fields, passed through) makes it
write a call in the `<tool_call>` format its chat template asks for, which the server must
then find in the text. Every prompt is checked against SGLang's own rendering of the same
chat with the same tools (its `/tokenize`), so the tools and the tool calls in the history
did reach the model's chat template.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from bench.sglang_cpu.launcher import SGLangServer
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.server.harness import RunningServer, running_server
from tests.sglang.conftest import assert_ledger_settled

CITY = {"type": "string", "enum": ["Paris", "Oslo"]}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": CITY},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "enum": ["UTC"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
ASK: list[Any] = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "What is the weather in Oslo?"},
]
CALL_OSLO = (
    '<tool_call>\\n\\{"name": "get_weather", "arguments": \\{"city": "Oslo"\\}\\}\\n</tool_call>'
)


@pytest.fixture(scope="module")
def server(
    sglang_tools: SGLangServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    db: MigratedDatabase
    folder = Path(tmp_path_factory.mktemp("tool-front"))
    with (
        migrated_database("sqlite", folder) as db,
        running_server(db, engine_url=sglang_tools.url, max_wait_ms=0) as running,
    ):
        yield running


def _openai(server: RunningServer, user: str) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key=server.create_user(user), max_retries=0)


def _engine_prompt_tokens(server: RunningServer, messages: list[Any], tools: Any) -> int:
    """How many tokens SGLang's own chat template makes of this chat with these tools."""
    body: dict[str, Any] = {"messages": messages}
    if tools:
        body.update(tools=tools, tool_choice="auto")
    reply = httpx.post(str(server.settings.engine_url) + "/tokenize", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    count: int = reply.json()["count"]
    return count


def test_required_and_named_choices_answer_with_calls_the_client_reads(
    server: RunningServer,
) -> None:
    client = _openai(server, "ann")
    required = client.chat.completions.create(
        model="default",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
        temperature=0,
        extra_body={"bid": "0.1"},
    )
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1  # parallel_tool_calls false: maxItems 1
    call = calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in {"get_weather", "get_time"}
    arguments = json.loads(call.function.arguments)
    assert arguments in ({"city": "Paris"}, {"city": "Oslo"}, {"zone": "UTC"})
    assert required.usage is not None
    assert required.usage.prompt_tokens == _engine_prompt_tokens(server, ASK, TOOLS)
    assert required.usage.prompt_tokens > _engine_prompt_tokens(server, ASK, None) + 100

    named = client.chat.completions.create(
        model="default",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,  # random weights would repeat the call up to max_tokens
        max_tokens=64,
        temperature=0,
    )
    assert named.choices[0].finish_reason == "tool_calls", named.choices[0]
    named_calls = named.choices[0].message.tool_calls
    assert named_calls is not None and len(named_calls) == 1
    assert named_calls[0].function.name == "get_time"
    assert json.loads(named_calls[0].function.arguments) == {"zone": "UTC"}
    # The template was shown the named tool alone, as SGLang shows it.
    assert named.usage is not None
    assert named.usage.prompt_tokens == _engine_prompt_tokens(server, ASK, TOOLS[1:])
    assert_ledger_settled(server, ["ann"])


def test_auto_reads_a_call_from_the_text_then_takes_the_result_in_the_next_turn(
    server: RunningServer,
) -> None:
    client = _openai(server, "bob")
    first = client.chat.completions.create(
        model="default",
        messages=ASK,
        tools=TOOLS,
        max_tokens=120,
        temperature=0,
        extra_body={"regex": "Checking\\. " + CALL_OSLO},
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content == "Checking."
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Oslo"}

    history: list[Any] = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": '{"celsius": 4}'},
    ]
    second = client.chat.completions.create(
        model="default", messages=history, tools=TOOLS, max_tokens=4, temperature=0
    )
    assert second.choices[0].message.tool_calls is None  # noise, not a call
    assert isinstance(second.choices[0].message.content, str)
    assert second.usage is not None
    assert second.usage.prompt_tokens == _engine_prompt_tokens(server, history, TOOLS)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20  # type: ignore[union-attr]

    # `none`: the same chat, no tools shown, plain text back.
    plain = client.chat.completions.create(
        model="default", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=4
    )
    assert plain.choices[0].message.tool_calls is None
    assert plain.usage is not None
    assert plain.usage.prompt_tokens == _engine_prompt_tokens(server, ASK, None)
    assert_ledger_settled(server, ["bob"])


def test_streamed_calls_arrive_whole_in_the_last_chunk_after_the_text_before_them(
    server: RunningServer,
) -> None:
    client = _openai(server, "cy")
    asks: list[dict[str, Any]] = [
        {"tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 64},
        {"max_tokens": 120, "extra_body": {"regex": "Checking\\. " + CALL_OSLO}},
    ]
    for ask in asks:
        content, calls, reasons = "", [], []
        for chunk in client.chat.completions.create(
            model="default", messages=ASK, tools=TOOLS, temperature=0, stream=True, **ask
        ):
            delta = chunk.choices[0].delta
            content += delta.content or ""
            calls += delta.tool_calls or []
            reasons.append(chunk.choices[0].finish_reason)
        assert reasons[-1] == "tool_calls" and set(reasons[:-1]) == {None}, (ask, reasons)
        assert len(calls) == 1 and calls[0].index == 0, calls
        assert calls[0].id and calls[0].id.startswith("call_") and calls[0].type == "function"
        assert calls[0].function is not None and calls[0].function.arguments is not None
        arguments = json.loads(calls[0].function.arguments)
        if "regex" in ask.get("extra_body", {}):
            assert content == "Checking."
            assert calls[0].function.name == "get_weather" and arguments == {"city": "Oslo"}
        else:
            assert content == ""  # a constrained answer is all calls: nothing streams before
            assert calls[0].function.name in {"get_weather", "get_time"}
    assert_ledger_settled(server, ["cy"])


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_forced_calls_are_the_ones_sglangs_own_chat_route_makes(
    server: RunningServer, choice: Any
) -> None:
    request = {
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": choice,
        "parallel_tool_calls": False,
        "max_tokens": 64,
        "temperature": 0,
    }
    user = "dee-required" if choice == "required" else "dee-named"
    with server.client(server.create_user(user)) as client:
        ours = client.post("/v1/chat/completions", json={**request, "bid": "0.1"})
    theirs = httpx.post(
        str(server.settings.engine_url) + "/v1/chat/completions", json=request, timeout=120
    )
    assert ours.status_code == 200 and theirs.status_code == 200, (ours.text, theirs.text)
    # The same prompt (the tools in the template), the same constraint, greedy decoding of
    # the same weights: the same calls. Without a --tool-call-parser SGLang leaves them as the
    # JSON text the constraint made; the server reads that text into `tool_calls`.
    assert ours.json()["usage"]["prompt_tokens"] == theirs.json()["usage"]["prompt_tokens"]
    mine, sglangs = ours.json()["choices"][0], theirs.json()["choices"][0]
    assert mine["finish_reason"] == "tool_calls" and sglangs["finish_reason"] == "stop"
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in mine["message"]["tool_calls"]
    ] == [(c["name"], c["parameters"]) for c in json.loads(sglangs["message"]["content"])]
