"""One request's bid reservation, from the moment it is placed until its outcome is known."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._exceptions import APIConnectionError, APIStatusError, StreamError
from ._models import Auction
from ._pacing import PacingBidder

__all__ = ["Settlement"]


class Settlement:
    """Settles exactly once: a charge, a release, or a conservative guess when unsure."""

    def __init__(
        self,
        bidder: PacingBidder,
        *,
        rid: str,
        reserved: int,
        on_change: Callable[[], None],
    ) -> None:
        self.rid = rid
        self.reserved = reserved
        self._bidder = bidder
        self._on_change = on_change
        self._lock = threading.Lock()
        self._done = False
        self._batch_id: str | None = None

    def charged(self, auction: Auction) -> None:
        """The batch cleared: record its charge and free the reservation."""
        if self._finish():
            self._batch_id = auction.batch_id
            # Count each request's share when the server splits the charge; otherwise the
            # batch charge, once per batch: never the batch charge once per request.
            per_request = auction.per_request_charges
            charge = (
                auction.request_charge_micros if per_request else auction.user_batch_charge_micros
            )
            # The request's fee and its part of a posted floor are spent too (a server with
            # either splits charges per request).
            charge += auction.request_fee_micros + auction.floor_micros
            self._bidder.set_request_fee(auction.request_fee_micros)
            self._bidder.settle(
                auction.batch_id,
                charge,
                reserved=self.reserved,
                rid=self.rid,
                per_request=per_request,
            )
            self._on_change()

    def unknown(self) -> None:
        """The request may have been charged but the charge is unknown: assume the whole bid."""
        if self._finish():
            self._bidder.settle_unknown(self.reserved)
            self._on_change()

    def fail(self, exc: BaseException) -> None:
        """Settle after `exc` ended the request, as far as the error tells what was charged."""
        if isinstance(exc, StreamError):
            # Errors after the stream started are engine failures, which the server refunds.
            if self._batch_id is not None:
                self._bidder.refund(self._batch_id, self.rid)
                self._on_change()
            elif self._finish():
                self._bidder.release(self.reserved)
        elif isinstance(exc, APIStatusError) or (
            isinstance(exc, APIConnectionError) and not exc.may_have_been_processed
        ):
            # The server refused or failed the request, and failed requests are not charged.
            if self._finish():
                self._bidder.release(self.reserved)
        else:
            self.unknown()

    def _finish(self) -> bool:
        with self._lock:
            first = not self._done
            self._done = True
            return first
