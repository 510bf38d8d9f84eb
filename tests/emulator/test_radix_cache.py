"""The radix cache: splits, sharing, locks, LRU eviction, capacity, and an oracle."""

from __future__ import annotations

import pytest

from inference_auctions.server.emulator.radix_cache import CacheFullError, RadixCache
from tests.emulator.radix_paths import cached_sequences


def test_match_on_an_empty_cache_finds_nothing() -> None:
    cache = RadixCache(100)
    match = cache.match_prefix([1, 2, 3])
    assert match.length == 0
    assert match.node is cache.root
    assert cache.stats.query_tokens == 3
    assert cache.stats.hit_tokens == 0


def test_insert_shares_the_common_prefix() -> None:
    cache = RadixCache(100)
    assert cache.insert([1, 2, 3, 4]).new_tokens == 4
    result = cache.insert([1, 2, 9])
    assert (result.prefix_length, result.new_tokens) == (2, 1)
    assert cache.size == 5
    assert sorted(cached_sequences(cache)) == [(1, 2, 3, 4), (1, 2, 9)]


def test_a_match_ending_inside_an_edge_splits_the_node() -> None:
    cache = RadixCache(100)
    cache.insert([1, 2, 3, 4, 5])
    match = cache.match_prefix([1, 2, 3, 7])
    assert match.length == 3
    assert match.node.key == (1, 2, 3)
    (child,) = match.node.children.values()
    assert child.key == (4, 5)
    assert child.parent is match.node
    assert cache.size == 5  # a split moves no token


def test_a_prompt_that_is_a_prefix_of_a_cached_one_is_fully_matched() -> None:
    cache = RadixCache(100)
    cache.insert([1, 2, 3, 4])
    assert cache.match_prefix([1, 2]).length == 2
    assert cache.insert([1, 2]).new_tokens == 0


def test_hit_accounting_counts_every_query() -> None:
    cache = RadixCache(100)
    cache.insert([1, 2, 3, 4])
    cache.match_prefix([1, 2, 3, 4])
    cache.match_prefix([1, 2, 5, 6])
    assert cache.stats.queries == 2
    assert cache.stats.query_tokens == 8
    assert cache.stats.hit_tokens == 6
    assert cache.stats.hit_rate == 0.75


def test_eviction_takes_the_least_recently_used_leaf_first() -> None:
    cache = RadixCache(100)
    cache.insert([1, 1, 1])
    cache.insert([2, 2, 2])
    cache.insert([3, 3, 3])
    cache.match_prefix([1, 1, 1])  # 1s are now more recent than 2s and 3s
    assert cache.evict(1) == 3
    assert sorted(cached_sequences(cache)) == [(1, 1, 1), (3, 3, 3)]
    assert cache.stats.evicted_tokens == 3


def test_a_match_ending_inside_a_node_refreshes_the_whole_node() -> None:
    # As SGLang: the node is touched before it is split, its unmatched tail included.
    cache = RadixCache(100)
    cache.insert([1, 2, 3, 4])
    cache.insert([7, 7])
    cache.match_prefix([1, 2])
    assert cache.evict(1) == 2
    assert cached_sequences(cache) == [(1, 2, 3, 4)]


def test_a_new_leaf_is_newer_than_the_edge_its_insert_split() -> None:
    cache = RadixCache(100)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 3, 4, 9])
    cache.insert([1, 2, 5])  # splits [1, 2, 3, 4] into [1, 2] and [3, 4], then adds [5]
    assert cache.evict(1) == 1  # [9], the oldest leaf; now [3, 4] is a leaf
    assert cache.evict(1) == 2  # [3, 4], touched by the insert just before [5] was made
    assert cached_sequences(cache) == [(1, 2, 5)]


def test_eviction_never_touches_locked_nodes_and_frees_parents_that_become_leaves() -> None:
    cache = RadixCache(100)
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4])
    locked = cache.match_prefix([1, 2, 3]).node
    cache.lock(locked)
    assert cache.protected_size == 3
    assert cache.evict(100) == 1  # only [4] can go: [1, 2] is on the locked path
    assert cached_sequences(cache) == [(1, 2, 3)]
    cache.unlock(locked)
    assert cache.evictable_size == 3
    assert cache.evict(100) == 3
    assert cache.size == 0


def test_only_leaves_are_evicted_so_a_shared_prefix_outlives_its_branches() -> None:
    cache = RadixCache(100)
    cache.insert([7, 7, 1])
    cache.insert([7, 7, 2])
    assert cache.evict(1) == 1
    assert len(cached_sequences(cache)) == 1
    assert cache.match_prefix([7, 7]).length == 2


def test_insert_evicts_to_stay_within_capacity() -> None:
    cache = RadixCache(6)
    cache.insert([1, 1, 1])
    cache.insert([2, 2, 2])
    cache.insert([3, 3, 3])
    assert cache.size == 6
    assert sorted(cached_sequences(cache)) == [(2, 2, 2), (3, 3, 3)]


def test_insert_keeps_the_path_it_extends() -> None:
    cache = RadixCache(6)
    cache.insert([1, 2, 3])
    cache.insert([9, 9])
    cache.match_prefix([9, 9])  # [1, 2, 3] is now the least recently used
    cache.insert([1, 2, 3, 4, 5])  # needs 2 tokens: evicts [9, 9], not its own prefix
    assert cached_sequences(cache) == [(1, 2, 3, 4, 5)]


def test_an_insert_that_cannot_fit_raises_and_changes_nothing_locked() -> None:
    cache = RadixCache(5)
    node = cache.insert([1, 2, 3, 4]).node
    cache.lock(node)
    with pytest.raises(CacheFullError):
        cache.insert([5, 6])
    assert cached_sequences(cache) == [(1, 2, 3, 4)]
    assert cache.size == 4


def test_unlock_without_lock_is_an_error() -> None:
    cache = RadixCache(10)
    node = cache.insert([1]).node
    with pytest.raises(ValueError, match="unlock"):
        cache.unlock(node)


def test_reset_empties_the_cache_but_keeps_statistics() -> None:
    cache = RadixCache(10)
    cache.insert([1, 2])
    cache.match_prefix([1, 2])
    cache.reset()
    assert cache.size == 0
    assert cache.match_prefix([1, 2]).length == 0
    assert cache.stats.queries == 2
