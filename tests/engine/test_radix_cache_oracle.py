"""The radix cache agrees with the reference model on every random sequence of operations.

After each operation the cache's content must equal the model's, less tokens the cache evicted;
an eviction must take only unlocked whole branches, oldest first, and free what was asked or
everything it could. Match lengths and hit counts must equal the model's exactly.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from server.engine.radix_cache import CacheFullError, RadixCache, RadixNode
from tests.engine.reference_cache import ReferenceCache

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
    return {seq[:end] for seq in cache.cached_sequences() for end in range(1, len(seq) + 1)}


def _check_evictions(reference: ReferenceCache, cache: RadixCache) -> int:
    """Check what the cache dropped against the model, then drop it there too."""
    content = _content(cache)
    expected = set(reference.ticks)
    assert content <= expected, "the cache holds tokens nobody inserted"
    removed = expected - content
    for prefix in removed:
        assert reference.locks[prefix] == 0, "a locked token was evicted"
    for prefix in content:
        assert prefix[:-1] in content or len(prefix) == 1, "an inner token was evicted"
    unlocked_leaves = {p for p in reference.leaves(content) if reference.locks[p] == 0}
    if removed and unlocked_leaves:
        newest_removed = max(reference.ticks[p] for p in removed)
        oldest_kept = min(reference.ticks[p] for p in unlocked_leaves)
        assert newest_removed <= oldest_kept, "a more recently used branch was evicted first"
    for prefix in removed:
        del reference.ticks[prefix]
    assert cache.size == reference.size
    assert cache.size <= cache.capacity
    return len(removed)


@settings(max_examples=500, deadline=None)
@given(capacity=st.integers(3, 24), operations=_operations)
def test_the_cache_matches_the_reference_model(capacity: int, operations: list[Any]) -> None:
    cache, reference = RadixCache(capacity), ReferenceCache()
    held: list[tuple[RadixNode, tuple[int, ...]]] = []
    hit_tokens = 0
    for operation in operations:
        kind = operation[0]
        if kind == "insert":
            tokens = tuple(operation[1])
            try:
                result = cache.insert(tokens)
            except CacheFullError:
                reference.clock += 1  # the failed insert still walked its path
                for end in range(1, reference.longest_prefix(tokens) + 1):
                    reference.ticks[tokens[:end]] = reference.clock
                _check_evictions(reference, cache)
                on_path = {tokens[:end] for end in range(1, len(tokens) + 1)}
                leaves = reference.leaves(set(reference.ticks))
                assert all(reference.locks[p] or p in on_path for p in leaves)
                continue
            new = reference.insert(tokens)
            assert result.new_tokens == new
            _check_evictions(reference, cache)
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
            evictable = cache.evictable_size
            freed = cache.evict(operation[1])
            assert freed == _check_evictions(reference, cache)
            assert freed >= min(operation[1], 1 if evictable else 0)
            assert freed >= operation[1] or cache.evictable_size == 0
        assert cache.protected_size == sum(1 for p in reference.ticks if reference.locks[p])
        assert cache.stats.hit_tokens == hit_tokens
