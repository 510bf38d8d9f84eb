"""The default tokenizer is lossless in its pieces, stable, and keeps shared prefixes shared."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from inference_auctions.server.engine.builtin_tokenizer import VOCABULARY_SIZE, encode, pieces


@given(st.text())
def test_pieces_join_back_to_the_text(text: str) -> None:
    assert "".join(pieces(text)) == text
    assert all(0 < token < VOCABULARY_SIZE for token in encode(text))


def test_ids_are_stable_across_runs() -> None:
    # Pinned values: a change here silently splits every cache and every stored batch.
    assert encode("Hello world") == [encode("Hello")[0], encode(" world")[0]]
    assert encode("Hello") == [4157704578 % (VOCABULARY_SIZE - 1) + 1]


def test_a_shared_text_prefix_gives_a_shared_token_prefix() -> None:
    article = "Article: The quick brown fox jumps over the lazy dog. "
    first, second = encode(article + "Question: why?"), encode(article + "Question: how?")
    shared = len(encode(article + "Question:"))
    assert first[:shared] == second[:shared]
    assert first[shared:] != second[shared:]
