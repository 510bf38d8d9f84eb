"""The exact (fractional) VCG payments of a batch, by the fast path that `run_auction` rounds."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from inference_auctions.server.auction.payments import vcg_payment_numerators
from inference_auctions.server.auction.request import AuctionRequest, validate_batch
from inference_auctions.server.auction.schedule import average_bid_dfs
from inference_auctions.server.auction.tree import build_radix_tree


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
