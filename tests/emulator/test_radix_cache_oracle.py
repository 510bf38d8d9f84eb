"""The radix cache agrees exactly with the reference model on random operation sequences.

After every operation both hold the same tokens; matches, inserts, evictions and failed
inserts give the same numbers; locks protect the same tokens. (The same operations were also
replayed once against SGLang 0.5.23's own `RadixCache`, with the same results.)
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from inference_auctions.server.emulator.radix_cache import CacheFullError, RadixCache, RadixNode
from tests.emulator.radix_paths import cached_sequences
from tests.emulator.reference_cache import ReferenceCache, ReferenceFull

_sequences = st.lists(st.integers(0, 2), min_size=1, max_size=8)
_operations = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), _sequences),
        st.tuples(st.just("match"), _sequences, st.booleans()),
        st.tuples(st.just("unlock"), st.integers(0, 10)),
        st.tuples(st.just("evict"), st.integers(0, 12)),
    ),
    max_size=40,
)


def _content(cache: RadixCache) -> set[tuple[int, ...]]:
    return {seq[:end] for seq in cached_sequences(cache) for end in range(1, len(seq) + 1)}


@settings(max_examples=400, deadline=None)
@given(capacity=st.integers(3, 24), operations=_operations)
def test_the_cache_matches_the_reference_model(capacity: int, operations: list[Any]) -> None:
    cache, reference = RadixCache(capacity), ReferenceCache(capacity)
    held: list[tuple[RadixNode, tuple[int, ...]]] = []
    hit_tokens = 0
    for operation in operations:
        kind = operation[0]
        if kind == "insert":
            tokens = tuple(operation[1])
            try:
                expected: int | None = reference.insert(tokens)
            except ReferenceFull:
                expected = None
            try:
                assert cache.insert(tokens).new_tokens == expected
            except CacheFullError:
                assert expected is None
        elif kind == "match":
            tokens, lock = tuple(operation[1]), operation[2]
            match = cache.match_prefix(tokens)
            assert match.length == reference.match(tokens)
            hit_tokens += match.length
            if lock:
                cache.lock(match.node)
                reference.lock(tokens[: match.length])
                held.append((match.node, tokens[: match.length]))
        elif kind == "unlock" and held:
            node, tokens = held.pop(operation[1] % len(held))
            cache.unlock(node)
            reference.unlock(tokens)
        elif kind == "evict":
            assert cache.evict(operation[1]) == reference.evict(operation[1])
        assert _content(cache) == set(reference.ticks)
        assert cache.size == reference.size <= capacity
        assert cache.protected_size == reference.protected_size
        assert cache.stats.hit_tokens == hit_tokens
