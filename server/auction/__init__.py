"""The auction core: radix tree, average-bid DFS schedule and exact fast VCG payments.

Pure functions of their input: no I/O, no clock, no async. Everything else calls `run_auction`.
"""

from server.auction.errors import AuctionInputError
from server.auction.mechanism import AuctionOutcome, run_auction
from server.auction.request import AuctionRequest
from server.auction.tree import TreeStats

__all__ = ["AuctionInputError", "AuctionOutcome", "AuctionRequest", "TreeStats", "run_auction"]
