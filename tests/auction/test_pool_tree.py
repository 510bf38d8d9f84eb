"""The pool's tree kept one request at a time orders and prices as the tree built anew."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_auctions.server.auction import AuctionRequest
from inference_auctions.server.auction.pool_tree import PoolTree
from inference_auctions.server.auction.rolling import order_pool, rolling_charges

# Tiny alphabets and short prompts: shared prefixes, identical prompts, prompts that are
# prefixes of others, and splits deep inside edges are the common case.
_PROMPT = st.lists(st.integers(min_value=0, max_value=2), max_size=6)
_BID = st.one_of(st.sampled_from([1, 2, 3, 6]), st.integers(min_value=1, max_value=10**12))
_USER = st.sampled_from(["alice", "bob", "carol"])

# A step: join with (prompt, bid, user), or leave (which of the requests in the pool).
_STEP = st.one_of(
    st.tuples(st.just("join"), _PROMPT, _BID, _USER),
    st.tuples(st.just("leave"), st.integers(min_value=0, max_value=100)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_STEP, max_size=30), st.data())
def test_kept_tree_orders_and_prices_as_a_tree_built_anew(
    steps: list[tuple[object, ...]], data: st.DataObject
) -> None:
    tree = PoolTree()
    pool: list[AuctionRequest] = []  # what is in the tree, in arrival order
    made = 0
    for step in steps:
        if step[0] == "join":
            _, prompt, bid, user = step
            assert isinstance(prompt, list) and isinstance(bid, int) and isinstance(user, str)
            tokens = np.array(prompt, dtype=np.int64)
            rid = f"r{made}"
            tree.insert(rid, user, tokens, bid, arrival=made)
            pool.append(AuctionRequest(rid, user, tokens, bid))
            made += 1
        elif pool:
            index = step[1]
            assert isinstance(index, int)
            tree.remove(pool.pop(index % len(pool)).rid)
        assert len(tree) == len(pool)
        fresh = order_pool(pool)
        clearing = tree.clearing()
        assert list(clearing.service_order()) == [pool[i].rid for i in fresh.order]
        head = data.draw(st.sets(st.sampled_from([r.rid for r in pool]))) if pool else set()
        indexes = [i for i, r in enumerate(pool) if r.rid in head]
        slots = data.draw(st.sampled_from([2, 8, 64]))
        assert clearing.charges(sorted(head), slots) == rolling_charges(fresh, indexes, slots)
    for request in pool:
        tree.remove(request.rid)
    assert len(tree) == 0 and list(tree.clearing().service_order()) == []


def test_a_head_is_taken_without_ordering_the_whole_pool() -> None:
    tree = PoolTree()
    for index in range(200):
        tree.insert(f"r{index}", "u", np.array([index, 1, 2], dtype=np.int64), 1 + index, index)
    clearing = tree.clearing()
    order = clearing.service_order()
    assert [next(order) for _ in range(3)] == ["r199", "r198", "r197"]


def test_refuses_a_zero_bid_and_a_second_insert() -> None:
    tree = PoolTree()
    with pytest.raises(ValueError, match="positive bids"):
        tree.insert("r", "u", np.array([1]), 0, 0)
    tree.insert("r", "u", np.array([1]), 5, 0)
    with pytest.raises(ValueError, match="already in the pool"):
        tree.insert("r", "u", np.array([1]), 5, 1)
