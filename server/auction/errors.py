"""Errors raised by the auction core.

ValueError
 └── AuctionInputError   a request of the batch is malformed (names the request and field),
                         or the batch holds more requests than its rule's priority slots
"""

from __future__ import annotations


class AuctionInputError(ValueError):
    """A request in the batch is malformed; the message names the request and the problem."""

    def __init__(self, rid: object, field: str, problem: str) -> None:
        self.rid = rid
        self.field = field
        self.problem = problem
        super().__init__(f"request {rid!r}: {field} {problem}")

    @classmethod
    def too_many_requests(cls, size: int, slots: int) -> AuctionInputError:
        """A batch of `size` requests under a rule of fewer priority `slots`."""
        problem = f"is {size} requests, more than the rule's {slots} priority slots"
        return cls("batch", "size", problem)
