"""Why each user of a cleared batch pays what it pays: its VCG charge as the delay it imposes.

A user's VCG charge (docs/SPEC.md, section 1) is what the others lose because of its bids: the
others' welfare in the best schedule with the user's bids set to 0, minus their welfare in the
schedule chosen. Every other request that the user's bids push back loses the priority of the
places it moves down, and each place is worth its bid / (n - 1). This module clears the batch
again without each user's bids and lists those moves, so the charge can be read as a sum of
delays; the charge itself is the mechanism's (`run_auction`), never this module's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from inference_auctions.server.auction import AuctionOutcome, AuctionRequest, run_auction

__all__ = ["Delay", "UserStory", "explain"]


@dataclass(frozen=True, slots=True)
class Delay:
    """Another user's request that a user's bids push back, and what that costs its owner."""

    rid: str
    user: str
    bid_micros: int
    position: int  # in the schedule chosen
    position_without: int  # in the best schedule without the charged user's bids
    cost: Fraction  # bid * lost priority, in micro-credits

    @property
    def places(self) -> int:
        """How many places the request moves down."""
        return self.position - self.position_without


@dataclass(frozen=True, slots=True)
class UserStory:
    """One user's charge and the delays that make it up."""

    user: str
    charge_micros: int  # the mechanism's charge
    delays: list[Delay]

    @property
    def externality(self) -> Fraction:
        """The sum of the delays' costs: the charge before rounding down to whole micros."""
        return sum((delay.cost for delay in self.delays), Fraction(0))


def explain(requests: Sequence[AuctionRequest], outcome: AuctionOutcome) -> list[UserStory]:
    """Each user's charge in `outcome` (the auction of `requests`) as the delays it imposes."""
    stories = []
    for user in sorted(outcome.payments):
        without = run_auction([_zeroed(request, user) for request in requests])
        delays = []
        for rid in outcome.order:
            if outcome.users[rid] == user:
                continue
            lost = without.priority(rid) - outcome.priority(rid)
            if lost == 0:
                continue
            delays.append(
                Delay(
                    rid=rid,
                    user=outcome.users[rid],
                    bid_micros=outcome.bids[rid],
                    position=outcome.positions[rid],
                    position_without=without.positions[rid],
                    cost=outcome.bids[rid] * lost,
                )
            )
        stories.append(UserStory(user, outcome.payments[user], delays))
    return stories


def _zeroed(request: AuctionRequest, user: str) -> AuctionRequest:
    return replace(request, bid=0) if request.user == user else request
