"""Which prompt prefixes the engine most likely still holds in its KV cache.

The auction keeps a shared prefix's requests together in its order so that the engine computes
the prefix once (docs/SPEC.md section 7). A prefix the engine already holds costs no prefill,
so keeping its requests together buys nothing; and in a rolling pool it costs a valuable
request under a large prefix of low bids its turn for as long as subtrees of a higher average
keep arriving. The selector therefore files a request whose prompt starts with a resident
prefix under a key of its own (`PoolSelector`), and this records what is resident.

The engine does not say what its radix cache holds, so this is an estimate from what the
server sent it: the prompts of the last requests dispatched, newest kept, up to the engine's
KV tokens (its stated `max_total_num_tokens`, `engine_tokens` when set, else
`DEFAULT_CAPACITY_TOKENS`). Prompts are cut into blocks of `BLOCK_TOKENS`; each block is
known by a hash chained over the blocks before it, so a lookup is one dictionary probe per
block and a prefix counts only up to the last whole block it shares.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from inference_auctions.server.auction.batch import TokenArray

__all__ = ["BLOCK_TOKENS", "DEFAULT_CAPACITY_TOKENS", "ResidentPrefixes"]

BLOCK_TOKENS = 32
# What is counted resident when the engine's KV capacity is unknown: a quarter of a small
# engine's cache (SGLang on one 24 GB GPU holds a few hundred thousand tokens of an 8B model).
DEFAULT_CAPACITY_TOKENS = 32_768


class ResidentPrefixes:
    """The prompt blocks most recently sent to the engine, least recently sent evicted first."""

    def __init__(self, capacity_tokens: Callable[[], int | None] = lambda: None) -> None:
        """`capacity_tokens`: the engine's KV tokens (None: unknown)."""
        self._capacity_tokens = capacity_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def record(self, tokens: TokenArray) -> None:
        """A prompt sent to the engine: its blocks are now the most recently used."""
        blocks = self._blocks
        for key in _block_keys(tokens):
            blocks[key] = None
            blocks.move_to_end(key)
        capacity = self._capacity_tokens() or DEFAULT_CAPACITY_TOKENS
        excess = len(blocks) - max(1, capacity // BLOCK_TOKENS)
        for _ in range(excess):
            blocks.popitem(last=False)

    def resident_length(self, tokens: TokenArray) -> int:
        """How many of the prompt's first tokens are resident (a multiple of `BLOCK_TOKENS`)."""
        blocks = self._blocks
        length = 0
        for key in _block_keys(tokens):
            if key not in blocks:
                break
            length += BLOCK_TOKENS
        return length

    def __len__(self) -> int:
        return len(self._blocks)


def _block_keys(tokens: TokenArray) -> Iterator[int]:
    """One key per whole block of `tokens`, each hashing the block and the key before it, so
    that equal keys mean equal prefixes (up to a 64-bit hash collision); lazily, so that a
    lookup stops hashing at its first miss."""
    key = 0
    for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        key = hash((key, tokens[start : start + BLOCK_TOKENS].tobytes()))
        yield key
