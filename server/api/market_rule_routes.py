"""`GET /v1/market/rule`: how this deployment sells priority (docs/SPEC.md section 5, and the
pricing modes), so that a client knows what a bid or a tier buys before sending one;
`GET /v1/market/pool`: the waiting pool as a bid would meet it (counts only, never others'
bids); `GET /v1/market/tiers`: the tiers sold under `--pricing tiers`, with what each recently
bought."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from inference_auctions.server.api.deps import CurrentUser, State
from inference_auctions.server.errors import NotFound

router = APIRouter(prefix="/v1", tags=["market"])


@router.get("/market/rule", summary="How batches are cleared and priced")
async def rule(_: CurrentUser, state: State) -> dict[str, Any]:
    """`pricing` (the mode: `auction`, `tiers` or `fcfs`), `pricing_rule` (`fixed-slots` or
    `batch-size` under `auction`; the mode's name otherwise), `priority_slots` (the K every
    batch is priced in; null under `batch-size`, where it is each batch's own size, and in the
    fixed-price modes), `batch_size`, and `request_fee_micros`, what every request pays besides
    its VCG charge, zero bids included (held with the bid, given back when the request fails;
    0: no fee; always 0 in the fixed-price modes). `price_floor`: `mode` (`off` or `posted`),
    `micros` (this replica's floor now; null when off) and `target` (the entrants it aims
    at; null when off)."""
    pricing = state.settings.auction_rule()
    floor = state.service.price_floor
    return {
        "pricing": state.settings.pricing,
        "pricing_rule": pricing.name,
        "priority_slots": pricing.slots,
        "batch_size": state.settings.batch_size,
        "request_fee_micros": pricing.request_fee_micros,
        "price_floor": {
            "mode": "off" if floor is None else "posted",
            "micros": None if floor is None else floor.micros,
            "target": None if floor is None else floor.target,
        },
    }


@router.get("/market/pool", summary="The waiting pool as a bid would meet it")
async def pool(
    _: CurrentUser,
    state: State,
    bid: Annotated[int | None, Query(ge=0, le=2**62, description="A bid, in micro-credits")] = None,
) -> dict[str, Any]:
    """`price_floor_micros` (the floor now; null when off), `entrants` (requests waiting in
    the auction: positive bids, at or above the floor when one is posted), `outside` (the
    others waiting: zero bids, and bids below the floor), `ahead` (the entrants a request
    bidding `bid` would not overtake: those bidding at least as much, or every entrant for a
    bid that would not enter, or when `bid` is not given; a count, never a bid) and
    `starts_per_second` (the engine's first tokens per second over the last 10 seconds on
    this replica, for an estimate of the wait). Counts are this replica's."""
    floor = state.service.price_floor
    minimum = 1 if floor is None else floor.entry
    bids = [ticket.bid_micros for ticket in state.service.waiting()]
    entrants = [waiting for waiting in bids if waiting >= minimum]
    if bid is None or bid < minimum:
        ahead = len(entrants)
    else:
        ahead = sum(1 for waiting in entrants if waiting >= bid)
    return {
        "price_floor_micros": None if floor is None else floor.micros,
        "entrants": len(entrants),
        "outside": len(bids) - len(entrants),
        "ahead": ahead,
        "starts_per_second": state.service.starts_per_second(),
    }


@router.get("/market/tiers", summary="The tiers sold, their prices and what they bought")
async def tiers(_: CurrentUser, state: State) -> dict[str, Any]:
    """Under `--pricing tiers` (404 otherwise): every tier, dearest first (served first), with
    `price_micros` per request; `expected_priority_ppm`, the mean over its last requests on
    this replica (`samples` of them) of the share of their competitors (the requests whose
    waits in the pool overlapped theirs) sent to the engine after them, in parts per million
    (1,000,000 for a request nobody waited beside; 0 samples: an even split of the pool by
    tier); and `recent_wait_ms`, the median wait of those requests from arrival to dispatch
    (null before any). `default_tier` is a request's tier when it names none."""
    menu = state.service.tier_menu
    if menu is None:
        raise NotFound(
            f"this server runs pricing {state.settings.pricing!r}, not tiers",
            param="pricing",
        )
    figures = state.service.tier_figures
    return {
        "default_tier": menu.default.name,
        "tiers": [
            {
                "name": tier.name,
                "price_micros": tier.price_micros,
                "rank": tier.rank,
                "expected_priority_ppm": figures.expected_priority_ppm(tier.name),
                "samples": figures.samples(tier.name),
                "recent_wait_ms": figures.recent_wait_ms(tier.name),
            }
            for tier in menu.tiers
        ],
    }
