"""Errors raised by the auction core.

ValueError
 └── AuctionInputError   a request of the batch is malformed (names the request and field)
"""

from __future__ import annotations


class AuctionInputError(ValueError):
    """A request in the batch is malformed; the message names the request and the problem."""

    def __init__(self, rid: object, field: str, problem: str) -> None:
        self.rid = rid
        self.field = field
        self.problem = problem
        super().__init__(f"request {rid!r}: {field} {problem}")
