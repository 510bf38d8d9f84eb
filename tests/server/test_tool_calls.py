"""Tool fields of a chat: what they ask of the template and the engine, and the 400s that
name what is wrong, before anything is charged; the embedded emulator refuses tools."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference_auctions.server.api.tool_calls import NamedToolChoice, ToolSpec, tool_plan
from inference_auctions.server.engine.chat_template import sglang_template_tools
from tests.db_fixtures import migrated_database
from tests.server.harness import RunningServer, running_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "description": "The weather.",
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def _tools(*tools: dict[str, Any]) -> list[ToolSpec]:
    return [ToolSpec.model_validate(tool) for tool in tools]


def test_required_is_sglangs_array_of_calls_of_any_tool() -> None:
    plan = tool_plan(_tools(WEATHER, TIME), "required", None)
    assert plan is not None and plan.constrained and plan.parses
    schema = json.loads(plan.json_schema() or "")
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    names = [option["properties"]["name"]["enum"] for option in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    weather = schema["items"]["anyOf"][0]["properties"]["parameters"]
    assert weather == WEATHER["function"]["parameters"]  # type: ignore[index]
    # A function without parameters takes an empty object, as SGLang's schema says.
    time = schema["items"]["anyOf"][1]["properties"]["parameters"]
    assert time == {"type": "object", "properties": {}}


def test_a_named_function_is_offered_alone_and_one_call_when_not_parallel() -> None:
    choice = NamedToolChoice.model_validate({"type": "function", "function": {"name": "get_time"}})
    plan = tool_plan(_tools(WEATHER, TIME), choice, False)
    assert plan is not None and plan.named and plan.names() == {"get_time"}
    schema = json.loads(plan.json_schema() or "")
    assert schema["maxItems"] == 1
    assert schema["items"]["properties"]["name"]["enum"] == ["get_time"]
    assert plan.template_tools() == [TIME]


def test_auto_and_none_constrain_nothing_and_none_shows_no_tools() -> None:
    auto = tool_plan(_tools(WEATHER), None, None)
    assert auto is not None and auto.choice == "auto" and auto.json_schema() is None
    none = tool_plan(_tools(WEATHER), "none", None)
    assert none is not None and not none.parses and none.template_tools() is None
    assert tool_plan(None, "auto", True) is None  # no tools: nothing asked


def test_tools_reach_the_template_as_sglang_dumps_them_in_the_clients_order() -> None:
    plan = tool_plan(
        _tools(WEATHER, {**TIME, "function": {"strict": True, "name": "t"}}), None, None
    )
    assert plan is not None
    shaped = sglang_template_tools(plan.template_tools())
    assert shaped is not None
    assert list(shaped[0]["function"]) == ["name", "parameters", "description"]
    assert shaped[1]["function"] == {
        "strict": True,
        "name": "t",
        "description": None,
        "parameters": None,
    }
    assert shaped[0]["defer_loading"] is None


@pytest.mark.parametrize(
    ("tools", "choice", "message"),
    [
        ([], "required", "tool_choice: 'required' needs at least one tool"),
        ([WEATHER, WEATHER], None, "tools: function 'get_weather' is declared twice"),
    ],
)
def test_tool_fields_that_do_not_fit_together_say_which(
    tools: list[dict[str, Any]], choice: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        tool_plan(_tools(*tools), choice, None)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = Path(tmp_path_factory.mktemp("tools-emulated"))
    with migrated_database("sqlite", folder) as db, running_server(db) as server:
        yield server


ASK = [{"role": "user", "content": "weather?"}]
CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ],
}


BAD_ARGUMENTS = {"id": "c", "function": {"name": "get_weather", "arguments": "{not json"}}


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"tools": {"name": "f"}}, "tools", "valid list"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools.0.function.name", "required"),
        ({"tools": [{"type": "function"}]}, "tools.0.function", "required"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0.type", "function"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
            "tools.0.function.parameters",
            "dictionary",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "has space"}}]},
            "tools.0.function.name",
            "pattern",
        ),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "'always'"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {}}},
            "tool_choice",
            "function.name",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
            "names function 'x', which tools does not declare",
        ),
        ({"tool_choice": "required"}, "tool_choice", "needs at least one tool"),
        ({"tools": [WEATHER], "parallel_tool_calls": "maybe"}, "parallel_tool_calls", "boolean"),
        (
            {"messages": [*ASK, {**CALLED, "tool_calls": [BAD_ARGUMENTS]}]},
            "messages.1.tool_calls.0.function.arguments",
            "JSON object",
        ),
        ({"messages": [*ASK, {"role": "assistant"}]}, "messages.1.content", "required"),
        (
            {"messages": [{**CALLED, "role": "user"}]},
            "messages.0.tool_calls",
            "only an assistant message carries tool calls",
        ),
        # The emulator generates no text a call could be read from.
        ({"tools": [WEATHER]}, "tools", "the embedded emulator cannot call tools"),
        ({"messages": [*ASK, CALLED]}, "messages", "the embedded emulator cannot call tools"),
        # Deprecated function calling stays refused by name.
        ({"functions": [{"name": "f"}]}, "functions", "send tools and tool_choice"),
    ],
)
def test_a_bad_or_unservable_tool_request_is_a_400_naming_the_field_and_costs_nothing(
    emulated: RunningServer, body: dict[str, Any], param: str, says: str
) -> None:
    user = f"tools-{param.replace('.', '-')}-{abs(hash(json.dumps(body))) % 10_000}"
    key = emulated.create_user(user)
    before = emulated.ledger.balance(user)
    with emulated.client(key) as client:
        reply = client.post(
            "/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, "bid": "1", **body}
        )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert says in error["message"] and error["message"].startswith(param), error
    assert emulated.ledger.balance(user) == before
    assert emulated.ledger.reconcile().ok


def test_tool_fields_that_ask_for_nothing_are_a_plain_chat_on_the_emulator(
    emulated: RunningServer,
) -> None:
    key = emulated.create_user("tools-plain")
    with emulated.client(key) as client:
        reply = client.post(
            "/v1/chat/completions",
            json={
                "messages": ASK,
                "max_tokens": 2,
                "tools": [WEATHER],
                "tool_choice": "none",
                "parallel_tool_calls": True,
            },
        )
        assert reply.status_code == 200, reply.text
        assert "tool_calls" not in reply.json()["choices"][0]["message"]
