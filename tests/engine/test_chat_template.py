"""`--tokenizer auto`: the engine's own tokenizer and chat template, learnt from its
`/model_info` and rendered here once they agree with the engine; else its `/tokenize`.

The engine is a small server on a real port that answers SGLang's `/model_info` and `/tokenize`
(text and chat messages) from a real tokenizer.json and chat template in a model folder made
here, rendering chats with Jinja as transformers does for SGLang.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jinja2
import pytest
from fastapi import FastAPI, Request
from tokenizers import Tokenizer

from bench.sglang_cpu.make_model import CHAT_TEMPLATE
from inference_auctions.server.engine.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    load_chat_template,
)
from tests.engine.conftest import PathCounter, serve, started_engine, word_level_tokenizer

pytestmark = pytest.mark.anyio

CHAT = [("system", "You are brief."), ("user", "the quick brown fox")]


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """A model folder: a tokenizer.json adding `<s>`, and a ChatML template in its config."""
    folder = tmp_path / "model"
    word_level_tokenizer(folder, bos=True)
    config = {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@contextmanager
def _engine(
    folder: Path, template: str = CHAT_TEMPLATE, tokenizer_path: str | None = None
) -> Iterator[tuple[str, PathCounter]]:
    """SGLang's `/model_info` and `/tokenize` for the model in `folder`; chats rendered with
    `template` by plain Jinja, as transformers renders them, and encoded without special
    tokens, as `apply_chat_template` does."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    compiled = environment.from_string(template)
    app = FastAPI()

    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        path = str(folder) if tokenizer_path is None else tokenizer_path
        return {"model_path": "org/tiny", "tokenizer_path": path, "is_generation": True}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await request.json()
        if "messages" in body:
            text = compiled.render(messages=body["messages"], add_generation_prompt=True)
            ids = tokenizer.encode(text, add_special_tokens=False).ids
        else:
            ids = tokenizer.encode(
                body["prompt"], add_special_tokens=body["add_special_tokens"]
            ).ids
        return {"tokens": ids, "count": len(ids), "max_model_len": 4096}

    counted = PathCounter(app)
    with serve(counted) as url:
        yield url, counted


async def _engine_chat_ids(url: str, chat: list[tuple[str, str]]) -> list[int]:
    async with started_engine(url) as asking:  # `engine` tokenizing: the engine renders
        return (await asking.tokenize_chat(chat)).tolist()  # type: ignore[no-any-return]


async def _engine_text_ids(url: str, text: str) -> list[int]:
    async with started_engine(url) as asking:
        return await asking.tokenize(text)


async def test_auto_renders_chats_here_once_they_agree_with_the_engine(
    model_folder: Path,
) -> None:
    with _engine(model_folder) as (url, counts):
        expected = await _engine_chat_ids(url, CHAT)
        text_expected = await _engine_text_ids(url, "the lazy dog")
        async with started_engine(url, learn_tokenizer=True) as engine:
            asked = counts.paths["/tokenize"]
            assert (await engine.tokenize_chat(CHAT)).tolist() == expected
            assert await engine.tokenize("the lazy dog") == text_expected
            longer = [*CHAT, ("assistant", "hello world"), ("user", "numbers 12345")]
            await engine.tokenize_chat(longer)
            assert counts.paths["/tokenize"] == asked  # nothing more asked of the engine
            assert (
                engine.tokenizer is not None and str(model_folder) in engine.tokenizer.description
            )


async def test_a_template_that_renders_otherwise_leaves_chats_to_the_engine(
    model_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The engine's template says "assistant:" where the folder's says "<|im_start|>assistant".
    other = CHAT_TEMPLATE.replace("'<|im_start|>assistant\\n'", "'assistant:'")
    assert other != CHAT_TEMPLATE
    with _engine(model_folder, template=other) as (url, counts):
        expected = await _engine_chat_ids(url, CHAT)
        async with started_engine(url, learn_tokenizer=True) as engine:
            asked = counts.paths["/tokenize"]
            assert (await engine.tokenize_chat(CHAT)).tolist() == expected
            assert counts.paths["/tokenize"] == asked + 1  # the engine rendered it
    assert "chats are rendered by the engine" in caplog.text


async def test_a_tokenizer_path_not_readable_here_falls_back_to_the_engine_logged_once(
    model_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with _engine(model_folder, tokenizer_path="/nonexistent/model") as (url, counts):
        async with started_engine(url, learn_tokenizer=True) as engine:
            assert engine.tokenizer is None
            before = counts.paths["/tokenize"]
            await engine.tokenize("the quick brown fox")
            await engine.tokenize("the lazy dog")
            assert counts.paths["/tokenize"] == before + 2
    fallbacks = [r for r in caplog.records if "tokenizing prompts with the engine's" in r.message]
    assert len(fallbacks) == 1
    assert "'/nonexistent/model' is not readable here" in fallbacks[0].getMessage()


def test_a_template_is_read_as_transformers_reads_it(tmp_path: Path) -> None:
    named = [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"},
    ]
    config = {"bos_token": {"content": "<s>", "lstrip": False}, "chat_template": named}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = load_chat_template(tmp_path)
    assert template is not None and template.render([("user", "hi")]) == "<s>hi"
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert load_chat_template(tmp_path) is None  # no template: the engine renders chats
    (tmp_path / "chat_template.jinja").write_text("{{ messages | length }}")
    assert load_chat_template(tmp_path).render([("user", "a"), ("user", "b")]) == "2"  # type: ignore[union-attr]
    refusing = ChatTemplate("{{ raise_exception('roles must alternate') }}", {})
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        refusing.render([("user", "hi")])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}", {})
