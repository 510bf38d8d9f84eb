"""The batch as the auction takes it: its requests, checked, and the radix tree of their prompts.

`validate_batch` checks every request (naming the request and the field it refuses) and hands
the prompts on as 1-D integer arrays, never copied. `build_radix_tree` builds the
request-augmented radix tree of those prompts without a Python loop per token: the prompts are
sorted; the longest common prefix of each sorted neighbour pair is found with numpy; the
compacted tree then follows from a single stack pass over the sorted prompts (the classic
construction of a compacted trie from a sorted list and its LCP array). Every request hangs as
its own leaf under the node where its prompt ends, so identical prompts give sibling leaves and
a prompt that is a prefix of another hangs its leaf on an inner node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from inference_auctions.server.auction.errors import AuctionInputError

# A prompt as the core works on it: a 1-D array of token ids in [0, 2**63), in whatever integer
# dtype it arrived in (int32 from a tokenizer, int64 from a list): converting would copy it.
TokenArray = npt.NDArray[np.integer[Any]]

_INT64_MAX = np.iinfo(np.int64).max

# The radix tree's nodes are ints: the root, and the marks of "above the root" and "not a
# request's leaf".
ROOT = 0
NO_PARENT = -1
NOT_A_REQUEST = -1
# Prompts are sorted on their first tokens in one matrix, ties on the rest (`lexicographic_order`).
_SHORT_TOKENS = 16


@dataclass(frozen=True, slots=True)
class AuctionRequest:
    """One request of a batch: its id, its user, its prompt as token ids and its bid in micros."""

    rid: str
    user: str
    tokens: Sequence[int] | npt.NDArray[np.integer]
    bid: int


@dataclass(frozen=True, slots=True)
class ValidatedBatch:
    """A batch whose requests passed validation, with prompts as 1-D integer arrays."""

    rids: list[str]
    users: list[str]
    bids: list[int]
    prompts: list[TokenArray]


def validate_batch(requests: Sequence[AuctionRequest], slots: int | None = None) -> ValidatedBatch:
    """Check every request, then that the batch holds no more than `slots` requests (None: any
    number), and return the batch in the shape the core works on."""
    seen: set[str] = set()
    rids: list[str] = []
    users: list[str] = []
    bids: list[int] = []
    prompts: list[TokenArray] = []
    for index, request in enumerate(requests):
        if not isinstance(request, AuctionRequest):
            raise AuctionInputError(
                index, "request", f"must be an AuctionRequest, not {type(request).__name__}"
            )
        rid = request.rid
        if not isinstance(rid, str) or not rid:
            raise AuctionInputError(rid, "rid", "must be a non-empty string")
        if rid in seen:
            raise AuctionInputError(
                rid, "rid", "is a duplicate: every request of a batch needs its own id"
            )
        seen.add(rid)
        if not isinstance(request.user, str) or not request.user:
            raise AuctionInputError(rid, "user", "must be a non-empty string")
        rids.append(rid)
        users.append(request.user)
        bids.append(_validate_bid(rid, request.bid))
        prompts.append(_token_array(rid, request.tokens))
    if slots is not None and len(rids) > slots:
        raise AuctionInputError.too_many_requests(len(rids), slots)
    return ValidatedBatch(rids=rids, users=users, bids=bids, prompts=prompts)


def _validate_bid(rid: str, bid: object) -> int:
    if type(bid) is int and bid >= 0:  # the common case; type() also rules out bool
        return bid
    # bool is a subclass of int and float NaN compares false with everything: both are refused
    # explicitly, because a bid must be an exact whole number of micro-credits.
    if isinstance(bid, bool) or not isinstance(bid, int | np.integer):
        raise AuctionInputError(
            rid, "bid", f"must be an int of micro-credits, not {type(bid).__name__} {bid!r}"
        )
    value = int(bid)
    if value < 0:
        raise AuctionInputError(rid, "bid", f"must be >= 0 micro-credits, got {value}")
    return value


def _token_array(rid: str, tokens: object) -> TokenArray:
    # The path the server takes: a flat integer array is checked in place and never copied.
    if type(tokens) is np.ndarray and tokens.ndim == 1 and tokens.dtype.kind in "iu":
        return _checked_ids(rid, tokens)
    if isinstance(tokens, str | bytes):
        raise AuctionInputError(rid, "tokens", "must be a sequence of token ids, not text")
    try:
        array = np.asarray(tokens)
    except (OverflowError, ValueError, TypeError) as error:
        raise AuctionInputError(
            rid, "tokens", f"must be a flat sequence of ints ({error})"
        ) from None
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1:
        raise AuctionInputError(
            rid, "tokens", f"must be a flat sequence of ints, got {array.ndim} dimensions"
        )
    if array.dtype.kind not in "iu":
        raise AuctionInputError(rid, "tokens", f"must all be ints, found {array.dtype} values")
    return _checked_ids(rid, array)


def _checked_ids(rid: str, array: npt.NDArray[np.integer[Any]]) -> TokenArray:
    """`array` (1-D, integer) itself once its ids are known to lie in [0, 2**63).

    The dtype alone settles most of it: unsigned ids below 64 bits can be neither negative nor
    too large, so they are not read at all; signed ones need one pass for their minimum, and
    only uint64 can exceed int64.
    """
    if array.size == 0:
        return array
    if array.dtype.kind == "u":
        if array.dtype.itemsize == 8 and array.max() > _INT64_MAX:
            raise AuctionInputError(rid, "tokens", "must fit in a signed 64-bit int")
    elif array.min() < 0:
        raise AuctionInputError(rid, "tokens", "must be non-negative token ids")
    return array


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
    sizes = [prompt.size for prompt in prompts]
    requests, shared_with_previous = lexicographic_order(prompts, sizes)

    parent = [NO_PARENT]
    children: list[list[int]] = [[]]
    request = [NOT_A_REQUEST]
    depth_tokens = [0]
    leaf_of = [0] * n
    # The path from the root to the previous prompt's end, as (node, depth in tokens).
    stack = [ROOT]

    def new_node(under: int, depth: int, request_index: int = NOT_A_REQUEST) -> int:
        node = len(parent)
        parent.append(under)
        children.append([])
        request.append(request_index)
        depth_tokens.append(depth)
        children[under].append(node)
        return node

    for index, shared in zip(requests, shared_with_previous, strict=True):
        size = sizes[index]
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

    preorder = _preorder(children)
    stats = _stats(sizes, parent, request, depth_tokens, preorder)
    return RadixTree(parent, children, request, leaf_of, preorder, stats, depth_tokens)


def lexicographic_order(
    prompts: Sequence[TokenArray], sizes: Sequence[int]
) -> tuple[list[int], list[int]]:
    """The requests with their prompts in lexicographic order (stable: identical prompts keep
    their arrival order), and for each the tokens it shares with the one before it (0 first).

    Whole batches are handled at once in numpy, never one prompt per Python step where it can
    be helped: every prompt's first 16 tokens go into one zero-padded matrix of big-endian words
    with the prompt's length (up to 16) as its last column, so a row's bytes (compared with
    memcmp, as numpy compares raw rows) order the prompts by those tokens and a prompt before
    its own extensions; one stable argsort orders them, and neighbour rows are compared in one
    pass. Most prompts differ within those first tokens; only the runs of neighbours that tie
    on all 16 are compared on their whole prompts, so the memory this streams stays close to
    the tokens that are actually shared.
    """
    n = len(prompts)
    if n < 2:  # a lone request's batch, the most common one below saturation: nothing to sort
        return list(range(n)), [0] * n
    lengths = np.array(sizes, dtype=np.int64)
    head_lengths = np.minimum(lengths, _SHORT_TOKENS)
    heads = np.zeros((n, _SHORT_TOKENS + 1), dtype=">u8")
    # Row-major boolean assignment fills each row's first head_lengths[i] cells in turn.
    # Validated ids lie in [0, 2**63), so the unsafe cast to uint64 is exact for every dtype
    # (and keeps int64 and uint64 prompts from being promoted together to float64).
    heads[np.arange(_SHORT_TOKENS + 1) < head_lengths[:, None]] = np.concatenate(
        [prompt[:_SHORT_TOKENS] for prompt in prompts], dtype=np.uint64, casting="unsafe"
    )
    heads[:, _SHORT_TOKENS] = head_lengths
    # Stable: identical prompts keep their arrival order.
    order = np.argsort(_rows(heads), kind="stable")
    heads, lengths = heads[order, :_SHORT_TOKENS], lengths[order]
    shared = np.zeros(n, dtype=np.int64)
    shared[1:] = np.minimum(
        _first_difference(heads[1:], heads[:-1]), np.minimum(lengths[1:], lengths[:-1])
    )
    tied = np.flatnonzero(shared == _SHORT_TOKENS)
    if tied.size:
        _order_ties(prompts, order, lengths, shared, tied)
    return order.tolist(), shared.tolist()


def _rows(matrix: npt.NDArray[Any]) -> npt.NDArray[np.void]:
    """A C-contiguous matrix's rows as raw byte strings, which numpy compares with memcmp."""
    return matrix.view(np.dtype((np.void, matrix.itemsize * matrix.shape[1]))).ravel()


def _first_difference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
    """Per row pair, the first column where `a` and `b` differ, or the width when none does."""
    if a.shape[1] == 0:
        return np.zeros(a.shape[0], dtype=np.intp)
    differs: npt.NDArray[np.bool_] = a != b
    first: npt.NDArray[np.intp] = np.where(differs.any(axis=1), differs.argmax(axis=1), a.shape[1])
    return first


def _order_ties(
    prompts: Sequence[TokenArray],
    order: npt.NDArray[np.intp],
    lengths: npt.NDArray[np.int64],
    shared: npt.NDArray[np.int64],
    tied: npt.NDArray[np.intp],
) -> None:
    """Sort, in place, the runs of neighbours in `order` that tie on their first 16 tokens by
    their whole prompts, and set the tokens shared inside each run.

    `tied` holds the places whose prompt ties with the one before. The runs' tails (the tokens
    after the first 16) go into one matrix laid out as the heads' matrix is, so the rows' byte
    order is again the tails' lexicographic order, a tail before its own extensions.
    """
    is_tied = np.zeros(order.size + 1, dtype=bool)
    is_tied[tied] = True
    # A run is a place that does not tie with its predecessor followed by places that do.
    starts = np.flatnonzero(is_tied[1:] & ~is_tied[:-1])
    ends = np.flatnonzero(is_tied[:-1] & ~is_tied[1:]) + 1
    places = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends, strict=True)])
    members = order[places]
    tails = lengths[places] - _SHORT_TOKENS
    width = max(int(tails.max()), 0)
    # Ids below 2**32 fit 4-byte words, which halves the matrix: decided by the dtype where it
    # can be, else by the values.
    narrow = all(
        prompts[i].dtype.itemsize <= 4 or prompts[i].size == 0 or prompts[i].max() < 2**32
        for i in members.tolist()
    )
    matrix = np.zeros((places.size, width + 1), dtype=">u4" if narrow else ">u8")
    for row, (i, tail) in enumerate(zip(members.tolist(), tails.tolist(), strict=True)):
        matrix[row, :tail] = prompts[i][_SHORT_TOKENS:]
    matrix[:, width] = tails
    rows = _rows(matrix)
    permutation = np.empty(places.size, dtype=np.intp)
    first = 0
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        last = first + end - start
        # Stable, so identical prompts keep their arrival order.
        permutation[first:last] = first + np.argsort(rows[first:last], kind="stable")
        first = last
    order[places] = members[permutation]
    matrix, tails = matrix[permutation], tails[permutation]
    # Places that tie with their predecessor are never a run's first, so their predecessor
    # (the row before) belongs to the same run.
    inside = is_tied[places]
    within = _SHORT_TOKENS + np.minimum(
        _first_difference(matrix[1:, :width], matrix[:-1, :width]),
        np.minimum(tails[1:], tails[:-1]),
    )
    shared[places[inside]] = within[inside[1:]]


def _preorder(children: list[list[int]]) -> list[int]:
    order: list[int] = []
    pending = [ROOT]
    while pending:
        node = pending.pop()
        order.append(node)
        pending.extend(children[node])
    return order


def _stats(
    sizes: list[int],
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
        requests=len(sizes),
        nodes=len(radix_nodes),
        depth=max(level, default=0),
        total_tokens=sum(sizes),
        unique_tokens=unique,
    )
