"""What the selector counts as held in the engine's cache: the prefixes of the prompts it sent
lately, in whole blocks, up to the engine's KV tokens."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from inference_auctions.server.serving.resident_prefixes import (
    BLOCK_TOKENS,
    DEFAULT_CAPACITY_TOKENS,
    ResidentPrefixes,
)


def _tokens(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _block(seed: int) -> np.ndarray:
    return np.arange(BLOCK_TOKENS, dtype=np.int64) + seed * BLOCK_TOKENS


def test_a_sent_prompt_s_whole_blocks_are_resident_and_no_more() -> None:
    resident = ResidentPrefixes()
    sent = np.concatenate((_block(1), _block(2), _tokens(7, 8, 9)))
    assert resident.resident_length(sent) == 0
    resident.record(sent)
    assert resident.resident_length(sent) == 2 * BLOCK_TOKENS  # the partial block is not
    # The same first block, then another: only the first counts.
    assert resident.resident_length(np.concatenate((_block(1), _block(3)))) == BLOCK_TOKENS
    # A block seen before, but after another first block: a different prefix.
    assert resident.resident_length(np.concatenate((_block(3), _block(2)))) == 0
    one_token_changed = sent.copy()
    one_token_changed[BLOCK_TOKENS + 5] += 1
    assert resident.resident_length(one_token_changed) == BLOCK_TOKENS


def test_the_least_recently_sent_blocks_go_first_beyond_the_engine_s_tokens() -> None:
    resident = ResidentPrefixes(lambda: 2 * BLOCK_TOKENS)  # room for two blocks
    first, second = _block(1), _block(2)
    resident.record(first)
    resident.record(second)
    resident.record(first)  # used again: now the newer of the two
    resident.record(_block(3))  # evicts `second`
    assert len(resident) == 2
    assert resident.resident_length(first) == BLOCK_TOKENS
    assert resident.resident_length(second) == 0
    assert resident.resident_length(_block(3)) == BLOCK_TOKENS


def test_an_unknown_capacity_keeps_the_stated_default() -> None:
    resident = ResidentPrefixes()
    blocks = DEFAULT_CAPACITY_TOKENS // BLOCK_TOKENS
    resident.record(np.arange((blocks + 10) * BLOCK_TOKENS, dtype=np.int64))
    assert len(resident) == blocks


@given(
    prompts=st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=6), max_size=6),
    query=st.lists(st.integers(0, 2), min_size=0, max_size=6),
)
def test_resident_length_is_the_longest_shared_whole_block_prefix(
    prompts: list[list[int]], query: list[int]
) -> None:
    # Prompts made of three kinds of block, so that prefixes are often shared; capacity for
    # all of them, so nothing is evicted. The oracle: the longest common prefix with any
    # prompt sent, in tokens, rounded down to whole blocks.
    def expand(blocks: list[int]) -> np.ndarray:
        if not blocks:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([_block(kind) for kind in blocks])

    resident = ResidentPrefixes(lambda: 1_000 * BLOCK_TOKENS)
    for prompt in prompts:
        resident.record(expand(prompt))
    wanted = expand(query)
    longest = 0
    for prompt in prompts:
        sent = expand(prompt)
        shared = 0
        while shared < min(len(sent), len(wanted)) and sent[shared] == wanted[shared]:
            shared += 1
        longest = max(longest, shared // BLOCK_TOKENS * BLOCK_TOKENS)
    assert resident.resident_length(wanted) == longest
