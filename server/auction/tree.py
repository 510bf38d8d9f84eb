"""The request-augmented radix tree of a batch, built without a Python loop per token.

The prompts are sorted; the longest common prefix of each sorted neighbour pair is found with
numpy; the compacted tree then follows from a single stack pass over the sorted prompts (the
classic construction of a compacted trie from a sorted list and its LCP array). Every request
hangs as its own leaf under the node where its prompt ends, so identical prompts give sibling
leaves and a prompt that is a prefix of another hangs its leaf on an inner node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from inference_auctions.server.auction.request import TokenArray

ROOT = 0
_SHORT_TOKENS = 16
NO_PARENT = -1
NOT_A_REQUEST = -1


@dataclass(frozen=True, slots=True)
class TreeStats:
    """Shape of a batch's radix tree; `shared_tokens` are the prompt tokens a cache can reuse."""

    requests: int
    nodes: int  # radix nodes, not counting the root or the request leaves
    depth: int  # most radix nodes on a path from the root to a prompt's end
    total_tokens: int  # every prompt token, counted once per request
    unique_tokens: int  # tokens on the tree's edges: what a cache must hold for the batch

    @property
    def shared_tokens(self) -> int:
        """Prompt tokens that repeat a prefix already in the tree."""
        return self.total_tokens - self.unique_tokens


@dataclass(frozen=True, slots=True)
class RadixTree:
    """Nodes are ints; node 0 is the root. Parallel lists hold each node's fields.

    `preorder` lists every node with each parent before its children, so walking it backwards
    visits children first (used to aggregate sums bottom-up without recursion).
    """

    parent: list[int]
    children: list[list[int]]
    request: list[int]  # request index of a request leaf, NOT_A_REQUEST for radix nodes
    leaf_of: list[int]  # node of each request's leaf
    preorder: list[int]
    stats: TreeStats
    # Prompt tokens from the root to the end of each node: the prefix its requests share.
    depth_tokens: list[int]


def build_radix_tree(prompts: Sequence[TokenArray]) -> RadixTree:
    """Build the request-augmented compacted trie of `prompts` (request i = prompts[i])."""
    n = len(prompts)
    order = _LexicographicOrder(prompts)

    parent = [NO_PARENT]
    children: list[list[int]] = [[]]
    request = [NOT_A_REQUEST]
    depth_tokens = [0]
    leaf_of = [0] * n
    # The path from the root to the previous prompt's end, as (node, depth in tokens).
    stack = [ROOT]
    previous = NOT_A_REQUEST

    def new_node(under: int, depth: int, request_index: int = NOT_A_REQUEST) -> int:
        node = len(parent)
        parent.append(under)
        children.append([])
        request.append(request_index)
        depth_tokens.append(depth)
        children[under].append(node)
        return node

    for index in order.requests:
        size = int(prompts[index].size)
        shared = 0 if previous == NOT_A_REQUEST else order.shared_prefix(previous, index)
        popped = NO_PARENT
        while depth_tokens[stack[-1]] > shared:
            popped = stack.pop()
        if depth_tokens[stack[-1]] < shared:
            # The new prompt leaves the previous path inside the edge above `popped`: split it.
            under = stack[-1]
            middle = len(parent)
            parent.append(under)
            children.append([popped])
            request.append(NOT_A_REQUEST)
            depth_tokens.append(shared)
            # Prompts arrive sorted, so the path being split is always the newest child.
            children[under][-1] = middle
            parent[popped] = middle
            stack.append(middle)
        if size > depth_tokens[stack[-1]]:
            stack.append(new_node(stack[-1], size))
        leaf_of[index] = new_node(stack[-1], size, index)
        previous = index

    preorder = _preorder(children)
    stats = _stats(prompts, parent, request, depth_tokens, preorder)
    return RadixTree(parent, children, request, leaf_of, preorder, stats, depth_tokens)


class _LexicographicOrder:
    """The prompts in lexicographic order, and the shared prefix of sorted neighbours.

    Prompts are packed as big-endian fixed-width bytes, whose memcmp order is the prompts'
    lexicographic order, so the sort runs in C (comparing lists of Python ints would first box
    every token, which costs more than the rest of the auction together). Most prompts differ
    within their first tokens, so they are sorted by a short key of those first; only the runs
    that tie on it are packed whole and sorted again. That keeps the memory this streams close
    to the tokens that are actually shared.
    """

    def __init__(self, prompts: Sequence[TokenArray]) -> None:
        # 8-byte words always fit, and the short keys are too small for the width to matter.
        self._short = [prompt[:_SHORT_TOKENS].astype(">u8").tobytes() for prompt in prompts]
        self._whole: dict[int, npt.NDArray[Any]] = {}
        # Stable: identical prompts keep their arrival order among their sibling leaves.
        self.requests = sorted(range(len(prompts)), key=self._short.__getitem__)
        start = 0
        for end in range(1, len(self.requests) + 1):
            if end == len(self.requests) or self._short_of(end) != self._short_of(start):
                if end - start > 1:
                    self._sort_run(prompts, start, end)
                start = end

    def _short_of(self, place: int) -> bytes:
        return self._short[self.requests[place]]

    def _sort_run(self, prompts: Sequence[TokenArray], start: int, end: int) -> None:
        run = self.requests[start:end]
        largest = max((int(prompts[i].max()) for i in run if prompts[i].size), default=0)
        width, word = (">u4", np.uint32) if largest < 2**32 else (">u8", np.uint64)
        whole = {i: prompts[i].astype(width).tobytes() for i in run}
        run.sort(key=whole.__getitem__)
        self.requests[start:end] = run
        for i, packed in whole.items():
            self._whole[i] = np.frombuffer(packed, dtype=word)

    def shared_prefix(self, a: int, b: int) -> int:
        """Tokens shared by the prompts of requests a and b, neighbours in the order."""
        if self._short[a] != self._short[b]:
            return _common_prefix_length(
                np.frombuffer(self._short[a], dtype=">u8"),
                np.frombuffer(self._short[b], dtype=">u8"),
            )
        return _common_prefix_length(self._whole[a], self._whole[b])


def _common_prefix_length(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> int:
    length = min(a.size, b.size)
    if length == 0:
        return 0
    differs = a[:length] != b[:length]
    first = int(differs.argmax())
    return first if differs[first] else length


def _preorder(children: list[list[int]]) -> list[int]:
    order: list[int] = []
    pending = [ROOT]
    while pending:
        node = pending.pop()
        order.append(node)
        pending.extend(children[node])
    return order


def _stats(
    prompts: Sequence[TokenArray],
    parent: list[int],
    request: list[int],
    depth_tokens: list[int],
    preorder: list[int],
) -> TreeStats:
    radix_nodes = [node for node in preorder[1:] if request[node] == NOT_A_REQUEST]
    unique = sum(depth_tokens[node] - depth_tokens[parent[node]] for node in radix_nodes)
    level = [0] * len(parent)
    for node in preorder[1:]:
        level[node] = level[parent[node]] + (request[node] == NOT_A_REQUEST)
    return TreeStats(
        requests=len(prompts),
        nodes=len(radix_nodes),
        depth=max(level, default=0),
        total_tokens=sum(int(prompt.size) for prompt in prompts),
        unique_tokens=unique,
    )
