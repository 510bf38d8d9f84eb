"""The auction server with `--tokenizer builtin` in front of the SGLang emulator: the same token
ids reach the engine as when the engine tokenizes, with no `/tokenize` per prompt."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from inference_auctions.server.emulator.live import LiveSimulator
from inference_auctions.server.emulator.sglang_app import create_sglang_app
from inference_auctions.server.emulator.simulator import EngineSimulator
from inference_auctions.server.engine.local_tokenizer import PROBE_TEXTS
from tests.db_fixtures import MigratedDatabase
from tests.engine.conftest import PathCounter, serve, word_level_tokenizer
from tests.processes import emulated_sglang, free_port
from tests.server.harness import running_server

_PROMPTS = [f"Question {i}: what is the capital of country {i * 7}?" for i in range(12)]


class _GenerateBodies:
    """ASGI middleware that keeps the `input_ids` of every `/generate` body it passes on."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.input_ids: list[list[int]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/generate":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def reading() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    self.input_ids.append(json.loads(b"".join(chunks))["input_ids"])
            return message

        await self.app(scope, reading, send)


@contextmanager
def _emulator() -> Iterator[tuple[str, PathCounter, _GenerateBodies]]:
    live = LiveSimulator(EngineSimulator(), time_scale=0.002)
    bodies = _GenerateBodies(create_sglang_app(live))
    counts = PathCounter(bodies)
    with serve(counts) as url:
        yield url, counts, bodies


async def _sent_ids(db: MigratedDatabase, tokenizer: str) -> tuple[list[list[int]], int]:
    """The ids the emulator received for `_PROMPTS`, and how many `/tokenize` it answered."""
    with (
        _emulator() as (url, counts, bodies),
        running_server(db, engine_url=url, tokenizer=tokenizer) as server,
    ):
        key = server.create_user(f"user-{tokenizer}", budget=100_000_000)

        async def send() -> None:
            async with server.async_client(key) as client:
                replies = await asyncio.gather(
                    *(
                        client.post(
                            "/generate",
                            json={
                                "text": text,
                                "bid": "0.01",
                                "sampling_params": {"max_new_tokens": 2},
                            },
                        )
                        for text in _PROMPTS
                    )
                )
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies]

        await send()
        return bodies.input_ids, counts.paths["/tokenize"]


@pytest.mark.anyio
async def test_builtin_sends_the_engines_own_ids_without_asking_its_tokenize(
    ledger_db: MigratedDatabase,
) -> None:
    by_engine, engine_asked = await _sent_ids(ledger_db, "engine")
    by_builtin, builtin_asked = await _sent_ids(ledger_db, "builtin")
    assert sorted(by_builtin) == sorted(by_engine) and len(by_engine) == len(_PROMPTS)
    assert engine_asked >= len(_PROMPTS)  # one round trip per new prompt
    assert builtin_asked == len(PROBE_TEXTS)  # only the check, at start


def test_serve_refuses_a_tokenizer_it_cannot_load_before_the_banner(tmp_path: Path) -> None:
    missing = tmp_path / "no-model"
    command = [sys.executable, "-m", "inference_auctions.server.cli", "serve"]
    command += ["--port", str(free_port()), "--engine-url", "http://127.0.0.1:9"]
    command += ["--tokenizer", str(missing), "--database-url", f"sqlite:///{tmp_path / 'l.db'}"]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "First steps" not in result.stdout
    assert f"--tokenizer {str(missing)!r}: no such file" in result.stderr
    assert "'builtin'" in result.stderr and "Traceback" not in result.stderr


def test_serve_refuses_to_start_with_a_tokenizer_the_engine_disagrees_with(tmp_path: Path) -> None:
    model = word_level_tokenizer(tmp_path / "model", bos=True)  # not the emulator's tokenizer
    with emulated_sglang(time_scale=0.01) as url:
        command = [sys.executable, "-m", "inference_auctions.server.cli", "serve"]
        command += ["--port", str(free_port()), "--engine-url", url, "--tokenizer", str(model)]
        command += ["--database-url", f"sqlite:///{tmp_path / 'l.db'}", "--log-level", "warning"]
        result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"the local tokenizer ({model}) disagrees with the engine at {url}" in result.stderr
    assert "Set --tokenizer (INFERENCE_AUCTION_TOKENIZER)" in result.stderr
