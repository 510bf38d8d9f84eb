"""The SDK against a real server (`inference-auction serve`, emulated engine, SQLite ledger).

One point of the SDK's contract per test: request ids, one rid, one sign convention, Decimal
accessors, finish reasons, per-call options, raw responses, logging of retries, models and
completions, closed clients, pacing against the server's budget period, the budget running
out, and recent clearing prices.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import pytest

from inference_auctions import sdk
from inference_auctions.sdk import AsyncAuctionClient, AuctionClient, Budget
from tests.processes import free_port

from .live_server import LiveServer

PLAN = Budget(total="100", auctions=1000)


def _client(live: LiveServer, key: str, **kwargs: object) -> AuctionClient:
    kwargs.setdefault("budget", PLAN)
    return AuctionClient(live.url, key, **kwargs)  # type: ignore[arg-type]


def _contest(live: LiveServer, ours: str, bids: tuple[str, str] = ("0.5", "0.1")) -> None:
    """Requests of our user and a rival's, sent together until our user has paid something."""
    _, rival = live.new_user()
    since = datetime.now(UTC) - timedelta(seconds=1)
    # Timing decides how the eight requests fall into batches: a round whose batches hold
    # only one of the two users charges nothing, so the round is played again.
    for _ in range(10):
        _contest_round(live, ours, rival, bids)
        with _client(live, ours) as probe:
            if probe.ledger.spend(since=since).spent_micros > 0:
                return
    raise AssertionError("ten rounds of contested requests never charged our user")


def _contest_round(live: LiveServer, ours: str, rival: str, bids: tuple[str, str]) -> None:
    barrier = threading.Barrier(8)

    def send(key: str, bid: str, n: int) -> None:
        barrier.wait()
        body = {"text": f"contest {n}", "bid": bid, "sampling_params": {"max_new_tokens": 2}}
        httpx.post(
            live.url + "/generate",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        ).raise_for_status()

    threads = [
        threading.Thread(target=send, args=(ours if n % 2 else rival, bids[n % 2 == 0], n))
        for n in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_every_response_and_error_carries_a_request_id(live: LiveServer) -> None:
    _, key = live.new_user()
    with _client(live, key) as client:
        generation = client.generate("hello", value="0.01", max_new_tokens=2)
        assert generation.request_id is not None and generation.request_id.startswith("req_")
        balance = client.ledger.balance()
        assert balance.request_id not in (None, generation.request_id)
        with client.generate("hello", value="0.01", max_new_tokens=2, stream=True) as stream:
            assert stream.request_id is not None
            assert stream.get_final().request_id == stream.request_id
        # A request id sent by the caller (e.g. a trace id) is kept.
        traced = client.generate(
            "hello", value="0.01", max_new_tokens=2, extra_headers={"x-request-id": "trace-42"}
        )
        assert traced.request_id == "trace-42"
        # One that is not well-formed is replaced rather than echoed.
        odd = client.generate(
            "hello", value="0.01", max_new_tokens=2, extra_headers={"x-request-id": "a b\tc"}
        )
        assert odd.request_id is not None and odd.request_id.startswith("req_")
    wrong = AuctionClient(live.url, "sk-wrong", budget=PLAN, sync_on_start=False)
    with wrong, pytest.raises(sdk.AuthenticationError) as info:
        wrong.generate("hello", value="0.01")
    assert info.value.request_id is not None
    assert info.value.request_id in str(info.value)


def test_one_rid_everywhere_the_user_sees(live: LiveServer) -> None:
    _, key = live.new_user()
    with _client(live, key) as client:
        generation = client.generate("hello", value="0.02", max_new_tokens=2, rid="job-7.a")
        assert generation.rid == "job-7.a"
        entries = list(client.ledger.iter_entries())
    rids = {e.rid for e in entries if e.kind in ("hold", "release", "charge")}
    assert rids == {"job-7.a"}


def test_one_sign_convention_and_decimal_accessors(live: LiveServer) -> None:
    _, key = live.new_user(budget_micros=50_000_000, period="day")
    _contest(live, key)
    with _client(live, key) as client:
        entries = list(client.ledger.iter_entries())
        charges = [e for e in entries if e.kind == "charge"]
        assert charges and all(e.amount_micros < 0 for e in charges)  # out of the balance
        assert all(e.amount == Decimal(e.amount_micros) / 1_000_000 for e in entries)
        (row,) = client.ledger.summary(by="day").rows
        charged = -sum(e.amount_micros for e in charges)
        assert row.charged_micros == charged > 0  # a named total is a positive magnitude
        assert row.charged == Decimal(charged) / 1_000_000
        assert row.net_micros == row.granted_micros - charged + row.refunded_micros
        balance = client.ledger.balance()
        assert balance.spent_this_period_micros == charged
        assert balance.spent_this_period == row.charged
        assert balance.available == balance.balance - balance.held
        period = client.ledger.budget()
        assert period.spent_micros == charged and period.spent == row.charged
        assert period.remaining == period.grant - period.spent


def test_finish_reason_has_one_shape(live: LiveServer) -> None:
    _, key = live.new_user()
    with _client(live, key) as client:
        generation = client.generate("hello", value="0.01", max_new_tokens=2)
        chat = client.chat([{"role": "user", "content": "hi"}], value="0.01", max_tokens=2)
        completion = client.completions.create(prompt="hi", value="0.01", max_tokens=2)
        with client.generate("hello", value="0.01", max_new_tokens=2, stream=True) as stream:
            streamed = stream.get_final()
    assert generation.finish_reason == chat.choices[0].finish_reason == "length"
    assert completion.choices[0].finish_reason == streamed.finish_reason == "length"
    assert generation.finish_reason_detail is not None
    assert generation.finish_reason_detail["type"] == "length"


def test_auction_reads_the_batch_charge_under_both_names(live: LiveServer) -> None:
    _, key = live.new_user()
    _contest(live, key)
    with _client(live, key) as client:
        a = client.generate("x", value="0.5", max_new_tokens=2).auction
    assert a.user_batch_charge_micros == a.charge_micros
    # The server splits the charge per request; a user's only request carries all of it.
    assert a.per_request_charges
    assert a.request_charge_micros == a.user_batch_charge_micros
    assert a.user_batch_charge == a.charge == Decimal(a.charge_micros) / 1_000_000


def test_get_final_of_a_closed_stream_raises(live: LiveServer) -> None:
    _, key = live.new_user()
    with _client(live, key) as client:
        stream = client.generate("hello", value="0.01", max_new_tokens=8, stream=True)
        assert isinstance(next(iter(stream)), sdk.Auction)
        stream.close()
        with pytest.raises(sdk.StreamError, match="closed before it ended"):
            stream.get_final()


def test_with_options_and_per_call_options(live: LiveServer) -> None:
    _, key = live.new_user()
    seen: list[httpx.Request] = []
    http = httpx.Client(event_hooks={"request": [seen.append]})
    with _client(live, key, http_client=http) as client:
        quick = client.with_options(timeout=7.0, max_retries=0, default_headers={"x-team": "a"})
        assert (quick.timeout, quick.max_retries) == (7.0, 0)
        assert (client.timeout, client.max_retries) != (7.0, 0)
        assert quick.bidder is client.bidder  # one budget, however many views of the client
        quick.generate("hi", value="0.01", max_new_tokens=2, extra_query={"trace": "1"})
        assert seen[-1].headers["x-team"] == "a"
        assert seen[-1].url.params["trace"] == "1"
        assert seen[-1].extensions["timeout"]["read"] == 7.0
        chat = client.chat(
            [{"role": "user", "content": "hi"}],
            value="0.01",
            extra_body={"max_completion_tokens": 1},
            timeout=9.0,
        )
        assert chat.usage is not None and chat.usage.completion_tokens == 1
        assert seen[-1].extensions["timeout"]["read"] == 9.0
        assert "x-team" not in seen[-1].headers
    http.close()


def test_with_raw_response(live: LiveServer) -> None:
    _, key = live.new_user()
    with _client(live, key) as client:
        raw = client.with_raw_response.generate("hi", value="0.01", max_new_tokens=2)
        assert raw.status_code == 200
        assert raw.request_id == raw.headers["x-request-id"]
        generation = raw.parse()
        assert isinstance(generation, sdk.Generation) and generation.text
        raw_chat = client.with_raw_response.chat(
            [{"role": "user", "content": "hi"}], value="0.01", max_tokens=2
        )
        assert isinstance(raw_chat.parse(), sdk.ChatCompletion)


def test_models_and_completions(live: LiveServer) -> None:
    _, key = live.new_user()
    with _client(live, key) as client:
        models = client.models.list()
        assert [m.id for m in models.data] == ["inference-auction-emulated"]
        completion = client.completions.create(prompt="Once", value="0.02", max_tokens=3)
        assert completion.text and completion.auction is not None
        assert completion.usage is not None and completion.usage.completion_tokens == 3
        with client.completions.create(prompt="Once", value="0.02", max_tokens=3, stream=True) as s:
            items = list(s)
        assert isinstance(items[0], sdk.Auction)
        assert "".join(i for i in items if isinstance(i, str)) == s.get_final().text
        assert client.bidder.in_flight_micros == 0


@pytest.mark.anyio
async def test_a_closed_client_says_so(live: LiveServer) -> None:
    _, key = live.new_user()
    client = _client(live, key)
    client.generate("hi", value="0.01", max_new_tokens=2)
    client.close()
    assert client.is_closed
    with pytest.raises(sdk.ClientClosedError, match="closed"):
        client.generate("hi", value="0.01")
    with pytest.raises(sdk.ClientClosedError):
        client.ledger.balance()

    async with AsyncAuctionClient(live.url, key, budget=PLAN) as aclient:
        assert (await aclient.generate("hi", value="0.01", max_new_tokens=2)).text
        raw = await aclient.with_raw_response.generate("hi", value="0.01", max_new_tokens=2)
        assert raw.request_id is not None
        assert (await aclient.models.list()).data
    with pytest.raises(sdk.ClientClosedError):
        await aclient.generate("hi", value="0.01")


def test_retries_are_logged_at_info() -> None:
    # A port nothing listens on: every attempt is refused, over the real network.
    code = (
        "from inference_auctions import sdk\n"
        f"c = sdk.AuctionClient('http://127.0.0.1:{free_port()}', 'sk', sync_on_start=False,"
        " budget=sdk.Budget(total='1', auctions=1))\n"
        "try:\n"
        "    c.generate('hi', value='0.1', max_retries=1)\n"
        "except sdk.APIConnectionError as e:\n"
        "    print('gave up', e.may_have_been_processed)\n"
    )
    env = {**os.environ, "INFERENCE_AUCTION_LOG": "info"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.stdout.strip() == "gave up False"
    assert out.stderr.count("Retrying POST /generate") == 1  # max_retries=1 for this call
    assert "retry 1 of 1" in out.stderr
    quiet = subprocess.run(
        [sys.executable, "-c", code],
        env={k: v for k, v in env.items() if k != "INFERENCE_AUCTION_LOG"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Retrying" not in quiet.stderr


def test_without_a_budget_every_process_paces_the_server_period(live: LiveServer) -> None:
    grant = 20_000_000
    _, key = live.new_user(budget_micros=grant, period="day")
    _contest(live, key)
    first, second = AuctionClient(live.url, key), AuctionClient(live.url, key)
    with first, second:
        first.generate("hi", value="0.05", max_new_tokens=2)
        second.generate("hi", value="0.05", max_new_tokens=2)
        period = first.ledger.budget()
        assert period.period == "day" and period.period_end is not None
        assert period.period_end - period.period_start == timedelta(days=1)
        assert period.grant_micros == grant and period.spent_micros > 0
        for client in (first, second):
            client.sync()
            assert client.bidder.total_micros == grant
            assert client.bidder.window == (period.period_start, period.period_end)
            # Ledger-wide: spend by the contest (no client saw it) and by both clients.
            assert client.bidder.spent_micros == period.spent_micros
        assert first.bidder.auctions == second.bidder.auctions == period.auctions
        # The same figures give the same target to every process.
        assert first.bidder.target_micros == pytest.approx(second.bidder.target_micros, rel=0.01)


def test_the_balance_has_its_period_as_times(live: LiveServer) -> None:
    _, daily = live.new_user(budget_micros=1_000_000, period="day")
    _, lifetime = live.new_user(budget_micros=1_000_000, period="none")
    with AuctionClient(live.url, daily) as client:
        balance = client.ledger.balance()
    assert isinstance(balance.period_start, datetime) and isinstance(balance.period_end, datetime)
    assert balance.period_end - balance.period_start == timedelta(days=1)
    assert balance.period_end.tzinfo is not None and balance.period_end > datetime.now(UTC)
    with AuctionClient(live.url, lifetime) as client:
        assert client.ledger.balance().period_end is None


def test_a_spent_budget_raises_or_bids_zero_with_a_warning(live: LiveServer) -> None:
    _, key = live.new_user()
    start = datetime.now(UTC) - timedelta(seconds=1)
    _contest(live, key)
    with _client(live, key) as probe:
        spent = probe.ledger.spend(since=start).spent_micros
    assert spent > 0
    # A plan of exactly what was spent since its start: nothing is left.
    plan = Budget(total=Decimal(spent) / 1_000_000, auctions=10, start=start)
    with _client(live, key, budget=plan) as client:
        entries_before = len(list(client.ledger.iter_entries()))
        with pytest.raises(sdk.BudgetExhaustedError) as info:
            client.generate("hi", value="0.5")
        assert (info.value.spent_micros, info.value.total_micros) == (spent, spent)
        assert client.budget_limited and client.bidder.exhausted
        assert len(list(client.ledger.iter_entries())) == entries_before  # nothing was sent
        zero = client.with_options(on_budget_exhausted="bid_zero")
        with pytest.warns(sdk.BudgetExhaustedWarning, match="bid 0"):
            generation = zero.generate("hi", value="0.5", max_new_tokens=2)
        assert generation.auction.bid_micros == 0


def _contest_singly(live: LiveServer, ours: str) -> None:
    """One request of our user's and one of a rival's, sent together until a batch holds
    both: the price bands count only users with a single request in a batch of two or more."""
    _, rival = live.new_user()
    since = datetime.now(UTC) - timedelta(seconds=1)
    for _ in range(20):
        barrier = threading.Barrier(2)

        def send(key: str, bid: str, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            body = {"text": "single", "bid": bid, "sampling_params": {"max_new_tokens": 2}}
            headers = {"Authorization": f"Bearer {key}"}
            httpx.post(live.url + "/generate", json=body, headers=headers, timeout=30)

        threads = [
            threading.Thread(target=send, args=(key, bid))
            for key, bid in ((ours, "0.5"), (rival, "0.1"))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with _client(live, ours) as probe:
            if probe.ledger.spend(since=since).spent_micros > 0:
                return
    raise AssertionError("twenty rounds of single requests never shared a batch")


def test_recent_clearing_prices(live: LiveServer) -> None:
    _, key = live.new_user()
    _contest(live, key)
    _contest_singly(live, key)
    _contest_singly(live, key)  # a third user: bands drawn from fewer are not published
    with _client(live, key) as client:
        # The server reads new batches at most every two seconds and keeps an answer five
        # seconds per window (rounded to the minute): ask again over a fresh window.
        for attempt in range(8):
            prices = client.market.prices(window_seconds=600 + 60 * attempt)
            if sum(b.samples for b in prices.by_priority) >= 1:
                break
            time.sleep(0.5)
    assert prices.batches >= 1 and prices.samples >= 1
    per_unit = prices.charge_per_priority_micros
    assert per_unit.mean is not None and per_unit.mean > 0
    assert per_unit.p10 is not None and per_unit.p90 is not None
    assert per_unit.p10 <= (per_unit.p50 or 0) <= per_unit.p90
    assert [(b.priority_min, b.priority_max) for b in prices.by_priority] == [
        (0.75, 1.0),
        (0.5, 0.75),
        (0.25, 0.5),
        (0.0, 0.25),
    ]
    assert sum(b.samples for b in prices.by_priority) >= 1


def test_bad_input_to_the_pacing_endpoints_is_a_400_naming_the_field(live: LiveServer) -> None:
    _, key = live.new_user()
    headers = {"Authorization": f"Bearer {key}"}
    naive = httpx.get(
        live.url + "/v1/spend", params={"since": "2030-01-01T00:00:00"}, headers=headers
    )
    assert naive.status_code == 400 and "since" in naive.json()["error"]["message"]
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    ahead = httpx.get(live.url + "/v1/spend", params={"since": future}, headers=headers)
    assert ahead.status_code == 400 and "future" in ahead.json()["error"]["message"]
    garbage = httpx.get(live.url + "/v1/spend", params={"since": "yesterday"}, headers=headers)
    assert 400 <= garbage.status_code < 500 and "since" in garbage.text
    window = httpx.get(
        live.url + "/v1/market/prices", params={"window_seconds": 0}, headers=headers
    )
    assert 400 <= window.status_code < 500 and "window_seconds" in window.text
    assert httpx.get(live.url + "/v1/budget").status_code == 401
