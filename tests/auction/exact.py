"""The exact (fractional) VCG payments of a batch, by the fast path that `run_auction` rounds,
and a cleared batch's order as indexes into the batch, as the oracles give it."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from inference_auctions.server.auction.batch import AuctionRequest, build_radix_tree, validate_batch
from inference_auctions.server.auction.charges import AuctionOutcome, vcg_payment_numerators
from inference_auctions.server.auction.schedule import average_bid_dfs


def exact_payments(requests: Sequence[AuctionRequest]) -> dict[str, Fraction]:
    """Each user's payment before `run_auction` rounds it down to whole micro-credits."""
    batch = validate_batch(requests)
    if not batch.rids:
        return {}
    tree = build_radix_tree(batch.prompts)
    schedule = average_bid_dfs(tree, batch.bids)
    numerators = vcg_payment_numerators(tree, schedule, batch.bids, batch.users)
    denominator = max(len(batch.rids) - 1, 1)
    return {user: Fraction(value, denominator) for user, value in numerators.items()}


def served_indexes(outcome: AuctionOutcome, batch: list[AuctionRequest]) -> list[int]:
    """The outcome's order as indexes into `batch`: what `reference_order` returns."""
    where = {request.rid: index for index, request in enumerate(batch)}
    return [where[rid] for rid in outcome.order]
