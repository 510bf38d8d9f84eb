"""The auction core: the batch and its radix tree, the average-bid DFS order, exact fast VCG.

Pure functions of their input: no I/O, no clock, no async. Everything else calls `run_auction`.
One batch goes through three modules, in this order:

* `batch`: the requests, validated, and the radix tree of their prompts;
* `schedule`: the average-bid DFS, the order the batch is served in;
* `charges`: the pricing rule, `run_auction` and its `AuctionOutcome`, the VCG payments, and
  the same charges priced again with bids zeroed (failure refunds, per-request shares).

Beside them: `errors` (what the core raises), `fixed_price` (clearing the fixed-price modes,
which run no auction) and `reference` (slow, obviously correct oracles for the tests).
"""

from inference_auctions.server.auction.batch import AuctionRequest, TreeStats
from inference_auctions.server.auction.charges import AuctionOutcome, run_auction
from inference_auctions.server.auction.errors import AuctionInputError

__all__ = ["AuctionInputError", "AuctionOutcome", "AuctionRequest", "TreeStats", "run_auction"]
