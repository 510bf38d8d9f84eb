"""A slow, obviously correct model of the radix cache, used as a test oracle.

The cache is a dict from every cached prefix (a token tuple) to the tick at which it was last
touched, plus the set of prefixes where a node ends (a split, a branch, or an inserted
sequence's end; nodes are never merged, as in SGLang). A node is the run of prefixes between
two node ends. Everything is recomputed by brute force on every call:

* a walk (match or insert) touches every prefix it matches and, where it stops inside a node,
  that whole node, then records a node end there;
* an insert adds the missing prefixes with a newer tick, first evicting as `evict` does while
  the path it extends is locked;
* `evict` repeatedly drops the unlocked leaf node with the oldest tick.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

Prefix = tuple[int, ...]


class ReferenceFull(Exception):
    """The model's insert does not fit."""


class ReferenceCache:
    """Every cached prefix with its last-access tick (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.ticks: dict[Prefix, int] = {}
        self.ends: set[Prefix] = set()
        self.locks: Counter[Prefix] = Counter()
        self.clock = 0

    @property
    def size(self) -> int:
        """Cached tokens: one per distinct prefix."""
        return len(self.ticks)

    @property
    def protected_size(self) -> int:
        """Cached tokens under at least one lock."""
        return sum(1 for prefix in self.ticks if self.locks[prefix])

    def longest_prefix(self, tokens: Sequence[int]) -> int:
        """Length of the longest cached prefix of `tokens`."""
        length = len(tokens)
        while length and tuple(tokens[:length]) not in self.ticks:
            length -= 1
        return length

    def children(self, prefix: Prefix) -> list[Prefix]:
        """The cached prefixes one token longer than `prefix`."""
        return [p for p in self.ticks if len(p) == len(prefix) + 1 and p[:-1] == prefix]

    def node(self, prefix: Prefix) -> list[Prefix]:
        """The prefixes of the node that holds `prefix`, shortest first."""
        end = prefix
        while end not in self.ends and len(self.children(end)) == 1:
            end = self.children(end)[0]
        start = prefix
        while len(start) > 1 and start[:-1] not in self.ends:
            start = start[:-1]
        return [end[:length] for length in range(len(start), len(end) + 1)]

    def match(self, tokens: Sequence[int]) -> int:
        """Longest cached prefix of `tokens`, touching what a walk touches."""
        self.clock += 1
        length = self.longest_prefix(tokens)
        if length:
            matched = tuple(tokens[:length])
            for prefix in [matched[:end] for end in range(1, length)] + self.node(matched):
                self.ticks[prefix] = self.clock
            self.ends.add(matched)
        return length

    def insert(self, tokens: Sequence[int]) -> int:
        """Cache every prefix of `tokens`; returns how many were new."""
        key = tuple(tokens)
        length = self.match(key)
        new = len(key) - length
        if new == 0:
            return 0
        if new > self.capacity - self.size:
            self.lock(key[:length])
            self.evict(new - (self.capacity - self.size))
            self.unlock(key[:length])
            if new > self.capacity - self.size:
                raise ReferenceFull
        self.clock += 1
        for end in range(length + 1, len(key) + 1):
            self.ticks[key[:end]] = self.clock
        self.ends.add(key)
        return new

    def evict(self, num_tokens: int) -> int:
        """Drop unlocked leaf nodes, oldest first, until `num_tokens` are freed."""
        freed = 0
        while freed < num_tokens:
            leaves = [
                self.node(end)
                for end in self.ends
                if end in self.ticks and not self.children(end) and not self.locks[end]
            ]
            if not leaves:
                break
            oldest = min(leaves, key=lambda node: self.ticks[node[-1]])
            ties = [node for node in leaves if self.ticks[node[-1]] == self.ticks[oldest[-1]]]
            assert len(ties) == 1, "two leaves touched at the same tick: the order is ambiguous"
            for prefix in oldest:
                del self.ticks[prefix]
            self.ends.discard(oldest[-1])
            freed += len(oldest)
        return freed

    def lock(self, tokens: Sequence[int]) -> None:
        """Hold a lock on every prefix of `tokens`."""
        for end in range(1, len(tokens) + 1):
            self.locks[tuple(tokens[:end])] += 1

    def unlock(self, tokens: Sequence[int]) -> None:
        """Release a lock taken with `lock`."""
        for end in range(1, len(tokens) + 1):
            self.locks[tuple(tokens[:end])] -= 1
