"""Tool calls read from what the engine answers, whole and streamed, through a real server.

The engine is the SGLang emulator's HTTP app on a real port, with its answers' text replaced
by a script (the emulator writes no real text): what a model would have written, calls or
not, as the `/generate` answer (cumulative text in every streamed chunk, as SGLang sends it).
What the server sent the engine is recorded too. The real model's turn is in
tests/sglang/test_tool_calls.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference_auctions.server.emulator.live import LiveSimulator
from inference_auctions.server.emulator.sglang_app import create_sglang_app
from inference_auctions.server.emulator.simulator import EngineSimulator
from tests.db_fixtures import migrated_database
from tests.engine.conftest import serve
from tests.server.harness import RunningServer, running_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASK = [{"role": "user", "content": "weather in Oslo?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


class _Scripted:
    """ASGI middleware: `/generate` answers carry `script` as their text (streamed in three
    growing pieces), finished as `finish` says; the JSON body of every POST to `/generate` is
    kept in `sent`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.script = ""
        self.finish: dict[str, Any] = {"type": "stop", "matched": 2}
        self.sent: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/generate":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        self.sent.append(json.loads(body))
        events: list[bytes] = []
        start: dict[str, Any] = {}

        delivered = False

        async def replay() -> Any:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def keep(message: Any) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            else:
                events.append(message.get("body", b""))

        await self.app(scope, replay, keep)
        headers = [(k, v) for k, v in start["headers"] if k != b"content-length"]
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": self._rewritten(b"".join(events))})

    def _rewritten(self, raw: bytes) -> bytes:
        if not raw.startswith(b"data: "):
            answer = json.loads(raw)
            answer["text"] = self.script
            answer["meta_info"]["finish_reason"] = self.finish
            return json.dumps(answer).encode()
        chunks = [json.loads(line[6:]) for line in raw.split(b"\n\n") if line[6:7] == b"{"]
        last = chunks[-1]
        pieces = [self.script[: len(self.script) * k // 3] for k in (1, 2, 3)]
        out = [{**last, "text": piece, "meta_info": {**last["meta_info"]}} for piece in pieces]
        for early in out[:-1]:
            early["meta_info"]["finish_reason"] = None
        out[-1]["meta_info"]["finish_reason"] = self.finish
        return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in out) + (
            b"data: [DONE]\n\n"
        )


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[str, _Scripted]]:
    live = LiveSimulator(EngineSimulator(), time_scale=0.001)
    scripted = _Scripted(create_sglang_app(live))
    with serve(scripted) as url:
        yield url, scripted


@pytest.fixture(scope="module")
def server(
    engine: tuple[str, _Scripted], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    folder = Path(tmp_path_factory.mktemp("tools-served"))
    with migrated_database("sqlite", folder) as db, running_server(db, engine_url=engine[0]) as s:
        yield s


_USERS = iter(range(10_000))


def _key(server: RunningServer, user: str) -> str:
    return server.create_user(f"{user}-{next(_USERS)}")


def _chat(server: RunningServer, user: str, **body: Any) -> dict[str, Any]:
    with server.client(_key(server, user)) as client:
        reply = client.post("/v1/chat/completions", json={"messages": ASK, "bid": "0.1", **body})
    assert reply.status_code == 200, reply.text
    answer: dict[str, Any] = reply.json()
    return answer


def _streamed(server: RunningServer, user: str, **body: Any) -> list[dict[str, Any]]:
    with server.client(_key(server, user)) as client:
        reply = client.post("/v1/chat/completions", json={"messages": ASK, "stream": True, **body})
    assert reply.status_code == 200, reply.text
    events = [line[6:] for line in reply.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(event)["choices"][0] for event in events[:-1]]


@pytest.mark.parametrize(
    ("script", "content", "calls"),
    [
        (f"Let me look.\n{CALL}", "Let me look.", [("get_weather", {"city": "Oslo"})]),
        (
            CALL + "\n" + CALL.replace("Oslo", "Paris"),
            None,
            [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Paris"})],
        ),
        ("It is mild in Oslo.", "It is mild in Oslo.", []),
        (CALL[:40], CALL[:40], []),  # cut short: the text as it is
        (CALL.replace("get_weather", "get_time"), CALL.replace("get_weather", "get_time"), []),
    ],
)
def test_auto_answers_are_read_for_calls_whole_and_streamed(
    server: RunningServer,
    engine: tuple[str, _Scripted],
    script: str,
    content: str | None,
    calls: list[tuple[str, dict[str, Any]]],
) -> None:
    engine[1].script = script
    answer = _chat(server, "auto", tools=[WEATHER])
    choice = answer["choices"][0]
    message = choice["message"]
    assert message["content"] == content
    got = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls", [])
    ]
    assert got == calls
    assert choice["finish_reason"] == ("tool_calls" if calls else "stop")
    assert all(
        c["type"] == "function" and c["id"].startswith("call_")
        for c in message.get("tool_calls", [])
    )

    chunks = _streamed(server, "auto-streamed", tools=[WEATHER])
    text = "".join(chunk["delta"].get("content") or "" for chunk in chunks)
    streamed_calls = [call for chunk in chunks for call in chunk["delta"].get("tool_calls", [])]
    assert [c["index"] for c in streamed_calls] == list(range(len(calls)))
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed_calls]
    assert got == calls
    assert text == (content or "")
    assert [chunk["finish_reason"] for chunk in chunks][-1] == choice["finish_reason"]
    if calls:  # nothing of a call went out as text before the end
        assert all("<tool" not in (chunk["delta"].get("content") or "") for chunk in chunks)


def test_parallel_tool_calls_false_keeps_the_first_call_under_auto(
    server: RunningServer, engine: tuple[str, _Scripted]
) -> None:
    engine[1].script = CALL + "\n" + CALL.replace("Oslo", "Paris")
    answer = _chat(server, "one-call", tools=[WEATHER], parallel_tool_calls=False)
    calls = answer["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Oslo"}]


def test_required_constrains_the_engine_and_reads_its_json_array(
    server: RunningServer, engine: tuple[str, _Scripted]
) -> None:
    engine[1].script = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    answer = _chat(server, "required", tools=[WEATHER], tool_choice="required")
    schema = json.loads(engine[1].sent[-1]["sampling_params"]["json_schema"])
    assert schema["items"]["anyOf"][0]["properties"]["name"] == {
        "type": "string",
        "enum": ["get_weather"],
    }
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    # An answer cut by max_tokens before the constraint was met is text, finished `length`.
    engine[1].script = '[{"name": "get_weather", "parameters": {"ci'
    engine[1].finish = {"type": "length", "length": 16}
    try:
        answer = _chat(server, "required-cut", tools=[WEATHER], tool_choice="required")
    finally:
        engine[1].finish = {"type": "stop", "matched": 2}
    choice = answer["choices"][0]
    assert choice["message"]["content"] == engine[1].script and choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"]
    # Both a response format and a forced call: refused by name.
    with server.client(server.create_user("both")) as client:
        reply = client.post(
            "/v1/chat/completions",
            json={
                "messages": ASK,
                "tools": [WEATHER],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
        )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "response_format"
