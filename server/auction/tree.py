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

from server.auction.request import TokenArray

ROOT = 0
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


def build_radix_tree(prompts: Sequence[TokenArray]) -> RadixTree:
    """Build the request-augmented compacted trie of `prompts` (request i = prompts[i])."""
    n = len(prompts)
    keys, word = _sort_keys(prompts)
    # Stable sort: identical prompts keep their arrival order among their sibling leaves.
    sorted_requests = sorted(range(n), key=keys.__getitem__)

    parent = [NO_PARENT]
    children: list[list[int]] = [[]]
    request = [NOT_A_REQUEST]
    depth_tokens = [0]
    leaf_of = [0] * n
    # The path from the root to the previous prompt's end, as (node, depth in tokens).
    stack = [ROOT]
    previous: npt.NDArray[Any] | None = None

    def new_node(under: int, depth: int, request_index: int = NOT_A_REQUEST) -> int:
        node = len(parent)
        parent.append(under)
        children.append([])
        request.append(request_index)
        depth_tokens.append(depth)
        children[under].append(node)
        return node

    for index in sorted_requests:
        # The packed words are half the memory of the int64 prompts: the LCP scan reads less.
        prompt = np.frombuffer(keys[index], dtype=word)
        shared = 0 if previous is None else _common_prefix_length(previous, prompt)
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
        if prompt.size > depth_tokens[stack[-1]]:
            stack.append(new_node(stack[-1], int(prompt.size)))
        leaf_of[index] = new_node(stack[-1], int(prompt.size), index)
        previous = prompt

    preorder = _preorder(children)
    stats = _stats(prompts, parent, request, depth_tokens, preorder)
    return RadixTree(parent, children, request, leaf_of, preorder, stats)


def _sort_keys(prompts: Sequence[TokenArray]) -> tuple[list[bytes], type[np.unsignedinteger[Any]]]:
    """Big-endian fixed-width bytes: their memcmp order is the prompts' lexicographic order.

    Comparing bytes runs in C over whole buffers; comparing lists of Python ints would first
    need every token boxed, which costs more than the rest of the auction together.
    """
    largest = max((int(prompt.max()) for prompt in prompts if prompt.size), default=0)
    width, word = (">u4", np.uint32) if largest < 2**32 else (">u8", np.uint64)
    return [prompt.astype(width).tobytes() for prompt in prompts], word


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
