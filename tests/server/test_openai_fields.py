"""Every field of the `openai` client's create() calls is served or refused by name, never
dropped; the model is the engine's; the tier served is in the answer.

The engine is the SGLang emulator's HTTP app on a real port, started with an API key (as
SGLang's `--api-key`); a recorder in front of it keeps each body the server sent it, so a test
sees what reached the engine.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.resources.chat.completions import Completions as ChatCompletions
from openai.resources.completions import Completions as TextCompletions

from inference_auctions.server.api.openai_fields import LABELS, REFUSED
from inference_auctions.server.emulator.live import LiveSimulator
from inference_auctions.server.emulator.sglang_app import create_sglang_app
from inference_auctions.server.emulator.simulator import EngineSimulator
from tests.db_fixtures import migrated_database
from tests.engine.conftest import serve
from tests.server.harness import RunningServer, running_server

ENGINE_KEY = "sk-engine-key-for-the-front"
ENGINE_MODEL = "org/served-model"
# The client's own options, never sent in the body.
CLIENT_OPTIONS = {"self", "extra_headers", "extra_query", "extra_body", "timeout"}

Sent = list[tuple[str, dict[str, Any]]]


class _Recorder:
    """ASGI middleware keeping the JSON body of every POST, with its path."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sent: Sent = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        self.sent.append((scope["path"], json.loads(body) if body else {}))
        delivered = False

        async def replay() -> Any:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def last(self, path: str) -> dict[str, Any]:
        return next(body for sent_path, body in reversed(self.sent) if sent_path == path)


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[str, _Recorder]]:
    live = LiveSimulator(EngineSimulator(), time_scale=0.001, model_name=ENGINE_MODEL)
    recorder = _Recorder(create_sglang_app(live, api_key=ENGINE_KEY))
    with serve(recorder) as url:
        yield url, recorder


@pytest.fixture(scope="module")
def front(
    engine: tuple[str, _Recorder], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """The auction server in front of the engine, with the engine's key."""
    folder = Path(tmp_path_factory.mktemp("front"))
    with (
        migrated_database("sqlite", folder) as db,
        running_server(db, engine_url=engine[0], engine_api_key=ENGINE_KEY) as server,
    ):
        yield server


CHAT = {"messages": [{"role": "user", "content": "name three rivers"}], "max_tokens": 3}
PARAMETERS = {"type": "object", "properties": {"n": {"type": "integer"}}}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": PARAMETERS}}]
TEMPLATE_TOOL = TOOLS[0]
REQUIRED_SCHEMA = (
    '{"type":"array","minItems":1,"items":{"type":"object","anyOf":[{"properties":'
    '{"name":{"type":"string","enum":["f"]},"parameters":'
    + json.dumps(PARAMETERS, separators=(",", ":"))
    + '},"required":["name","parameters"]}]}}'
)
TEXT = {"prompt": "once upon a time", "max_tokens": 3}
# What each served field must show at the engine: (where, key, value) in the /generate body,
# `where` being `sampling_params` or the top level; `None`: served by the route itself (the
# prompt, the model check, streaming, the tier), checked by the tests below.
SAMPLE: dict[str, tuple[Any, tuple[str, str, Any] | None]] = {
    "messages": (CHAT["messages"], None),
    "prompt": (TEXT["prompt"], None),
    "model": (ENGINE_MODEL, None),
    "n": (1, None),
    "stream": (False, None),
    "service_tier": (None, None),
    "max_tokens": (3, ("sampling_params", "max_new_tokens", 3)),
    "max_completion_tokens": (2, ("sampling_params", "max_new_tokens", 2)),
    "temperature": (0.5, ("sampling_params", "temperature", 0.5)),
    "top_p": (0.9, ("sampling_params", "top_p", 0.9)),
    "stop": (["zzz"], ("sampling_params", "stop", ["zzz"])),
    "seed": (7, ("sampling_params", "sampling_seed", 7)),
    "presence_penalty": (0.5, ("sampling_params", "presence_penalty", 0.5)),
    "frequency_penalty": (-0.5, ("sampling_params", "frequency_penalty", -0.5)),
    "logit_bias": ({"5": 2.0}, ("sampling_params", "logit_bias", {"5": 2.0})),
    "logprobs": (True, ("", "return_logprob", True)),
    "top_logprobs": (2, ("", "top_logprobs_num", 2)),
    "response_format": (
        {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}},
        ("sampling_params", "json_schema", '{"type":"object"}'),
    ),
    # Tools reach the engine's chat template (its /tokenize here) as SGLang hands them over;
    # `required` and `parallel_tool_calls` become the constraint on the answer.
    "tools": (TOOLS, ("/tokenize", "tools", [TEMPLATE_TOOL])),
    "tool_choice": ("required", ("sampling_params", "json_schema", REQUIRED_SCHEMA)),
    "parallel_tool_calls": (
        False,
        ("sampling_params", "json_schema", REQUIRED_SCHEMA[:-1] + ',"maxItems":1}'),
    ),
}
# The fields a tool field is sent with, to ask for something.
WITH: dict[str, dict[str, Any]] = {
    "tool_choice": {"tools": TOOLS},
    "parallel_tool_calls": {"tools": TOOLS, "tool_choice": "required"},
}
# A value for each refused field that asks for something.
REFUSED_SAMPLE: dict[str, Any] = {
    "functions": [{"name": "f", "parameters": {}}],
    "function_call": "auto",
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "high",
    "verbosity": "low",
    "web_search_options": {},
    "moderation": {"enabled": True},
    "best_of": 3,
    "echo": True,
    "suffix": "the end",
}
# Where the text completion's field differs: its `logprobs` is a count of alternatives.
TEXT_SAMPLE = {**SAMPLE, "logprobs": (2, ("", "top_logprobs_num", 2))}
LABEL_SAMPLE: dict[str, Any] = {
    "user": "u-1",
    "metadata": {"k": "v"},
    "store": False,
    "safety_identifier": "s-1",
    "prompt_cache_key": "c-1",
    "prompt_cache_retention": "in_memory",
    "prompt_cache_options": {},
    "stream_options": {"include_usage": True},
}


def _fields(create: Callable[..., Any]) -> list[str]:
    return [name for name in inspect.signature(create).parameters if name not in CLIENT_OPTIONS]


@pytest.mark.parametrize(
    ("path", "create", "base"),
    [
        ("/v1/chat/completions", ChatCompletions.create, CHAT),
        ("/v1/completions", TextCompletions.create, TEXT),
    ],
    ids=["chat", "text"],
)
def test_every_openai_field_is_served_or_refused_by_name(
    front: RunningServer,
    engine: tuple[str, _Recorder],
    path: str,
    create: Callable[..., Any],
    base: dict[str, Any],
) -> None:
    recorder = engine[1]
    key = front.create_user(f"fields-{path.strip('/').replace('/', '-')}")
    unclassified = [
        name
        for name in _fields(create)
        if name not in SAMPLE and name not in REFUSED and name not in LABELS
    ]
    assert not unclassified, (
        f"the openai client sends {unclassified} to {path}, which the server neither serves nor "
        "refuses by name: classify each in server/api/openai_fields.py"
    )
    with front.client(key) as client:
        for name in _fields(create):
            if name in REFUSED:
                reply = client.post(path, json={**base, name: REFUSED_SAMPLE[name]})
                assert reply.status_code == 400, (name, reply.text)
                error = reply.json()["error"]
                assert error["param"] == name and error["message"].startswith(f"{name}: "), error
                continue
            if name in LABELS:
                reply = client.post(path, json={**base, name: LABEL_SAMPLE[name]})
                assert reply.status_code == 200, (name, reply.text)
                continue
            value, shows = (TEXT_SAMPLE if base is TEXT else SAMPLE)[name]
            recorder.sent.clear()
            reply = client.post(path, json={**base, **WITH.get(name, {}), name: value})
            if shows is None:
                assert reply.status_code == 200, (name, reply.text)
                continue
            where, engine_key, expected = shows
            # The emulator computes no logprobs and refuses them; what was sent is the point.
            if name not in ("logprobs", "top_logprobs"):
                assert reply.status_code == 200, (name, reply.text)
            if where == "/tokenize":
                assert recorder.last(where).get(engine_key) == expected, (name, recorder.sent)
                continue
            sent = recorder.last("/generate")
            holder = sent[where] if where else sent
            assert holder.get(engine_key) == expected, (name, sent)


def test_content_parts_of_text_are_joined_as_sglang_joins_them(
    front: RunningServer, engine: tuple[str, _Recorder]
) -> None:
    key = front.create_user("parts")
    parts = [{"type": "text", "text": "name three"}, {"type": "text", "text": "rivers"}]
    with front.client(key) as client:
        reply = client.post("/v1/chat/completions", json={**CHAT, "messages": [
            {"role": "user", "content": parts}
        ]})  # fmt: skip
        assert reply.status_code == 200, reply.text
        rendered = engine[1].last("/tokenize")
        assert rendered["messages"] == [{"role": "user", "content": "name three rivers"}]
        image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
        reply = client.post("/v1/chat/completions", json={**CHAT, "messages": [
            {"role": "user", "content": [parts[0], image]}
        ]})  # fmt: skip
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["param"].startswith("messages.0.content"), error
        assert "only content parts of type 'text'" in error["message"]


def test_the_model_is_the_engines_and_another_is_not_found(front: RunningServer) -> None:
    key = front.create_user("models")
    with front.client(key) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [ENGINE_MODEL]
        for model in (ENGINE_MODEL, "default", None):
            body = {**CHAT, **({"model": model} if model else {})}
            reply = client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            assert reply.json()["model"] == ENGINE_MODEL
        reply = client.post("/v1/completions", json={**TEXT, "model": "gpt-4o"})
        assert reply.status_code == 404
        error = reply.json()["error"]
        assert error["type"] == "model_not_found" and error["param"] == "model"
        assert "'gpt-4o' is not served here" in error["message"]
        assert ENGINE_MODEL in error["message"]
        assert client.get("/model_info").json()["model_path"] == ENGINE_MODEL


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[Any]:
    with migrated_database("sqlite", tmp_path) as db:
        yield db


def test_the_model_name_setting_overrides_the_engines(
    engine: tuple[str, _Recorder], sqlite: Any
) -> None:
    settings = {"engine_url": engine[0], "engine_api_key": ENGINE_KEY, "model_name": "house"}
    with running_server(sqlite, **settings) as server, server.client(server.create_user("o")) as c:
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["house"]
        for model in ("house", ENGINE_MODEL):
            reply = c.post("/v1/chat/completions", json={**CHAT, "model": model})
            assert reply.status_code == 200, reply.text
            assert reply.json()["model"] == "house"


def test_the_embedded_emulator_refuses_a_json_constraint_by_name(sqlite: Any) -> None:
    with running_server(sqlite) as server, server.client(server.create_user("e")) as client:
        for kind in ("json_object", "json_schema"):
            spec = {"json_schema": {"name": "r", "schema": {}}} if kind == "json_schema" else {}
            body = {**CHAT, "response_format": {"type": kind, **spec}}
            reply = client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert error["param"] == "response_format" and "emulator" in error["message"]
        plain = {**CHAT, "response_format": {"type": "text"}}
        text = client.post("/v1/chat/completions", json=plain)
        assert text.status_code == 200
        assert text.json()["model"] == "inference-auction-emulated"
        assert text.json()["service_tier"] is None  # the auction sells no tiers


def test_the_tier_served_is_in_the_answer(sqlite: Any) -> None:
    tiers = {"pricing": "tiers", "tiers": "flex=0,default=0.001,priority=0.01"}
    with running_server(sqlite, **tiers) as server:
        key = server.create_user("tiered", budget=100_000_000)
        with server.client(key) as client:
            for asked, served in (("priority", "priority"), (None, "flex"), ("auto", "flex")):
                body = {**CHAT, **({"service_tier": asked} if asked else {})}
                reply = client.post("/v1/chat/completions", json=body)
                assert reply.status_code == 200, reply.text
                assert reply.json()["service_tier"] == served, reply.json()
            with client.stream(
                "POST", "/v1/completions", json={**TEXT, "stream": True, "service_tier": "default"}
            ) as streamed:
                events = [line[6:] for line in streamed.iter_lines() if line.startswith("data: ")]
            chunks = [json.loads(event) for event in events if event != "[DONE]"]
            assert chunks and all(chunk["service_tier"] == "default" for chunk in chunks)


def test_the_engine_key_reaches_the_engine(front: RunningServer) -> None:
    """The front server was started with the engine's key: without it, nothing would be served
    (the engine answers 401); with it, a request is served and the key is in no answer."""
    key = front.create_user("keyed")
    with front.client(key) as client:
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
        reply = client.post("/generate", json=body)
        assert reply.status_code == 200, reply.text
        assert ENGINE_KEY not in reply.text
    direct = httpx.post(front.settings.engine_url + "/generate", json={"text": "hi"}, timeout=30)
    assert direct.status_code == 401  # the engine does want a key


def test_sglangs_extra_sampling_fields_are_passed_and_checked(
    front: RunningServer, engine: tuple[str, _Recorder]
) -> None:
    key = front.create_user("extras")
    with front.client(key) as client:
        extras = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "min_tokens": 1}
        reply = client.post("/v1/chat/completions", json={**CHAT, **extras})
        assert reply.status_code == 200, reply.text
        sent = engine[1].last("/generate")["sampling_params"]
        assert {k: sent[k] for k in ("top_k", "min_p", "repetition_penalty", "min_new_tokens")} == {
            "top_k": 5,
            "min_p": 0.1,
            "repetition_penalty": 1.1,
            "min_new_tokens": 1,
        }
        for bad, says in [
            ({"top_k": 0}, "top_k must be -1 (disable) or at least 1"),
            ({"min_tokens": 5}, "min_tokens (5) must be at most max_tokens (3)"),
            ({"presence_penalty": 3}, "presence_penalty"),
            ({"logit_bias": {"x": 1}}, "logit_bias keys must be token ids"),
        ]:
            reply = client.post("/v1/chat/completions", json={**CHAT, **bad})
            assert reply.status_code == 400, (bad, reply.text)
            assert says in reply.json()["error"]["message"], (bad, reply.text)
