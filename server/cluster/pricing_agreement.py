"""Replicas on one ledger sell priority the same way, or do not run together.

At start a replica announces its pricing (the mode, and the tiers it sells) in the ledger; if a
live replica announced another, it withdraws and refuses to start, naming the other replica
(`PricingDisagreement`). While it runs it renews its announcement every `RENEW_SECONDS`; an
announcement not renewed for `LIVE_SECONDS` is a replica gone. Each process announces under a
name of its own (the replica's name and a random suffix), so two replicas given one name are
still told apart.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from inference_auctions.billing import Ledger
from inference_auctions.server.cluster.replica import replica_name
from inference_auctions.server.settings import ServerSettings

__all__ = ["LIVE_SECONDS", "PricingAgreement", "PricingDisagreement"]

log = logging.getLogger(__name__)

LIVE_SECONDS = 30.0
RENEW_SECONDS = 10.0


class PricingDisagreement(RuntimeError):
    """A live replica on the same ledger runs another pricing: this one must not start."""


class PricingAgreement:
    """This replica's announcement: made at start, renewed while it runs, withdrawn at stop."""

    def __init__(self, ledger: Ledger, settings: ServerSettings) -> None:
        self._ledger = ledger
        self._signature = settings.pricing_signature()
        self._name = f"{replica_name(settings)[:110]}#{secrets.token_hex(4)}"
        self._renewing: asyncio.Task[None] | None = None

    async def join(self) -> None:
        """Announce; raise `PricingDisagreement` if a live replica announced another."""
        others = await asyncio.to_thread(
            self._ledger.announce_pricing, self._name, self._signature, LIVE_SECONDS
        )
        if others:
            await asyncio.to_thread(self._ledger.withdraw_pricing, self._name)
            listed = "; ".join(f"{o.replica.rsplit('#', 1)[0]} runs {o.signature}" for o in others)
            raise PricingDisagreement(
                f"this replica's pricing ({self._signature}) differs from that of replicas "
                f"live on the same ledger ({listed}): every replica must run the same pricing "
                f"mode and tiers; stop them first (an announcement lapses {LIVE_SECONDS:.0f} s "
                "after its replica stops renewing it)"
            )
        self._renewing = asyncio.create_task(self._renew(), name="pricing-agreement")

    async def leave(self) -> None:
        """Stop renewing and withdraw the announcement."""
        if self._renewing is not None:
            self._renewing.cancel()
            await asyncio.gather(self._renewing, return_exceptions=True)
        try:
            await asyncio.to_thread(self._ledger.withdraw_pricing, self._name)
        except Exception as error:  # it lapses by itself
            log.warning("withdrawing this replica's pricing failed: %s", error)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(RENEW_SECONDS)
            try:
                others = await asyncio.to_thread(
                    self._ledger.announce_pricing, self._name, self._signature, LIVE_SECONDS
                )
            except Exception as error:  # a ledger outage: the next renewal tries again
                log.warning("renewing this replica's pricing failed: %s", error)
                continue
            for other in others:  # started while this one's announcement had lapsed
                log.error(
                    "replica %s on the same ledger runs pricing %s, this one %s",
                    other.replica,
                    other.signature,
                    self._signature,
                )
