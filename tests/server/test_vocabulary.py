"""Token ids outside the model's vocabulary are refused at admission, naming the field.

One such id kills the real SGLang's scheduler (an IndexError in its embedding), and every
request it holds with it. The server learns the vocabulary size from the engine
(`server.engine.vocabulary`) and refuses such ids with a 400 before any hold; the emulator
states its size in `/model_info` and refuses such ids itself. Real server on a real port, in
front of the emulator on another.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inference_auctions.server.emulator.live import LiveSimulator
from inference_auctions.server.emulator.sglang_app import create_sglang_app
from inference_auctions.server.emulator.simulator import EngineSimulator
from inference_auctions.server.engine.builtin_tokenizer import VOCABULARY_SIZE
from inference_auctions.server.engine.local_tokenizer import BuiltinTokenizer, HuggingFaceTokenizer
from inference_auctions.server.engine.vocabulary import learn_vocab_size
from tests.billing.helpers import get_hold
from tests.db_fixtures import MigratedDatabase
from tests.engine.conftest import PathCounter, serve, word_level_tokenizer
from tests.server.harness import running_server

GRANT = 10_000_000


@pytest.fixture(scope="module")
def emulator() -> Iterator[tuple[str, PathCounter]]:
    """The SGLang emulator on a free loopback port, counting the requests per path."""
    counts = PathCounter(create_sglang_app(LiveSimulator(EngineSimulator(), time_scale=0.002)))
    with serve(counts) as url:
        yield url, counts


def test_ids_outside_the_vocabulary_are_refused_before_any_hold(
    ledger_db: MigratedDatabase, emulator: tuple[str, PathCounter]
) -> None:
    url, counts = emulator
    with running_server(ledger_db, engine_url=url) as server:
        key = server.create_user("mallory", budget=GRANT)
        generated = counts.paths["/generate"]
        with server.client(key) as client:
            native = client.post(
                "/generate",
                json={"input_ids": [1, 2, VOCABULARY_SIZE, 3], "bid": "0.5", "rid": "poison"},
            )
            openai = client.post(
                "/v1/completions",
                json={"prompt": [7, VOCABULARY_SIZE + 9], "bid": "0.5", "rid": "poison-2"},
            )
            # The last id of the vocabulary is a token like any other.
            edge = client.post(
                "/generate",
                json={
                    "input_ids": [1, VOCABULARY_SIZE - 1],
                    "bid": "0.5",
                    "sampling_params": {"max_new_tokens": 2},
                },
            )
        assert native.status_code == 400, native.text
        error = native.json()["error"]
        assert error["param"] == "input_ids"
        assert f"token id {VOCABULARY_SIZE:,} is outside the model's vocabulary" in error["message"]
        assert openai.status_code == 400, openai.text
        assert openai.json()["error"]["param"] == "prompt"
        assert edge.status_code == 200, edge.text
        # Refused before any money moved, and never sent: only the valid request was.
        assert get_hold(server.ledger, "mallory/poison") is None
        assert get_hold(server.ledger, "mallory/poison-2") is None
        assert counts.paths["/generate"] == generated + 1
        balance = server.ledger.balance("mallory")
        assert balance.held_micros == 0
        assert server.ledger.reconcile().ok


def test_a_vocabulary_size_in_the_settings_wins_and_the_engine_is_not_asked(
    ledger_db: MigratedDatabase, emulator: tuple[str, PathCounter]
) -> None:
    url, counts = emulator
    asked = counts.paths["/model_info"]
    # `--tokenizer engine`: `auto` reads /model_info once at start for the tokenizer's path.
    settings = {"engine_url": url, "engine_vocab_size": 100, "tokenizer": "engine"}
    with running_server(ledger_db, **settings) as server:
        key = server.create_user("mallory", budget=GRANT)
        with server.client(key) as client:
            reply = client.post("/generate", json={"input_ids": [99, 100], "bid": "0.1"})
        assert reply.status_code == 400, reply.text
        assert "(ids 0 to 99)" in reply.json()["error"]["message"]
    assert counts.paths["/model_info"] == asked


def test_the_embedded_engine_refuses_them_too(ledger_db: MigratedDatabase) -> None:
    with running_server(ledger_db) as server:
        key = server.create_user("mallory", budget=GRANT)
        with server.client(key) as client:
            reply = client.post(
                "/generate", json={"input_ids": [2**30], "bid": "0.1", "rid": "poison"}
            )
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "input_ids"
        assert get_hold(server.ledger, "mallory/poison") is None


def test_the_emulator_states_its_vocabulary_and_refuses_ids_outside_it(
    emulator: tuple[str, PathCounter],
) -> None:
    url, _ = emulator
    info = httpx.get(url + "/model_info", timeout=10).json()
    assert info["vocab_size"] == VOCABULARY_SIZE
    body = {"input_ids": [5, VOCABULARY_SIZE], "sampling_params": {"max_new_tokens": 2}}
    plain = httpx.post(url + "/generate", json=body, timeout=10)
    assert plain.status_code == 400
    assert "out-of-vocabulary token id" in plain.json()["error"]["message"]
    streamed = httpx.post(url + "/generate", json={**body, "stream": True}, timeout=10)
    assert "out-of-vocabulary token id" in streamed.text  # SGLang's error inside the stream
    # Still serving.
    fine = httpx.post(url + "/generate", json={**body, "input_ids": [5, 6]}, timeout=10)
    assert fine.status_code == 200, fine.text


def test_the_size_is_learnt_from_what_the_engine_states_then_its_model_folder_then_the_tokenizer(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 32_000}))
    tokenizer = HuggingFaceTokenizer(word_level_tokenizer(tmp_path / "tok", bos=False))
    assert learn_vocab_size({"vocab_size": 77, "model_path": str(folder)}, tokenizer) == 77
    assert learn_vocab_size({"model_path": str(folder)}, tokenizer) == 32_000
    # A multimodal model's text vocabulary.
    (folder / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 151_936}}))
    assert learn_vocab_size({"model_path": str(folder)}, None) == 151_936
    # Another host's path or a hub name: the local tokenizer, else nothing.
    elsewhere = {"model_path": "org/some-model"}
    assert learn_vocab_size(elsewhere, tokenizer) == tokenizer.vocabulary_size() > 0
    assert learn_vocab_size(elsewhere, BuiltinTokenizer()) == VOCABULARY_SIZE
    assert learn_vocab_size(elsewhere, None) is None
    assert learn_vocab_size(None, None) is None
