"""The waiting pool's radix tree, kept as requests join and leave, and one clearing over it.

A rolling auction orders the whole pool at every engine opening (`server.auction.rolling`);
building the tree of a pool of a thousand long prompts from scratch costs tens of
milliseconds. `PoolTree` keeps it instead: a request's insertion walks (and splits) one path
of the compacted trie, its removal walks one path back, and each node keeps N (requests under
it), F (their bids) and the earliest arrival under it, as `schedule` defines them.

A clearing (`PoolTree.clearing`) reads the tree as it stands: the average-bid DFS is produced
lazily (`service_order`), sorting only the children of the nodes it enters, so taking a head of
h requests costs about h paths, not the pool; and the charges of the head
(`PoolClearing.charges`) run `PaymentContext`'s exact numerators on the same lazily ordered
nodes. Both equal what `rolling.order_pool` and `rolling.rolling_charges` compute from scratch
(the property tests compare them, and those with the brute-force oracle).

Nodes are ints; a request's leaf node id is also its index for the payment code, so its bid is
its leaf's F. A node left with no children is removed; a node left with a single child is not
merged back into it: it orders nothing and adds nothing to any payment.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from inference_auctions.server.auction.batch import NO_PARENT, ROOT, TokenArray
from inference_auctions.server.auction.charges import PaymentContext
from inference_auctions.server.auction.schedule import AverageBidKey

__all__ = ["PoolClearing", "PoolTree"]

_NO_ARRIVAL = 2**62


@dataclass(slots=True)
class _PooledRequest:
    rid: str
    user: str
    bid: int
    leaf: int


class PoolTree:
    """The radix tree of a pool of positive bids, changed one request at a time."""

    def __init__(self) -> None:
        self._parent: list[int] = [NO_PARENT]
        self._radix: list[dict[int, int]] = [{}]  # first token of the edge -> radix child
        self._kids: list[dict[int, None]] = [{}]  # radix children and leaves, as an ordered set
        self._edge: list[TokenArray] = [np.zeros(0, dtype=np.int64)]
        # Prompt tokens from the root to the node's end; a node's rank (`_Lookups.rank`) is
        # built from it, so a split, which moves no node's end, changes no rank.
        self._depth: list[int] = [0]
        self._leaf: list[bool] = [False]
        self.count: list[int] = [0]
        self.bid_sum: list[int] = [0]
        self.first: list[int] = [_NO_ARRIVAL]
        # Each node's children in the average-bid DFS's order, kept sorted as their sums change
        # (re-sorting a root of thousands of children at every clearing would cost more than
        # everything else), and the key each child was filed under.
        self.ordered: list[list[int]] = [[]]
        self._key: list[AverageBidKey | None] = [None]
        self._free: list[int] = []
        self._requests: dict[str, _PooledRequest] = {}
        self._by_leaf: dict[int, _PooledRequest] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, rid: object) -> bool:
        return rid in self._requests

    def rids(self) -> set[str]:
        """The requests in the tree."""
        return set(self._requests)

    def insert(self, rid: str, user: str, tokens: TokenArray, bid: int, arrival: int) -> None:
        """Add a request (a positive bid); `arrival` orders ties, earlier first."""
        if bid <= 0:
            raise ValueError("only positive bids enter the auction's pool")
        if rid in self._requests:
            raise ValueError(f"request {rid!r} is already in the pool")
        node, done, size = ROOT, 0, len(tokens)
        while done < size:
            token = int(tokens[done])
            child = self._radix[node].get(token)
            if child is None:
                child = self._new(node, tokens[done:], leaf=False)
                self._radix[node][token] = child
                node, done = child, size
                break
            edge = self._edge[child]
            common = _common_prefix(edge, tokens[done : done + len(edge)])
            if common < len(edge):
                child = self._split(node, child, common)
            node, done = child, done + common
        leaf = self._new(node, tokens[size:], leaf=True)
        request = _PooledRequest(rid, user, bid, leaf)
        self._requests[rid] = request
        self._by_leaf[leaf] = request
        up = leaf
        while up != NO_PARENT:
            self.count[up] += 1
            self.bid_sum[up] += bid
            self.first[up] = min(self.first[up], arrival)
            self._refile(up)
            up = self._parent[up]

    def remove(self, rid: str) -> None:
        """Take a request out (dispatched, withdrawn or no longer bidding)."""
        request = self._requests.pop(rid)
        del self._by_leaf[request.leaf]
        node = request.leaf
        arrival = self.first[node]
        up = self._parent[node]
        self._drop(node)
        while up != NO_PARENT:
            self.count[up] -= 1
            self.bid_sum[up] -= request.bid
            above = self._parent[up]
            if up != ROOT and not self._kids[up]:
                self._drop(up)
            else:
                # Only the earliest arrival under a node moves its `first`.
                if self.first[up] == arrival:
                    kids = self._kids[up]
                    self.first[up] = min((self.first[k] for k in kids), default=_NO_ARRIVAL)
                self._refile(up)
            up = above

    def clearing(self) -> PoolClearing:
        """The tree as it stands, ready to be ordered and priced (valid until it changes)."""
        return PoolClearing(self)

    def rid_of(self, leaf: int) -> str:
        return self._by_leaf[leaf].rid

    def user_of(self, leaf: int) -> str:
        return self._by_leaf[leaf].user

    def leaf_of(self, rid: str) -> int:
        return self._requests[rid].leaf

    def path(self, rid: str) -> list[int]:
        """The node ids from the root's child down to where the request's prompt ends: used as
        prompts, the paths of the pool build a tree of the same shape (what a clearing log
        records so that its charges can be priced again offline)."""
        path: list[int] = []
        node = self._parent[self._requests[rid].leaf]
        while node not in (ROOT, NO_PARENT):
            path.append(node)
            node = self._parent[node]
        path.reverse()
        return path

    def bid_of(self, rid: str) -> int:
        return self._requests[rid].bid

    def is_leaf(self, node: int) -> bool:
        return self._leaf[node]

    @property
    def parent(self) -> list[int]:
        return self._parent

    @property
    def depth(self) -> list[int]:
        return self._depth

    def position(self, node: int) -> int:
        """The node's place among its parent's children in the service order."""
        key = self._key[node]
        assert key is not None, "the root and detached nodes have no place"
        return bisect_left(self.ordered[self._parent[node]], key, key=self._filed_under)

    # The nodes

    def _refile(self, node: int) -> None:
        """File the node again among its parent's children, under its sums as they are now."""
        parent = self._parent[node]
        if parent == NO_PARENT:
            return
        siblings = self.ordered[parent]
        if self._key[node] is not None:
            del siblings[self.position(node)]
        key = AverageBidKey(self.bid_sum[node], self.count[node], self.first[node])
        self._key[node] = key
        siblings.insert(bisect_left(siblings, key, key=self._filed_under), node)

    def _filed_under(self, node: int) -> AverageBidKey:
        key = self._key[node]
        assert key is not None
        return key

    def _new(self, parent: int, edge: TokenArray, *, leaf: bool) -> int:
        depth = self._depth[parent] + len(edge)
        if self._free:
            node = self._free.pop()
            self._parent[node], self._edge[node], self._depth[node] = parent, edge, depth
            self._leaf[node] = leaf
            self._radix[node], self._kids[node] = {}, {}
            self.count[node], self.bid_sum[node], self.first[node] = 0, 0, _NO_ARRIVAL
            self.ordered[node], self._key[node] = [], None
        else:
            node = len(self._parent)
            self._parent.append(parent)
            self._edge.append(edge)
            self._depth.append(depth)
            self._leaf.append(leaf)
            self._radix.append({})
            self._kids.append({})
            self.count.append(0)
            self.bid_sum.append(0)
            self.first.append(_NO_ARRIVAL)
            self.ordered.append([])
            self._key.append(None)
        self._kids[parent][node] = None
        return node

    def _split(self, parent: int, child: int, at: int) -> int:
        """Put a node `at` tokens into the edge from `parent` to `child`; return it."""
        edge = self._edge[child]
        place = self.position(child)  # before the child moves under the middle
        middle = self._new(parent, edge[:at], leaf=False)
        self._radix[parent][int(edge[0])] = middle
        del self._kids[parent][child]
        self._edge[child] = edge[at:]
        self._parent[child] = middle
        self._radix[middle][int(edge[at])] = child
        self._kids[middle][child] = None
        self.count[middle] = self.count[child]
        self.bid_sum[middle] = self.bid_sum[child]
        self.first[middle] = self.first[child]
        # The middle takes the child's place (and key) among the parent's children.
        self.ordered[parent][place] = middle
        self._key[middle] = self._key[child]
        self.ordered[middle] = [child]
        return middle

    def _drop(self, node: int) -> None:
        parent = self._parent[node]
        if self._key[node] is not None:
            del self.ordered[parent][self.position(node)]
            self._key[node] = None
        del self._kids[parent][node]
        edge = self._edge[node]
        if not self._leaf[node] and len(edge):
            del self._radix[parent][int(edge[0])]
        self._parent[node] = NO_PARENT
        self._free.append(node)


def _common_prefix(edge: TokenArray, tokens: TokenArray) -> int:
    """How many first tokens `edge` and `tokens` share."""
    size = min(len(edge), len(tokens))
    differ = np.flatnonzero(edge[:size] != tokens[:size])
    return int(differ[0]) if differ.size else size


class _Positions:
    """Each node's place among its parent's children (`PoolTree.position`)."""

    def __init__(self, tree: PoolTree) -> None:
        self._tree = tree

    def __getitem__(self, node: int) -> int:
        return self._tree.position(node)


class _Ranks:
    """Deeper nodes rank higher; a leaf ranks just below the node it hangs from's children."""

    def __init__(self, tree: PoolTree) -> None:
        self._tree = tree

    def __getitem__(self, node: int) -> int:
        return 2 * self._tree.depth[node] + (1 if self._tree.is_leaf(node) else 0)


class _Identity:
    def __getitem__(self, index: int) -> int:
        return index


class PoolClearing:
    """One clearing of the pool: its service order, produced lazily, and the head's charges."""

    def __init__(self, tree: PoolTree) -> None:
        self._tree = tree
        self._pricing = PaymentContext.from_parts(
            parent=tree.parent,
            leaf_of=_Identity(),
            ordered_children=tree.ordered,
            position=_Positions(tree),
            rank=_Ranks(tree),
            count=tree.count,
            bid_sum=tree.bid_sum,
            first=tree.first,
        )

    def service_order(self) -> Iterator[str]:
        """The pool's rids in the average-bid DFS's order, first served first."""
        tree = self._tree
        pending = [ROOT]
        while pending:
            node = pending.pop()
            if tree.is_leaf(node):
                yield tree.rid_of(node)
            else:
                pending.extend(reversed(tree.ordered[node]))

    def pool(self) -> list[dict[str, object]]:
        """Every request of the pool as a clearing log records it, in arrival order: rid, user,
        bid, tree path."""
        tree = self._tree
        return [
            {
                "rid": rid,
                "user": tree.user_of(tree.leaf_of(rid)),
                "bid": tree.bid_of(rid),
                "path": tree.path(rid),
            }
            for rid in sorted(tree.rids(), key=lambda rid: tree.first[tree.leaf_of(rid)])
        ]

    def charges(self, dispatched: Sequence[str], slots: int) -> dict[str, int]:
        """Every dispatching user's rolling charge (`rolling.rolling_charges`)."""
        tree = self._tree
        by_user: dict[str, list[int]] = {}
        for rid in dispatched:
            leaf = tree.leaf_of(rid)
            by_user.setdefault(tree.user_of(leaf), []).append(leaf)
        denominator = max(slots - 1, 1)
        charges: dict[str, int] = {}
        for user, leaves in by_user.items():
            cap = sum(tree.bid_sum[leaf] for leaf in leaves)
            if len(tree) < 2:
                charges[user] = 0
                continue
            numerator = self._pricing.user_numerator(leaves, tree.bid_sum)
            charges[user] = min(numerator // denominator, cap)
        return charges
