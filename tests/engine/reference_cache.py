"""A slow, obviously correct model of the radix cache, used as a test oracle.

The cache is the set of every cached prefix (a token tuple), each with the tick at which it
was last touched and the number of locks through it. Matching is a lookup of ever shorter
prefixes; inserting adds every prefix. There are no nodes, so no splits to get wrong.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


class ReferenceCache:
    """Every cached prefix with its last-access tick (see the module docstring)."""

    def __init__(self) -> None:
        self.ticks: dict[tuple[int, ...], int] = {}
        self.locks: Counter[tuple[int, ...]] = Counter()
        self.clock = 0

    @property
    def size(self) -> int:
        """Cached tokens: one per distinct prefix."""
        return len(self.ticks)

    def longest_prefix(self, tokens: Sequence[int]) -> int:
        """Length of the longest cached prefix of `tokens`."""
        length = len(tokens)
        while length and tuple(tokens[:length]) not in self.ticks:
            length -= 1
        return length

    def match(self, tokens: Sequence[int]) -> int:
        """Longest cached prefix; touches the matched prefixes."""
        self.clock += 1
        length = self.longest_prefix(tokens)
        for end in range(1, length + 1):
            self.ticks[tuple(tokens[:end])] = self.clock
        return length

    def insert(self, tokens: Sequence[int]) -> int:
        """Cache every prefix of `tokens`, touching them all; returns the new-token count."""
        self.clock += 1
        new = sum(tuple(tokens[:end]) not in self.ticks for end in range(1, len(tokens) + 1))
        for end in range(1, len(tokens) + 1):
            self.ticks[tuple(tokens[:end])] = self.clock
        return new

    def lock(self, tokens: Sequence[int]) -> None:
        """Hold a lock on every prefix of `tokens`."""
        for end in range(1, len(tokens) + 1):
            self.locks[tuple(tokens[:end])] += 1

    def unlock(self, tokens: Sequence[int]) -> None:
        """Release a lock taken with `lock`."""
        for end in range(1, len(tokens) + 1):
            self.locks[tuple(tokens[:end])] -= 1

    def leaves(self, prefixes: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """The prefixes in `prefixes` that no other prefix in it extends by one token."""
        parents = {prefix[:-1] for prefix in prefixes}
        return prefixes - parents
