"""The pricing rule a batch is cleared under: how many priority slots a delay is measured in,
and the fee every request pays (docs/SPEC.md, "Fixed priority slots and the request fee").

`batch-size` is the rule of the paper: the request at 0-based position k of a batch of n gets
priority (n-1-k)/(n-1), so every slot of delay is worth 1/(n-1) of a bid, and n zero-bid
requests with fresh prompts divide every charge in the batch. `fixed-slots` measures every
batch against the same K slots, K >= n: priority (K-1-k)/(K-1). The schedule is the same (the
two welfares differ by a term no order changes), and so are the VCG numerators; only the
denominator is K-1 instead of n-1, so requests that add nothing to anyone's delay lower no
charge. The fee is a flat amount per request, zero bids included, on top of the VCG charge:
what makes a decoy request cost its sender.

The two other pricing modes of a server record their own names: `tiers` (each request pays its
tier's fixed price, dearer tiers first) and `fcfs` (arrival order, nothing charged); they are
cleared by `fixed_price`, not by the auction, and their batches' priorities are measured in the
batch's own size, for display.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inference_auctions.server.auction.errors import AuctionInputError

RuleName = Literal["batch-size", "fixed-slots", "tiers", "fcfs"]
Mode = Literal["auction", "tiers", "fcfs"]
# The rule of every batch cleared before the rule was recorded with each batch.
BATCH_SIZE: RuleName = "batch-size"
FIXED_SLOTS: RuleName = "fixed-slots"
# The rules of the fixed-price modes (`fixed_price`): a request pays the price it was admitted
# at (its tier's, or nothing).
FIXED_PRICE_RULES: frozenset[str] = frozenset({"tiers", "fcfs"})


@dataclass(frozen=True, slots=True)
class PricingRule:
    """`slots`: the K a delay is measured in (None: the batch's own size, the `batch-size`
    rule); `request_fee_micros`: what every request of the batch pays besides its VCG charge;
    `mode`: `auction`, or one of the fixed-price modes (`tiers`, `fcfs`), which have neither."""

    slots: int | None = None
    request_fee_micros: int = 0
    mode: Mode = "auction"

    def __post_init__(self) -> None:
        if self.mode != "auction" and (self.slots is not None or self.request_fee_micros):
            raise ValueError(f"the {self.mode} mode has no priority slots and no request fee")
        if self.slots is not None and (type(self.slots) is not int or self.slots < 1):
            raise ValueError(f"priority slots must be a whole number >= 1, got {self.slots!r}")
        fee = self.request_fee_micros
        if type(fee) is not int or fee < 0:
            raise ValueError(f"the request fee must be whole micro-credits >= 0, got {fee!r}")

    @property
    def name(self) -> RuleName:
        """`batch-size`, `fixed-slots`, `tiers` or `fcfs`: what the ledger records with each
        batch."""
        if self.mode != "auction":
            return self.mode
        return BATCH_SIZE if self.slots is None else FIXED_SLOTS

    @property
    def fixed_price(self) -> bool:
        """Whether a request pays the price it was admitted at (`tiers`, `fcfs`)."""
        return self.mode != "auction"

    def slot_count(self, size: int) -> int:
        """The K of a batch of `size` requests; a batch may not hold more requests than K."""
        if self.slots is None:
            return size
        if size > self.slots:
            raise AuctionInputError(
                "batch",
                "size",
                f"is {size} requests, more than the rule's {self.slots} priority slots",
            )
        return self.slots

    def denominator(self, size: int) -> int:
        """K - 1 (at least 1): every exact payment is a whole numerator over it."""
        return max(self.slot_count(size) - 1, 1)


# The default of `run_auction`: the paper's rule, no fee.
PAPER_RULE = PricingRule()
