"""The auction core: radix tree, average-bid DFS schedule and exact fast VCG payments.

Pure functions of their input: no I/O, no clock, no async. Everything else calls `run_auction`.
"""

from inference_auctions.server.auction.errors import AuctionInputError
from inference_auctions.server.auction.mechanism import AuctionOutcome, run_auction
from inference_auctions.server.auction.request import AuctionRequest
from inference_auctions.server.auction.tree import TreeStats

__all__ = ["AuctionInputError", "AuctionOutcome", "AuctionRequest", "TreeStats", "run_auction"]
