"""Chats with tools at an SGLang engine: rendered here with the model's template once it
renders a chat with tools as the engine does, else by the engine's `/tokenize`; a chat that
neither will render is the client's `ChatRefused`.

The engine is a small server on a real port answering SGLang's `/model_info` and `/tokenize`
from a real tokenizer.json, rendering chats (with `tools`, shaped as SGLang hands them to a
template) with Jinja as transformers does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jinja2
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from tokenizers import Tokenizer

from bench.sglang_cpu.make_model import CHAT_TEMPLATE
from bench.sglang_cpu.tool_model import TOOL_TEMPLATE
from inference_auctions.server.engine.chat_template import sglang_template_tools
from inference_auctions.server.engine.errors import ChatRefused
from inference_auctions.server.engine.local_tokenizer import TOOL_CHAT_PROBE
from tests.engine.conftest import PathCounter, serve, started_engine, word_level_tokenizer

pytestmark = pytest.mark.anyio

MESSAGES, TOOLS = TOOL_CHAT_PROBE
# The same chat, asked again: a new user turn after the tool's result.
LATER = [*MESSAGES, {"role": "user", "content": "the quick brown fox"}]


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """A model folder: a tokenizer.json and the tool-rendering template in its config."""
    folder = tmp_path / "model"
    word_level_tokenizer(folder, bos=True)
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": TOOL_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@contextmanager
def _engine(
    folder: Path, template: str = TOOL_TEMPLATE, refuse: str | None = None
) -> Iterator[tuple[str, PathCounter]]:
    """SGLang's `/model_info` and `/tokenize` for the model in `folder`; `refuse`: a 400 with
    that message for every chat (`messages`) that has tools."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = lambda value, **_: json.dumps(value, ensure_ascii=False)
    compiled = environment.from_string(template)
    app = FastAPI()

    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": "org/tiny", "tokenizer_path": str(folder), "is_generation": True}

    @app.post("/tokenize", response_model=None)
    async def tokenize(request: Request) -> dict[str, Any] | JSONResponse:
        body = await request.json()
        if "messages" in body:
            if refuse is not None and body.get("tools"):
                return JSONResponse({"error": refuse}, status_code=400)
            tools = sglang_template_tools(body.get("tools"))
            text = compiled.render(
                messages=body["messages"], tools=tools, add_generation_prompt=True
            )
            ids = tokenizer.encode(text, add_special_tokens=False).ids
        else:
            ids = tokenizer.encode(
                body["prompt"], add_special_tokens=body["add_special_tokens"]
            ).ids
        return {"tokens": ids, "count": len(ids), "max_model_len": 4096}

    counted = PathCounter(app)
    with serve(counted) as url:
        yield url, counted


async def test_a_template_that_renders_tools_as_the_engine_does_renders_tool_chats_here(
    model_folder: Path,
) -> None:
    with _engine(model_folder) as (url, counts):
        async with started_engine(url) as asking:  # `engine` tokenizing: the engine renders
            expected = (await asking.tokenize_tool_chat(LATER, TOOLS)).tolist()
            without = (await asking.tokenize_tool_chat(LATER, None)).tolist()
        assert len(expected) > len(without) + 10  # the tools are in the prompt
        async with started_engine(url, learn_tokenizer=True) as engine:
            asked = counts.paths["/tokenize"]
            assert (await engine.tokenize_tool_chat(LATER, TOOLS)).tolist() == expected
            assert (await engine.tokenize_tool_chat(LATER, None)).tolist() == without
            assert counts.paths["/tokenize"] == asked  # nothing more asked of the engine


async def test_a_template_the_engine_renders_otherwise_leaves_tool_chats_to_the_engine(
    model_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The engine's template shows the model no tools; the folder's does.
    blind = TOOL_TEMPLATE.replace("{%- if tools %}", "{%- if false %}", 1)
    assert blind != TOOL_TEMPLATE
    with _engine(model_folder, template=blind) as (url, counts):
        async with started_engine(url, learn_tokenizer=True) as engine:
            asked = counts.paths["/tokenize"]
            await engine.tokenize_tool_chat(LATER, TOOLS)
            assert counts.paths["/tokenize"] == asked + 1  # the engine rendered it
            await engine.tokenize_chat([("user", "the quick brown fox")])
            assert counts.paths["/tokenize"] == asked + 1  # plain chats: still rendered here
    assert "on a chat with tools: those are rendered by the engine" in caplog.text


async def test_a_tool_chat_the_engine_refuses_is_refused_in_its_words(model_folder: Path) -> None:
    with _engine(model_folder, refuse="Tool 0 function has invalid 'parameters'") as (url, _):
        async with started_engine(url, learn_tokenizer=True) as engine:
            with pytest.raises(ChatRefused, match="invalid 'parameters'") as refused:
                await engine.tokenize_tool_chat(LATER, TOOLS)
            assert refused.value.http_status == 400
            # The refusal is this chat's, not the engine's: chats without tools still render.
            assert len(await engine.tokenize_chat([("user", "the quick brown fox")])) > 0


async def test_an_engine_that_renders_no_chats_cannot_be_shown_tools(model_folder: Path) -> None:
    app = FastAPI()

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        body = await request.json()
        if "messages" in body:  # an SGLang older than 0.5.23
            return JSONResponse({"error": "unknown field messages"}, status_code=400)
        return JSONResponse({"tokens": [5, 6], "count": 2, "max_model_len": 4096})

    with serve(app) as url:
        async with started_engine(url) as engine:
            await engine.tokenize_chat([("user", "hello")])  # a plain transcript from now on
            with pytest.raises(ChatRefused, match="cannot show the model tools"):
                await engine.tokenize_tool_chat(LATER, TOOLS)


async def test_a_chat_the_template_cannot_render_is_refused_without_asking_the_engine(
    tmp_path: Path,
) -> None:
    # The plain ChatML template knows no tools: it renders the probe as the engine does, but
    # not an assistant turn whose content is null.
    folder = tmp_path / "model"
    word_level_tokenizer(folder, bos=True)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    null_content = [*MESSAGES[:2], {**MESSAGES[2], "content": None}, MESSAGES[3]]
    with _engine(folder, template=CHAT_TEMPLATE) as (url, counts):
        async with started_engine(url, learn_tokenizer=True) as engine:
            asked = counts.paths["/tokenize"]
            assert len(await engine.tokenize_tool_chat(LATER, TOOLS)) > 0
            with pytest.raises(ChatRefused, match="the chat template failed"):
                await engine.tokenize_tool_chat(null_content, TOOLS)
            assert counts.paths["/tokenize"] == asked
