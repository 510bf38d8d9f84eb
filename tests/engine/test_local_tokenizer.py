"""Tokenizing prompts in process (`--tokenizer`), checked against a real `/tokenize` first.

The engines behind it are real servers on real ports: the SGLang emulator (whose tokenizer is
the builtin one), and a small server that answers SGLang's `/tokenize` with a Hugging Face
`tokenizer.json` as SGLang does (`tokenizer.encode(prompt, add_special_tokens=...)`). The
tokenizer files are trained here with the `tokenizers` library itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI, Request
from tokenizers import Tokenizer

from inference_auctions.server.emulator.live import LiveSimulator
from inference_auctions.server.emulator.sglang_app import create_sglang_app
from inference_auctions.server.emulator.simulator import EngineSimulator
from inference_auctions.server.engine.builtin_tokenizer import encode
from inference_auctions.server.engine.errors import EngineUnavailable, TokenizerMismatch
from inference_auctions.server.engine.local_tokenizer import (
    INLINE_TOKENIZE_CHARS,
    PROBE_TEXTS,
    BuiltinTokenizer,
    HuggingFaceTokenizer,
    TokenizerSetupError,
    load_tokenizer,
)
from inference_auctions.server.engine.sglang_http import SGLangHTTPEngine
from tests.engine.conftest import (
    PathCounter,
    emulator,
    serve,
    started_engine,
    word_level_tokenizer,
)

_PROMPTS = [f"Question {i}: what is the capital of country {i * 7}?" for i in range(20)]


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """A model folder whose tokenizer.json adds a BOS token."""
    word_level_tokenizer(tmp_path / "model", bos=True)
    return tmp_path / "model"


@contextmanager
def _huggingface_sglang(file: Path) -> Iterator[tuple[str, PathCounter]]:
    """A server answering SGLang's `/tokenize` with `file`, as SGLang's tokenizer manager does."""
    tokenizer = Tokenizer.from_file(str(file))
    app = FastAPI()

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await request.json()
        ids = tokenizer.encode(body["prompt"], add_special_tokens=body["add_special_tokens"]).ids
        return {"tokens": ids, "count": len(ids), "max_model_len": 4096}

    counted = PathCounter(app)
    with serve(counted) as url:
        yield url, counted


def test_a_tokenizer_json_encodes_as_the_tokenizers_library_does(model_folder: Path) -> None:
    direct = Tokenizer.from_file(str(model_folder / "tokenizer.json"))
    for path in (model_folder, model_folder / "tokenizer.json"):  # the folder or the file
        local = load_tokenizer(str(path))
        assert isinstance(local, HuggingFaceTokenizer)
        for text in ("hello world", "the lazy fox , unknown words"):
            with_bos = local.encode(text, add_special_tokens=True)
            assert with_bos == direct.encode(text).ids
            assert with_bos[0] == direct.token_to_id("<s>")
            assert local.encode(text, add_special_tokens=False) == with_bos[1:]
    assert load_tokenizer("engine") is None
    assert isinstance(load_tokenizer("builtin"), BuiltinTokenizer)


def test_a_tokenizer_setting_that_names_nothing_loadable_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenizerSetupError, match="no such file"):
        load_tokenizer(str(tmp_path / "missing" / "tokenizer.json"))
    with pytest.raises(TokenizerSetupError, match="no such file"):
        load_tokenizer(str(tmp_path))  # a folder without a tokenizer.json
    (tmp_path / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(TokenizerSetupError, match=r"not a tokenizer\.json"):
        load_tokenizer(str(tmp_path / "tokenizer.json"))


@pytest.mark.anyio
async def test_builtin_is_exactly_the_emulators_tokenize_with_and_without_special_tokens() -> None:
    texts = [*PROBE_TEXTS, *_PROMPTS, "", "x" * 50]

    async def run(url: str) -> None:
        for special in (True, False):
            async with started_engine(url, add_special_tokens=special) as asking:
                builtin = BuiltinTokenizer()
                for text in texts:
                    expected = await asking.tokenize(text)
                    assert builtin.encode(text, add_special_tokens=special) == expected
                    assert expected == encode(text)

    with emulator() as (url, _):
        await run(url)


@pytest.mark.anyio
async def test_builtin_in_front_of_the_emulator_sends_no_tokenize_after_the_check() -> None:
    async def run(url: str, counts: PathCounter) -> None:
        async with started_engine(url) as asking:
            expected = [await asking.tokenize_array(text) for text in _PROMPTS]
            context = await asking.context_length()
        asked = counts.paths["/tokenize"]
        async with started_engine(url, tokenizer=BuiltinTokenizer()) as local:
            assert counts.paths["/tokenize"] == asked + len(PROBE_TEXTS)  # checked at start
            got = [await local.tokenize_array(text) for text in _PROMPTS]
            assert await local.context_length() == context  # from the check's answers
        assert counts.paths["/tokenize"] == asked + len(PROBE_TEXTS)  # and never again
        for mine, theirs in zip(got, expected, strict=True):
            assert mine.dtype == np.int32 and not mine.flags.writeable
            assert np.array_equal(mine, theirs)

    with emulator() as (url, counts):
        await run(url, counts)


@pytest.mark.anyio
async def test_a_tokenizer_json_agrees_with_a_server_tokenizing_with_the_same_file(
    model_folder: Path,
) -> None:
    async def run(url: str, counts: PathCounter) -> None:
        async with started_engine(url) as asking:
            expected = [await asking.tokenize(text) for text in _PROMPTS]
        asked = counts.paths["/tokenize"]
        local = HuggingFaceTokenizer(model_folder)
        async with started_engine(url, tokenizer=local) as engine:
            got = [await engine.tokenize(text) for text in _PROMPTS]
        assert got == expected and all(ids[0] == expected[0][0] for ids in got)  # the BOS
        assert counts.paths["/tokenize"] == asked + len(PROBE_TEXTS)

    with _huggingface_sglang(model_folder / "tokenizer.json") as (url, counts):
        await run(url, counts)


@pytest.mark.anyio
async def test_a_disagreeing_tokenizer_fails_the_start_and_says_what_to_change(
    model_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The engine's tokenizer adds no BOS; the local copy does: every prompt would be off by one.
    engine_file = word_level_tokenizer(tmp_path / "engine-model", bos=False)

    async def run(url: str) -> str:
        engine = SGLangHTTPEngine(url, tokenizer=HuggingFaceTokenizer(model_folder))
        with pytest.raises(TokenizerMismatch) as refused:
            await engine.start()
        with pytest.raises(TokenizerMismatch):  # and so does every prompt after it
            await engine.tokenize("hello world")
        return str(refused.value)

    with caplog.at_level(logging.ERROR), _huggingface_sglang(engine_file) as (url, _):
        message = await run(url)
    assert f"disagrees with the engine at {url}" in message
    assert "on 'a'" in message and "the local tokenizer gives [" in message
    assert "--tokenizer" in message and "INFERENCE_AUCTION_TOKENIZER" in message
    assert "'engine'" in message
    assert message in caplog.text


class _Starting:
    """ASGI middleware: 503 for everything, as an engine that is still starting, until `ready`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.ready = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self.ready:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b'{"message": "starting"}'})
            return
        await self.app(scope, receive, send)


@pytest.mark.anyio
async def test_an_engine_not_ready_at_start_is_checked_before_the_first_prompt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def run(url: str, gate: _Starting, counts: PathCounter) -> None:
        async with started_engine(url, tokenizer=BuiltinTokenizer()) as engine:  # starts anyway
            with pytest.raises(EngineUnavailable, match="503"):
                await engine.tokenize("hello")  # the check could not run: the prompt fails
            gate.ready = True
            # Many prompts at once: one check, then every prompt tokenized here.
            got = await asyncio.gather(*(engine.tokenize(text) for text in _PROMPTS))
            assert got == [encode(text) for text in _PROMPTS]
            assert counts.paths["/tokenize"] == len(PROBE_TEXTS)

    counts = PathCounter(create_sglang_app(LiveSimulator(EngineSimulator(), time_scale=0.01)))
    gate = _Starting(counts)
    with caplog.at_level(logging.WARNING), serve(gate) as url:
        await run(url, gate, counts)
    assert "compared with it before the first prompt is tokenized" in caplog.text


class _ThreadRecordingTokenizer(BuiltinTokenizer):
    """The builtin tokenizer, noting the thread of every call."""

    def __init__(self) -> None:
        self.threads: list[tuple[int, int]] = []  # (text length, thread id)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        self.threads.append((len(text), threading.get_ident()))
        return super().encode(text, add_special_tokens=add_special_tokens)


@pytest.mark.anyio
async def test_a_long_prompt_is_tokenized_off_the_event_loop_once_for_concurrent_callers() -> None:
    short = "a short prompt"
    long = "word " * (INLINE_TOKENIZE_CHARS // 5 + 1)
    assert len(long) > INLINE_TOKENIZE_CHARS

    async def run(url: str) -> None:
        tokenizer = _ThreadRecordingTokenizer()
        async with started_engine(url, tokenizer=tokenizer) as engine:
            loop_thread = threading.get_ident()
            tokenizer.threads.clear()  # the probes of the check
            assert await engine.tokenize(short) == encode(short)
            arrays = await asyncio.gather(*(engine.tokenize_array(long) for _ in range(5)))
            assert all(array is arrays[0] for array in arrays)  # one result, shared
            assert arrays[0].tolist() == encode(long)
        assert tokenizer.threads[0] == (len(short), loop_thread)
        assert len(tokenizer.threads) == 2  # the long text once, for all five callers
        length, thread = tokenizer.threads[1]
        assert length == len(long) and thread != loop_thread

    with emulator() as (url, _):
        await run(url)
