"""The input of one auction: a request with its prompt tokens and its bid, and its validation."""

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


def validate_batch(requests: Sequence[AuctionRequest]) -> ValidatedBatch:
    """Check every request and return the batch in the shape the core works on."""
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
