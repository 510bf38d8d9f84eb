"""`GET /v1/market/rule`: the pricing rule every batch of this deployment is cleared under
(docs/SPEC.md section 5), so that a bidder knows what a bid buys before placing it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from inference_auctions.server.api.deps import CurrentUser, State

router = APIRouter(prefix="/v1", tags=["market"])


@router.get("/market/rule", summary="The pricing rule batches are cleared under")
async def rule(_: CurrentUser, state: State) -> dict[str, Any]:
    """`pricing_rule` (`fixed-slots` or `batch-size`), `priority_slots` (the K every batch is
    priced in; null under `batch-size`, where it is each batch's own size), `batch_size`, and
    `request_fee_micros`, what every request pays besides its VCG charge, zero bids included
    (held with the bid, given back when the request fails; 0: no fee)."""
    pricing = state.settings.auction_rule()
    return {
        "pricing_rule": pricing.name,
        "priority_slots": pricing.slots,
        "batch_size": state.settings.batch_size,
        "request_fee_micros": pricing.request_fee_micros,
    }
