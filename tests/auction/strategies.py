"""Hypothesis strategies for batches with heavy prefix sharing, ties and repeated users."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import strategies as st

from inference_auctions.server.auction import AuctionRequest

# A tiny alphabet and short prompts make shared prefixes, identical prompts and prompts that
# are prefixes of others the common case rather than the rare one.
_PROMPT = st.lists(st.integers(min_value=0, max_value=2), max_size=5)
_BID = st.one_of(
    st.sampled_from([0, 0, 1, 2, 3, 6]),  # ties and zero bids
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=10**12, max_value=10**15),  # large enough to break float averages
)
_USER = st.sampled_from(["alice", "bob", "carol", "dave"])


# Prompts reach the core as lists (tests, old callers) or as arrays of whatever integer dtype the
# tokenizer gave; one batch mixes them, so int64 next to uint64 and narrow next to wide are met.
_DTYPES = [np.int64, np.int32, np.uint64, np.uint32, np.uint16, np.uint8, np.int16]


@st.composite
def token_ids(draw: st.DrawFn, tokens: Sequence[int]) -> Sequence[int] | np.ndarray:
    """`tokens` as a list or as a 1-D array of an integer dtype that holds every id."""
    fits = [dtype for dtype in _DTYPES if all(token <= np.iinfo(dtype).max for token in tokens)]
    dtype = draw(st.sampled_from([None, *fits]))
    return list(tokens) if dtype is None else np.array(tokens, dtype=dtype)


@st.composite
def batches(draw: st.DrawFn, max_size: int = 12) -> list[AuctionRequest]:
    """A batch of requests with shared prefixes, ties and users with several requests."""
    size = draw(st.integers(min_value=0, max_value=max_size))
    return [
        AuctionRequest(
            rid=f"r{index}", user=draw(_USER), tokens=draw(token_ids(draw(_PROMPT))), bid=draw(_BID)
        )
        for index in range(size)
    ]


@st.composite
def tied_batches(draw: st.DrawFn, max_size: int = 12) -> list[AuctionRequest]:
    """A batch whose averages tie all the time: bids of 0 to 3, a few users, tiny prompts, so
    the schedule's tie rule (earliest arrival first) decides many of its orders."""
    size = draw(st.integers(min_value=0, max_value=max_size))
    return [
        AuctionRequest(
            rid=f"r{index}",
            user=draw(st.sampled_from(["alice", "bob", "carol"])),
            tokens=draw(st.lists(st.integers(min_value=0, max_value=1), max_size=3)),
            bid=draw(st.integers(min_value=0, max_value=3)),
        )
        for index in range(size)
    ]


# Blocks of 12 tokens: prompts made of them share prefixes that end before, at and beyond
# the first 16 tokens, where the tree build switches from short sort keys to whole prompts.
_BLOCKS = [list(range(b * 100, b * 100 + 12)) for b in range(3)]
_LONG_PROMPT = st.builds(
    lambda blocks, tail: [t for b in blocks for t in _BLOCKS[b]] + tail,
    st.lists(st.integers(min_value=0, max_value=2), max_size=4),
    # Ids past 32 bits (packed in 8-byte words) and at the very top of what is accepted.
    st.lists(
        st.one_of(
            st.integers(min_value=0, max_value=2**40),
            st.sampled_from([2**32 - 1, 2**32, 2**63 - 1]),
        ),
        max_size=3,
    ),
)


@st.composite
def long_batches(draw: st.DrawFn, max_size: int = 20) -> list[AuctionRequest]:
    """A batch of prompts up to ~50 tokens long that share long prefixes."""
    size = draw(st.integers(min_value=0, max_value=max_size))
    return [
        AuctionRequest(
            rid=f"r{index}",
            user=draw(_USER),
            tokens=draw(token_ids(draw(_LONG_PROMPT))),
            bid=draw(_BID),
        )
        for index in range(size)
    ]


@st.composite
def misreports(draw: st.DrawFn, batch: list[AuctionRequest], user: str) -> list[AuctionRequest]:
    """The same batch with `user`'s bids replaced by arbitrary other bids."""
    return [
        AuctionRequest(r.rid, r.user, r.tokens, draw(_BID)) if r.user == user else r for r in batch
    ]
