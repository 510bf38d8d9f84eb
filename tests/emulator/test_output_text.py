"""Emulated completions are deterministic and tokenize back to their own ids."""

from __future__ import annotations

from inference_auctions.server.emulator.output_text import completion
from inference_auctions.server.engine.builtin_tokenizer import encode


def test_the_same_prompt_gets_the_same_completion() -> None:
    assert completion([1, 2, 3], 20) == completion([1, 2, 3], 20)
    assert completion([1, 2, 3], 20) != completion([1, 2, 4], 20)
    assert completion([1, 2, 3], 20, sampling_seed=1) != completion([1, 2, 3], 20)


def test_a_shorter_completion_is_a_prefix_of_a_longer_one() -> None:
    short, long = completion([9, 9], 5), completion([9, 9], 50)
    assert long.token_ids[:5] == short.token_ids
    assert long.text(5) == short.text()


def test_the_text_tokenizes_to_the_output_ids() -> None:
    result = completion(list(range(100)), 64)
    assert len(result.token_ids) == 64
    assert encode(result.text()) == list(result.token_ids)
    assert completion([1], 0).text() == ""
