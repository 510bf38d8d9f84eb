"""A token radix cache with a capacity, LRU eviction of unlocked leaves, and hit accounting.

It behaves like SGLang's `RadixCache` with `page_size=1` and the `lru` policy: edges are
compacted token runs, `match_prefix` splits a node when a match ends inside it, `insert` shares
what is already cached, `lock`/`unlock` protect the path of a running request, and `evict` pops
unlocked leaves oldest first (a parent that becomes an unlocked leaf joins the queue). Recency
follows SGLang's too: a walk touches every node it enters, the one it stops inside whole (its
unmatched tail included), and a leaf an insert creates is newer than that walk. Recency is a
logical tick, not a wall clock, so two runs with the same operations evict the same tokens; on
random operation sequences this class and SGLang 0.5.23's own cache keep the same tokens.

Unlike SGLang's, this cache owns its capacity: `size` never exceeds it, and `insert` evicts
least recently used unlocked leaves to make room for the tokens it adds. It is pure: no I/O, no
clock, no asyncio; the engine simulator and the experiments drive it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CacheFullError", "CacheStats", "InsertResult", "PrefixMatch", "RadixCache", "RadixNode"]


class CacheFullError(Exception):
    """An insert needs more room than evicting every unlocked leaf can free."""


class RadixNode:
    """One compacted edge of the tree; an opaque handle for `lock` and `unlock` to callers."""

    __slots__ = ("children", "deleted", "key", "last_access", "lock_ref", "parent")

    def __init__(self, key: tuple[int, ...], parent: RadixNode | None, tick: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, RadixNode] = {}
        self.lock_ref = 0
        self.last_access = tick
        self.deleted = False


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """How many leading tokens are cached, and the node where the cached prefix ends."""

    length: int
    node: RadixNode


@dataclass(frozen=True, slots=True)
class InsertResult:
    """The node holding the inserted sequence's end, and how many tokens it added."""

    node: RadixNode
    prefix_length: int
    new_tokens: int


@dataclass(slots=True)
class CacheStats:
    """Running totals: what `match_prefix` was asked and found, what came and went."""

    queries: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    inserted_tokens: int = 0
    evicted_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        """Matched tokens over queried tokens (0 before the first query)."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


def _common_prefix_length(edge: tuple[int, ...], key: tuple[int, ...], start: int) -> int:
    """Length of the common prefix of `edge` and `key[start:]`.

    A binary search over slice equality keeps the comparisons in C: O(L log L) element
    compares without a Python-level loop per token.
    """
    low, high = 0, min(len(edge), len(key) - start)
    while low < high:
        middle = (low + high + 1) // 2
        if edge[:middle] == key[start : start + middle]:
            low = middle
        else:
            high = middle - 1
    return low


class RadixCache:
    """A prefix cache of token sequences holding at most `capacity` tokens."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.stats = CacheStats()
        self._ticks = itertools.count(1)
        self._heap_order = itertools.count()
        self.reset()

    def reset(self) -> None:
        """Drop every cached token (locks included); the statistics are kept."""
        self.root = RadixNode((), None, 0)
        self.root.lock_ref = 1  # the root is never evicted
        self._size = 0
        self._protected = 0
        # Entries are (last_access, order, node); stale ones are skipped when popped.
        self._leaves: list[tuple[int, int, RadixNode]] = []

    @property
    def size(self) -> int:
        """Tokens cached now."""
        return self._size

    @property
    def protected_size(self) -> int:
        """Tokens on the path of at least one lock: never evicted."""
        return self._protected

    @property
    def evictable_size(self) -> int:
        """Tokens that `evict` could free."""
        return self._size - self._protected

    @property
    def free(self) -> int:
        """Room left before the capacity is reached."""
        return self.capacity - self._size

    def match_prefix(self, tokens: Sequence[int]) -> PrefixMatch:
        """The longest cached prefix of `tokens`; refreshes its recency and counts a query."""
        key = tuple(tokens)
        length, node, _ = self._walk(key)
        self.stats.queries += 1
        self.stats.query_tokens += len(key)
        self.stats.hit_tokens += length
        return PrefixMatch(length, node)

    def insert(self, tokens: Sequence[int]) -> InsertResult:
        """Cache `tokens`, sharing what is cached already; evicts LRU leaves if it must."""
        key = tuple(tokens)
        length, node, _ = self._walk(key)
        new_tokens = len(key) - length
        if new_tokens == 0:
            return InsertResult(node, length, 0)
        if new_tokens > self.free:
            # The path we extend must survive the eviction that makes room for its tail.
            self.lock(node)
            try:
                self.evict(new_tokens - self.free)
            finally:
                self.unlock(node)
            if new_tokens > self.free:
                raise CacheFullError(
                    f"{new_tokens} tokens do not fit: {self.free} free, "
                    f"{self.evictable_size} evictable of {self.capacity}"
                )
        # Newer than the walk, as SGLang's new node is (its clock has moved on by then): the
        # lower half of an edge this insert split is evicted before the new leaf.
        leaf = RadixNode(key[length:], node, next(self._ticks))
        node.children[key[length]] = leaf
        self._size += new_tokens
        self.stats.inserted_tokens += new_tokens
        self._push_leaf(leaf)
        return InsertResult(leaf, length, new_tokens)

    def lock(self, node: RadixNode) -> None:
        """Protect `node` and its ancestors from eviction until the matching `unlock`."""
        current: RadixNode | None = node
        while current is not None and current is not self.root:
            if current.lock_ref == 0:
                self._protected += len(current.key)
            current.lock_ref += 1
            current = current.parent

    def unlock(self, node: RadixNode) -> None:
        """Release one `lock` of `node`."""
        current: RadixNode | None = node
        while current is not None and current is not self.root:
            if current.lock_ref <= 0:
                raise ValueError("unlock without a matching lock")
            current.lock_ref -= 1
            if current.lock_ref == 0:
                self._protected -= len(current.key)
                if not current.children:
                    self._push_leaf(current)
            current = current.parent

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` by dropping unlocked leaves, oldest first; returns freed."""
        freed = 0
        while freed < num_tokens and self._leaves:
            tick, _, node = heapq.heappop(self._leaves)
            if not self._is_evictable_leaf(node) or node.last_access != tick:
                continue
            parent = node.parent
            assert parent is not None
            del parent.children[node.key[0]]
            node.deleted = True
            freed += len(node.key)
            self._size -= len(node.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                self._push_leaf(parent)
        self.stats.evicted_tokens += freed
        if len(self._leaves) > 64 and len(self._leaves) > 4 * max(self._size, 1):
            self._leaves = [entry for entry in self._leaves if self._is_evictable_leaf(entry[2])]
            heapq.heapify(self._leaves)
        return freed

    def _walk(self, key: tuple[int, ...]) -> tuple[int, RadixNode, int]:
        """Follow `key` down the tree, touching each node; split where a match ends mid-edge.

        Returns the matched length, the node where the match ends, and the walk's tick.
        """
        tick = next(self._ticks)
        node, position = self.root, 0
        while position < len(key):
            child = node.children.get(key[position])
            if child is None:
                break
            edge = child.key
            if key[position : position + len(edge)] == edge:
                child.last_access = tick
                node, position = child, position + len(edge)
                continue
            # The child was found by its first token, so at least one token matches. As in
            # SGLang, the node is touched whole, its unmatched tail included, then split.
            matched = _common_prefix_length(edge, key, position)
            child.last_access = tick
            if not child.children:
                self._push_leaf(child)
            node = self._split(child, matched, tick)
            position += matched
            break
        if not node.children and node is not self.root:
            self._push_leaf(node)  # its recency changed, so its place in the queue did
        return position, node, tick

    def _split(self, child: RadixNode, at: int, tick: int) -> RadixNode:
        """Cut `child`'s edge after `at` tokens; the new upper node is returned, touched."""
        parent = child.parent
        assert parent is not None and 0 < at < len(child.key)
        upper = RadixNode(child.key[:at], parent, tick)
        # Every lock through `child` also passes through the new node above it.
        upper.lock_ref = child.lock_ref
        upper.children[child.key[at]] = child
        parent.children[child.key[0]] = upper
        child.key = child.key[at:]
        child.parent = upper
        return upper

    def _is_evictable_leaf(self, node: RadixNode) -> bool:
        return not node.deleted and not node.children and node.lock_ref == 0

    def _push_leaf(self, node: RadixNode) -> None:
        if node.lock_ref == 0:
            heapq.heappush(self._leaves, (node.last_access, next(self._heap_order), node))
