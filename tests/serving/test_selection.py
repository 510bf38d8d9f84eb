"""What a rolling clearing takes of the waiting pool: the auction's head, the engine's step,
and free requests only while nothing that pays is at the engine."""

from __future__ import annotations

import numpy as np
import pytest

from inference_auctions.server.errors import InvalidRequest
from inference_auctions.server.serving.pool import EngineShares, Wakeup
from inference_auctions.server.serving.resident_prefixes import ResidentPrefixes
from inference_auctions.server.serving.selection import PoolSelector
from inference_auctions.server.serving.tickets import Ticket
from inference_auctions.server.settings import ServerSettings


def _ticket(rid: str, bid: int, user: str = "u", prompt: int = 10) -> Ticket:
    return Ticket(
        user=user,
        rid=rid,
        ledger_rid=f"{user}/{rid}",
        tokens=np.arange(prompt, dtype=np.int64) + 1000 * len(rid) + ord(rid[-1]),
        bid_micros=bid,
        sampling_params={"max_new_tokens": 4},
        fingerprint="",
    )


class _Engine:
    def __init__(self) -> None:
        self.paying = 0
        self.token_room: int | None = None


def _selector(engine: _Engine, **settings: object) -> PoolSelector:
    chosen = ServerSettings(max_inflight=64, **settings)  # type: ignore[arg-type]
    shares = EngineShares(chosen, Wakeup())
    return PoolSelector(
        chosen, shares, lambda: engine.token_room, paying_at_engine=lambda: engine.paying
    )


def _rids(waiting: list[Ticket], places: list[int]) -> list[str]:
    return [waiting[place].rid for place in places]


def test_the_head_is_the_highest_bids_whatever_their_arrival() -> None:
    engine = _Engine()
    select = _selector(engine)
    waiting = [_ticket(f"low{i}", 10, user=f"u{i}") for i in range(6)]
    waiting.append(_ticket("late-high", 1_000, user="h"))
    selection = select(waiting, 2)
    assert _rids(waiting, selection.places)[0] == "late-high"
    assert len(selection.places) == 2
    assert selection.context is not None and selection.context.order[0] == "h/late-high"


def test_the_head_stops_at_the_engine_s_prefill_budget() -> None:
    engine = _Engine()
    engine.token_room = 25  # two prompts of 10 fit, the third crosses it: taken, then stop
    select = _selector(engine)
    waiting = [_ticket(f"r{i}", 10 + i, user=f"u{i}") for i in range(6)]
    assert len(select(waiting, 10).places) == 3


@pytest.mark.parametrize("pricing", ["auction", "tiers"])
def test_free_requests_wait_while_paying_work_is_at_the_engine(pricing: str) -> None:
    engine = _Engine()
    select = _selector(engine, pricing=pricing, tiers="free=0,paid=0.001")
    paid = 1_000 if pricing == "tiers" else 50
    waiting = [_ticket("free", 0, user="f"), _ticket("paid", paid, user="p")]
    # A paying request goes; the free one does not go beside it.
    assert _rids(waiting, select(waiting, 8).places) == ["paid"]
    # Nothing new pays, but a paying request still runs: the free one waits.
    engine.paying = 1
    assert select(waiting[:1], 8).places == []
    # The engine has no paying work: the free one goes.
    engine.paying = 0
    assert _rids(waiting, select(waiting[:1], 8).places) == ["free"]


def test_shared_free_traffic_takes_what_the_bidders_leave() -> None:
    engine = _Engine()
    engine.paying = 3
    select = _selector(engine, free_traffic="shared")
    waiting = [_ticket("free", 0, user="f"), _ticket("paid", 50, user="p")]
    assert _rids(waiting, select(waiting, 8).places) == ["paid", "free"]


def test_fcfs_has_no_free_traffic_to_hold_back() -> None:
    engine = _Engine()
    engine.paying = 3
    select = _selector(engine, pricing="fcfs")
    waiting = [_ticket("a", 0, user="a"), _ticket("b", 0, user="b")]
    assert _rids(waiting, select(waiting, 8).places) == ["a", "b"]


def test_the_shares_count_the_tokens_an_engine_url_states() -> None:
    # No `engine_tokens` set, an engine URL: the engine's own `max_total_num_tokens` bounds
    # free traffic's share of its memory, once the engine has stated it.
    settings = ServerSettings(engine_url="http://127.0.0.1:1", zero_bid_share=0.5)
    stated: list[int | None] = [None]
    shares = EngineShares(settings, Wakeup(), learnt_tokens=lambda: stated[0])
    big = _ticket("big", 0, prompt=600)
    shares.check(big)  # nothing stated yet: slots only
    stated[0] = 1_000
    with pytest.raises(InvalidRequest, match="at most 500 tokens"):
        shares.check(big)


def _starving_pool(select: PoolSelector, clearings: int) -> int | None:
    """A shared document the engine already holds, 40 bids of 100 under it and one of 5,000;
    then, at every clearing, two requests under fresh prefixes bidding 600 each, while the
    engine starts two a clearing. The clearing at which the valuable request goes (None: not
    within `clearings`)."""
    document = np.arange(64, dtype=np.int64) + 50_000
    opener = Ticket(
        user="doc",
        rid="opener",
        ledger_rid="doc/opener",
        tokens=document,
        bid_micros=100,
        sampling_params={"max_new_tokens": 4},
        fingerprint="",
    )
    assert select([opener], 1).places == [0]  # the document goes: now it is cached

    def under_document(rid: str, bid: int, user: str) -> Ticket:
        question = np.array([60_000 + len(rid), ord(rid[-1]), bid], dtype=np.int64)
        return Ticket(
            user=user,
            rid=rid,
            ledger_rid=f"{user}/{rid}",
            tokens=np.concatenate((document, question)),
            bid_micros=bid,
            sampling_params={"max_new_tokens": 4},
            fingerprint="",
        )

    waiting = [under_document(f"q{n}", 100, f"doc{n}") for n in range(40)]
    waiting.append(under_document("valuable", 5_000, "v"))
    for clearing in range(clearings):
        waiting += [_ticket(f"s{clearing}x{n}", 600, user=f"s{clearing}x{n}") for n in range(2)]
        places = select(waiting, 2).places
        if "valuable" in _rids(waiting, places):
            return clearing
        waiting = [ticket for place, ticket in enumerate(waiting) if place not in places]
    return None


def test_a_valuable_request_under_a_cached_low_prefix_is_not_overtaken_for_ever() -> None:
    # Filed under the document, the valuable request would go only when the document's
    # average bid (about 220) beat the stream's 600: never while the stream lasts. The
    # document costs the engine no prefill once cached, so the request competes on its own.
    chosen = ServerSettings(max_inflight=64)
    resident = ResidentPrefixes()
    select = PoolSelector(chosen, EngineShares(chosen, Wakeup()), lambda: None, resident=resident)
    assert _starving_pool(select, 30) == 0


def test_without_the_engine_s_cache_known_the_stream_overtakes_the_whole_document() -> None:
    # The same pool with every prefix kept together: what the test above guards against.
    engine = _Engine()
    assert _starving_pool(_selector(engine), 30) is None
