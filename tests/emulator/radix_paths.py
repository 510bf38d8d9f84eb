"""Reading a radix cache's contents back, for the tests."""

from __future__ import annotations

from inference_auctions.server.emulator.radix_cache import RadixCache, RadixNode


def cached_sequences(cache: RadixCache) -> list[tuple[int, ...]]:
    """Every root-to-leaf token sequence of `cache`."""
    sequences: list[tuple[int, ...]] = []
    stack: list[tuple[RadixNode, tuple[int, ...]]] = [(cache.root, ())]
    while stack:
        node, prefix = stack.pop()
        path = prefix + node.key
        if not node.children and node is not cache.root:
            sequences.append(path)
        stack.extend((child, path) for child in node.children.values())
    return sequences
