"""The batch as the auction takes it (`server.auction.batch`): every request checked, naming the
request and the field it refuses, token arrays of any integer dtype used as they are, and the
radix tree of the prompts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from inference_auctions.server.auction import AuctionInputError, AuctionRequest, run_auction
from inference_auctions.server.auction.batch import validate_batch
from inference_auctions.server.auction.reference import reference_payments
from tests.auction.exact import exact_payments


def test_numpy_token_arrays_and_empty_prompts_are_accepted() -> None:
    batch = [
        AuctionRequest("r1", "a", np.array([4, 5, 6], dtype=np.int32), 3),
        AuctionRequest("r2", "b", [], 5),
        AuctionRequest("r3", "c", np.array([4, 5], dtype=np.uint16), 4),
    ]
    assert run_auction(batch).order == ["r2", "r3", "r1"]


@pytest.mark.parametrize(
    ("bid", "problem"),
    [
        (-1, "must be >= 0"),
        (math.nan, "must be an int"),
        (2.5, "must be an int"),
        (1.0, "must be an int"),
        (True, "must be an int"),
        ("5", "must be an int"),
        (None, "must be an int"),
    ],
)
def test_bad_bids_are_refused_naming_the_request(bid: object, problem: str) -> None:
    batch = [AuctionRequest("good", "a", [1], 1), AuctionRequest("bad", "b", [1], bid)]  # type: ignore[arg-type]
    with pytest.raises(AuctionInputError, match=rf"request 'bad': bid {problem}"):
        run_auction(batch)


@pytest.mark.parametrize(
    ("tokens", "problem"),
    [
        ([1, 2.5], "must all be ints"),
        ([1, None], "must all be ints"),
        (["a"], "must all be ints"),
        ("hello", "not text"),
        ([[1, 2], [3]], "flat sequence of ints"),
        ([[1, 2], [3, 4]], "flat sequence"),
        ([1, -3], "non-negative"),
        ([2**70], "flat sequence of ints|must all be ints"),
        (5, "flat sequence"),
    ],
)
def test_bad_tokens_are_refused_naming_the_request(tokens: object, problem: str) -> None:
    with pytest.raises(AuctionInputError, match=rf"request 'bad': tokens .*({problem})"):
        run_auction([AuctionRequest("bad", "a", tokens, 1)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tokens", "problem"),
    [
        (np.array([1.0, 2.0]), "must all be ints, found float64 values"),
        (np.array([True, False]), "must all be ints, found bool values"),
        (np.array([1, None]), "must all be ints, found object values"),
        (np.array(["1", "2"]), "must all be ints, found <U1 values"),
        (
            np.array([[1, 2], [3, 4]], dtype=np.int32),
            "must be a flat sequence of ints, got 2 dimensions",
        ),
        (np.array(7, dtype=np.int64), "must be a flat sequence of ints, got 0 dimensions"),
        (np.array([5, -1], dtype=np.int32), "must be non-negative token ids"),
        (np.array([-(2**63)], dtype=np.int64), "must be non-negative token ids"),
        (np.array([-1], dtype=np.int8), "must be non-negative token ids"),
        (np.array([1, 2**63], dtype=np.uint64), "must fit in a signed 64-bit int"),
        (np.array([2**64 - 1], dtype=np.uint64), "must fit in a signed 64-bit int"),
    ],
)
def test_bad_token_arrays_are_refused_as_lists_are(tokens: object, problem: str) -> None:
    with pytest.raises(AuctionInputError, match=rf"request 'bad': tokens {problem}"):
        run_auction([AuctionRequest("good", "a", [1], 1), AuctionRequest("bad", "b", tokens, 1)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "dtype", [np.int64, np.int32, np.int16, np.uint64, np.uint32, np.uint16, np.uint8]
)
def test_valid_token_arrays_are_used_as_they_are(dtype: type[np.integer[Any]]) -> None:
    tokens = np.array([3, 0, np.iinfo(dtype).max], dtype=dtype)
    if dtype == np.uint64:  # the largest id accepted is the largest int64
        tokens[2] = 2**63 - 1
    batch = validate_batch([AuctionRequest("r1", "a", tokens, 1)])
    # Neither copied nor converted: the server hands its arrays over as they are.
    assert batch.prompts[0] is tokens


def test_arrays_of_any_dtype_order_like_the_same_lists() -> None:
    top = 2**63 - 1
    prompts = [[top, 1], [2**32, 5], [2**32 - 1, 9], [top], [7] * 20 + [top], [7] * 20 + [0]]
    as_lists = [AuctionRequest(f"r{i}", f"u{i}", p, 10 + i) for i, p in enumerate(prompts)]
    as_arrays = [
        AuctionRequest(r.rid, r.user, np.array(r.tokens, dtype=dtype), r.bid)
        for r, dtype in zip(
            as_lists, [np.uint64, np.int64, np.uint32, np.int64, np.uint64, np.int64], strict=True
        )
    ]
    assert run_auction(as_arrays) == run_auction(as_lists)
    # Big ids compared as numbers, not as wrapped or truncated words.
    assert run_auction(as_arrays).tree.unique_tokens == 2 + 2 + 2 + 0 + 21 + 1


def test_duplicate_rids_and_bad_ids_are_refused() -> None:
    with pytest.raises(AuctionInputError, match="request 'x': rid is a duplicate"):
        run_auction([AuctionRequest("x", "a", [1], 1), AuctionRequest("x", "b", [2], 1)])
    with pytest.raises(AuctionInputError, match="user must be a non-empty string"):
        run_auction([AuctionRequest("x", "", [1], 1)])
    with pytest.raises(AuctionInputError, match="rid must be a non-empty string"):
        run_auction([AuctionRequest("", "a", [1], 1)])
    with pytest.raises(ValueError, match="must be an AuctionRequest"):
        run_auction([("x", "a", [1], 1)])  # type: ignore[list-item]


@pytest.mark.parametrize("shared", [3, 16, 40])
def test_a_prompt_between_two_copies_of_its_extension_by_id_zero(shared: int) -> None:
    # Zero-padded, `p` and `p + [0]` look alike; only their lengths tell them apart. Were they
    # left in arrival order, the second copy of `p + [0]` would open a second node for it.
    prefix = [7] * shared
    batch = [
        AuctionRequest("long1", "a", np.array([*prefix, 0], dtype=np.int32), 5),
        AuctionRequest("short", "b", np.array(prefix, dtype=np.int64), 1),
        AuctionRequest("long2", "c", [*prefix, 0], 3),
    ]
    outcome = run_auction(batch)
    assert (outcome.tree.nodes, outcome.tree.unique_tokens) == (2, shared + 1)
    assert outcome.order == ["long1", "long2", "short"]
    assert exact_payments(batch) == reference_payments(batch)
