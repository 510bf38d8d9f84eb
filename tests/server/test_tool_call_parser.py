"""Reading tool calls from answers: whole calls become OpenAI's `tool_calls`; anything not
wholly a call stays the answer's plain content."""

from __future__ import annotations

import json

import pytest

from inference_auctions.server.api.tool_call_parser import (
    ParsedCall,
    openai_tool_calls,
    parse_constrained,
    parse_tagged,
    streamable_end,
)

NAMES = frozenset({"get_weather", "get_time"})


def test_a_qwen_style_answer_gives_its_calls_in_order_and_the_text_before_them() -> None:
    text = (
        "Let me check both.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    )
    content, calls = parse_tagged(text, NAMES)
    assert content == "Let me check both."
    assert calls == [
        ParsedCall("get_weather", {"city": "Oslo"}),
        ParsedCall("get_time", {"zone": "UTC"}),
    ]


def test_a_call_alone_has_no_content_and_hermes_parameters_are_its_arguments() -> None:
    content, calls = parse_tagged(
        '<tool_call>{"name": "get_time", "parameters": {"zone": "UTC"}}</tool_call>\n', NAMES
    )
    assert content is None
    assert calls == [ParsedCall("get_time", {"zone": "UTC"})]
    content, calls = parse_tagged('<tool_call>\n{"name": "get_time"}\n</tool_call>', NAMES)
    assert calls == [ParsedCall("get_time", {})]  # no arguments: an empty object


@pytest.mark.parametrize(
    "text",
    [
        "The weather in Oslo is mild.",  # no call at all
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os',  # cut by max_tokens
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}\n</tool_call>',
        '<tool_call>\n{"arguments": {"city": "Oslo"}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>',  # not offered
        '<tool_call>\n{"name": "get_time", "arguments": "UTC"}\n</tool_call>',  # not an object
        '<tool_call>\n["get_time"]\n</tool_call>',  # not an object at all
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call> and then I said more',
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call> x <tool_call>{"name": '
        '"get_time", "arguments": {}}</tool_call>',  # prose between calls
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n<tool_call>{"name"',
    ],
)
def test_an_answer_not_wholly_calls_stays_plain_content(text: str) -> None:
    assert parse_tagged(text, NAMES) == (text, [])


def test_a_constrained_answer_is_a_json_array_of_calls() -> None:
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {"zone": "UTC"}}]'  # noqa: E501
    assert parse_constrained(text, NAMES) == [
        ParsedCall("get_weather", {"city": "Paris"}),
        ParsedCall("get_time", {"zone": "UTC"}),
    ]
    # A lone object is one call, as SGLang reads it.
    assert parse_constrained('{"name": "get_time", "parameters": {}}', NAMES) == [
        ParsedCall("get_time", {})
    ]


@pytest.mark.parametrize(
    "text",
    [
        '[{"name": "get_weather", "parameters": {"city": "Par',  # cut by max_tokens
        "[]",
        '"get_time"',
        '[{"name": "get_time", "parameters": {}}, {"name": "other", "parameters": {}}]',
        '[{"name": "get_time", "parameters": []}]',
        "[\n  \n  \n",
    ],
)
def test_a_constrained_answer_that_is_not_whole_calls_is_no_call(text: str) -> None:
    assert parse_constrained(text, NAMES) is None


def test_openai_tool_calls_carry_ids_and_arguments_as_json_strings() -> None:
    calls = openai_tool_calls(
        [ParsedCall("get_weather", {"city": "Zürich"}), ParsedCall("get_time", {})]
    )
    assert [call["type"] for call in calls] == ["function", "function"]
    assert all(call["id"].startswith("call_") and len(call["id"]) == 29 for call in calls)
    assert calls[0]["id"] != calls[1]["id"]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Zürich"}'}
    assert json.loads(calls[1]["function"]["arguments"]) == {}


@pytest.mark.parametrize(
    ("text", "streamable"),
    [
        ("Let me check", "Let me check"),
        ("Let me check. ", "Let me check."),  # blanks may come before a call
        ("Let me check. <tool", "Let me check."),  # may be the start of a call
        ("Let me check. <tool_call>\n{", "Let me check."),
        ("a < b", "a < b"),
        ("a <b>", "a <b>"),
        ("<", ""),
        ("<tool_call>", ""),
    ],
)
def test_an_auto_answer_streams_only_what_cannot_be_a_call(text: str, streamable: str) -> None:
    assert text[: streamable_end(text)] == streamable
