"""HTTP behaviour of the clients against a fake server: bodies, retries, errors, ledger."""

from __future__ import annotations

import json
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference_auctions import sdk
from inference_auctions.sdk import AsyncAuctionClient, AuctionClient, Budget

from .conftest import BASE_URL, async_transport, transport
from .fake_server import API_KEY, DROP, FakeServer, error_response

pytestmark = pytest.mark.usefixtures("fast_retries")


def make_client(server: FakeServer, **kwargs: Any) -> AuctionClient:
    kwargs.setdefault("budget", Budget(total="50", auctions=1000))
    kwargs.setdefault("sync_on_start", False)
    return AuctionClient(BASE_URL, API_KEY, transport=transport(server), **kwargs)


def body_of(request: httpx.Request) -> dict[str, Any]:
    return dict(json.loads(request.content))


def test_generate_sends_the_contract_body_and_parses_the_response(server: FakeServer) -> None:
    with make_client(server) as client:
        r = client.generate("Summarize this", value="0.02", max_new_tokens=128, temperature=0.0)
    (request,) = server.attempts
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert str(request.url) == f"{BASE_URL}/generate"
    body = body_of(request)
    assert body == {
        "text": "Summarize this",
        "sampling_params": {"max_new_tokens": 128, "temperature": 0.0},
        "rid": r.rid,
        "stream": False,
        "bid": "0.020000",
    }
    assert r.text == "echo: Summarize this"
    assert r.usage == sdk.Usage(
        prompt_tokens=5, completion_tokens=3, total_tokens=8, cached_tokens=2
    )
    assert (r.auction.batch_id, r.auction.position) == ("batch-0", 0)
    assert (r.auction.bid_micros, r.auction.charge_micros) == (20_000, 20_000)
    assert str(r.auction.charge) == "0.02"
    assert client.bidder.spent_micros == 20_000
    assert client.bidder.in_flight_micros == 0
    assert client.bidder.auctions == 1


def test_configuration_comes_from_the_environment(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERENCE_AUCTION_BASE_URL", "http://env.test/api")
    monkeypatch.setenv("INFERENCE_AUCTION_API_KEY", API_KEY)
    budget = Budget(total="1", auctions=10)
    with AuctionClient(budget=budget, transport=transport(server), sync_on_start=False) as client:
        client.generate("hi", value="0.01")
    assert str(server.attempts[0].url) == "http://env.test/api/generate"
    monkeypatch.delenv("INFERENCE_AUCTION_API_KEY")
    with pytest.raises(sdk.ConfigurationError, match="INFERENCE_AUCTION_API_KEY"):
        AuctionClient(budget=budget)


def test_a_retry_reuses_the_rid_and_is_charged_once(server: FakeServer) -> None:
    # The first attempt is processed but its response is lost; the second meets a 503.
    server.queue("/generate", DROP, error_response(503, "unavailable"))
    with make_client(server) as client:
        r = client.generate("hello", value="0.5")
    rids = server.rids()
    assert len(rids) == 3
    assert set(rids) == {r.rid}
    assert len(server.batches) == 1
    assert server.total_charged == 500_000
    assert client.bidder.spent_micros == server.total_charged


def test_retry_after_is_honoured(server: FakeServer) -> None:
    server.queue("/generate", error_response(429, "rate_limited", retry_after="0.2"))
    with make_client(server) as client:
        started = time.monotonic()
        client.generate("hello", value="0.1")
    assert time.monotonic() - started >= 0.2
    assert len(server.attempts) == 2


def test_402_is_insufficient_funds_and_not_retried(server: FakeServer) -> None:
    server.queue("/generate", error_response(402, "insufficient_funds"))
    with make_client(server) as client, pytest.raises(sdk.InsufficientFundsError) as info:
        client.generate("hello", value="1")
    assert info.value.status_code == 402
    assert info.value.type == "insufficient_funds"
    assert len(server.attempts) == 1
    assert (client.bidder.spent_micros, client.bidder.in_flight_micros) == (0, 0)


def test_an_idempotency_conflict_is_not_retried(server: FakeServer) -> None:
    with make_client(server) as client:
        client.generate("hello", value="0.1", rid="fixed")
        with pytest.raises(sdk.IdempotencyConflictError) as info:
            client.generate("hello", value="0.2", rid="fixed")
    assert info.value.status_code == 409
    assert isinstance(info.value, sdk.ConflictError)
    assert len(server.attempts) == 2
    assert client.bidder.in_flight_micros == 0


def test_other_conflicts_are_retried(server: FakeServer) -> None:
    server.queue("/generate", error_response(409, "request_in_progress"))
    with make_client(server) as client:
        client.generate("hello", value="0.1")
    assert len(server.attempts) == 2


@pytest.mark.parametrize(
    ("status", "kind", "error"),
    [
        (400, "invalid_request", sdk.BadRequestError),
        (401, "authentication_error", sdk.AuthenticationError),
        (403, "forbidden", sdk.PermissionDeniedError),
        (404, "not_found", sdk.NotFoundError),
        (408, "timeout", sdk.APIStatusError),
        (422, "invalid_request", sdk.UnprocessableEntityError),
        (429, "rate_limited", sdk.RateLimitError),
        (500, "internal", sdk.InternalServerError),
        (502, "engine_error", sdk.EngineError),
        (503, "unavailable", sdk.ServiceUnavailableError),
        (504, "engine_timeout", sdk.EngineTimeoutError),
    ],
)
def test_status_codes_map_to_exceptions(
    server: FakeServer, status: int, kind: str, error: type[sdk.APIStatusError]
) -> None:
    server.queue("/generate", error_response(status, kind))
    with make_client(server, max_retries=0) as client, pytest.raises(error) as info:
        client.generate("hello", value="0.1")
    assert type(info.value) is error
    assert (info.value.status_code, info.value.type) == (status, kind)
    assert str(info.value).startswith(str(status))
    # A failed request is not charged: engine failures are refunded by the server.
    assert (client.bidder.spent_micros, client.bidder.in_flight_micros) == (0, 0)


def test_server_errors_are_retried_up_to_max_retries(server: FakeServer) -> None:
    server.queue("/generate", *[error_response(503, "unavailable")] * 3)
    with make_client(server, max_retries=2) as client, pytest.raises(sdk.ServiceUnavailableError):
        client.generate("hello", value="0.1")
    assert len(server.attempts) == 3
    assert len(set(server.rids())) == 1


def test_connection_errors_are_retried(server: FakeServer) -> None:
    server.queue("/generate", httpx.ConnectError("refused"), httpx.ReadError("reset"))
    with make_client(server) as client:
        r = client.generate("hello", value="0.1")
    assert len(set(server.rids())) == 1
    assert client.bidder.spent_micros == r.auction.charge_micros


def test_connect_failures_release_the_bid(server: FakeServer) -> None:
    server.queue("/generate", *[httpx.ConnectError("refused")] * 3)
    with make_client(server) as client, pytest.raises(sdk.APIConnectionError) as info:
        client.generate("hello", value="0.1")
    assert not info.value.may_have_been_processed
    assert (client.bidder.spent_micros, client.bidder.in_flight_micros) == (0, 0)


def test_a_connection_error_names_the_url_it_could_not_reach() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    client = sdk.AuctionClient(url, "iak_test", max_retries=0)
    with client, pytest.raises(sdk.APIConnectionError) as info:
        client.ledger.balance()
    message = str(info.value)
    assert f"GET {url}/v1/ledger/balance" in message and "refused" in message.lower(), message


def test_lost_responses_count_the_bid_until_the_ledger_says_otherwise(server: FakeServer) -> None:
    server.queue("/generate", *[httpx.ReadTimeout("slow")] * 3)
    with make_client(server) as client:
        with pytest.raises(sdk.APITimeoutError) as info:
            client.generate("hello", value="0.1")
        assert info.value.may_have_been_processed
        assert client.bidder.spent_micros == 100_000  # assumed charged: never overspend
        client.sync()
        assert client.bidder.spent_micros == 0  # the ledger knows nothing was charged


def test_timeouts_default_and_per_call(server: FakeServer) -> None:
    with make_client(server) as client:
        assert client.timeout == httpx.Timeout(600.0, connect=5.0)
        client.generate("a", value="0.1")
        client.generate("b", value="0.1", timeout=3.0)
    first, second = (r.extensions["timeout"] for r in server.attempts)
    assert first == {"connect": 5.0, "read": 600.0, "write": 600.0, "pool": 600.0}
    assert second == {"connect": 3.0, "read": 3.0, "write": 3.0, "pool": 3.0}


def test_sync_on_start_takes_the_plans_spend_from_the_server(server: FakeServer) -> None:
    server.entries = [
        _entry(1, "charge", -2_000_000, "old-batch"),
        _entry(2, "refund", 500_000, "old-batch"),
        _entry(3, "hold", -9_000_000, None),
    ]
    with make_client(server, sync_on_start=True) as client:
        client.generate("hello", value="0.1")
        # A plan in progress: the first bid is the target (48.5 credits left over the 999
        # auctions left), not the value, and the fake server charges the whole bid.
        target = (50_000_000 - 1_500_000) // 999
        assert client.bidder.spent_micros == 1_500_000 + target
    (listing,) = server.attempts_on("/v1/spend")
    assert listing.url.params["since"] == client.bidder.spend_since.isoformat()


def test_without_a_budget_the_server_period_is_the_plan(server: FakeServer) -> None:
    server.budget_period |= {
        "period_start": "2030-01-01T06:00:00+00:00",
        "period_end": "2030-01-02T06:00:00+00:00",
        "spent_micros": 3_000_000,
        "held_micros": 250_000,
        "auctions": 40,
    }
    clock = datetime(2030, 1, 1, 20, tzinfo=UTC).timestamp
    client = AuctionClient(BASE_URL, API_KEY, transport=transport(server), clock=clock)
    with client:
        client.generate("hello", value="0.1")
        assert client.bidder.total_micros == 10_000_000  # the period's grant
        assert client.bidder.spent_micros == 3_100_000
        assert client.bidder.auctions == 41
        assert client.bidder.window == (
            datetime(2030, 1, 1, 6, tzinfo=UTC),
            datetime(2030, 1, 2, 6, tzinfo=UTC),
        )
        # The 250,000 held were other processes' bids in flight (this one had none at the
        # sync): they may still be charged, so they are not this process's to bid.
        assert client.bidder.others_in_flight_micros == 250_000
        assert client.bidder.available_micros == 10_000_000 - 3_100_000 - 250_000
    assert server.attempts_on("/v1/budget")


def test_ledger_endpoints(server: FakeServer) -> None:
    server.entries = [_entry(i, "charge", -i, f"b{i}") for i in range(1, 1201)]
    with make_client(server) as client:
        balance = client.ledger.balance()
        assert balance.available_micros == 10**9
        page = client.ledger.entries(since=datetime(2030, 1, 1, tzinfo=UTC), limit=10)
        assert [e.id for e in page.entries] == list(range(1, 11))
        assert page.next_cursor == "10"
        assert sum(1 for _ in client.ledger.iter_entries(kind="charge")) == 1200
        summary = client.ledger.summary(by="week")
        assert summary.by == "week"
        assert summary.rows[0].granted_micros == 10**9
    since = server.attempts_on("/v1/ledger/entries")[0].url.params["since"]
    assert since == "2030-01-01T00:00:00+00:00"


def test_chat_completions(server: FakeServer) -> None:
    with make_client(server) as client:
        r = client.chat(
            [{"role": "user", "content": "Hi"}, sdk.ChatMessage(role="user", content="there")],
            value="0.3",
            model="test-model",
            max_tokens=16,
            extra_body={"top_k": 5},
        )
    body = body_of(server.attempts[0])
    assert body == {
        "messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "there"}],
        "model": "test-model",
        "max_tokens": 16,
        "top_k": 5,
        "stream": False,
        "rid": body["rid"],
        "bid": "0.300000",
    }
    assert r.text == "Hello there"
    assert r.usage is not None and r.usage.total_tokens == 6
    assert r.auction is not None and r.auction.charge_micros == 300_000
    assert client.bidder.spent_micros == 300_000


def test_state_file_survives_a_restart(server: FakeServer, tmp_path: Path) -> None:
    state = tmp_path / "pacing.json"
    budget = Budget(total="1", auctions=10)
    with make_client(server, budget=budget, state_file=state, sync_on_start=True) as client:
        for _ in range(3):
            client.generate("hello", value="0.3")
        mu, spent = client.bidder.mu, client.bidder.spent_micros
    assert mu > 0
    with make_client(server, budget=budget, state_file=state, sync_on_start=True) as client:
        assert client.bidder.mu == mu
        assert client.bidder.spent_micros == spent
        client.sync()
        assert client.bidder.spent_micros == server.total_charged == spent


def test_an_injected_http_client_is_used_and_left_open(server: FakeServer) -> None:
    http = httpx.Client(transport=transport(server), timeout=httpx.Timeout(7.0, connect=1.0))
    client = AuctionClient(
        BASE_URL,
        API_KEY,
        budget=Budget(total="1", auctions=1),
        http_client=http,
        sync_on_start=False,
    )
    assert client.timeout == httpx.Timeout(7.0, connect=1.0)
    client.generate("hello", value="0.1")
    client.close()
    assert not http.is_closed
    http.close()
    with pytest.raises(sdk.ConfigurationError):
        AuctionClient(
            BASE_URL,
            API_KEY,
            budget=Budget(total="1", auctions=1),
            http_client=http,
            transport=transport(server),
        )


@pytest.mark.anyio
async def test_async_client_generate_retry_and_errors(server: FakeServer) -> None:
    server.queue("/generate", DROP, httpx.ConnectError("refused"))

    async with AsyncAuctionClient(
        BASE_URL,
        API_KEY,
        budget=Budget(total="50", auctions=1000),
        transport=async_transport(server),
    ) as client:
        r = await client.generate("hello", value="0.25", max_new_tokens=8)
        assert r.text == "echo: hello"
        assert set(server.rids()) == {r.rid}
        assert server.total_charged == client.bidder.spent_micros == 250_000
        server.queue("/generate", error_response(402, "insufficient_funds"))
        with pytest.raises(sdk.InsufficientFundsError):
            await client.generate("hello", value="0.25")
        chat = await client.chat([{"role": "user", "content": "Hi"}], value="0.1")
        assert chat.auction is not None
        assert (await client.ledger.balance()).user == "alice"
        assert len([e async for e in client.ledger.iter_entries()]) == 2
        assert (await client.ledger.summary()).by == "day"
        assert client.bidder.in_flight_micros == 0
    assert len(server.attempts_on("/v1/spend")) == 1  # the sync on start
    assert len(server.attempts_on("/v1/ledger/entries")) == 1  # the listing


def _entry(i: int, kind: str, amount: int, batch_id: str | None) -> dict[str, Any]:
    return {
        "id": i,
        "kind": kind,
        "amount_micros": amount,
        "batch_id": batch_id,
        "rid": None,
        "reason": None,
        "created_at": "2030-01-01T00:00:00+00:00",
    }


def test_a_body_off_contract_is_a_validation_error(server: FakeServer) -> None:
    server.queue("/generate", httpx.Response(200, json={"text": "no meta_info"}))
    with make_client(server) as client:
        with pytest.raises(sdk.APIResponseValidationError) as info:
            client.generate("hello", value="0.1")
        assert info.value.status_code == 200
        # Accepted by the server, so possibly charged: the bid counts until the next sync.
        assert client.bidder.spent_micros == 100_000


@pytest.mark.anyio
async def test_an_async_client_built_outside_the_event_loop(server: FakeServer) -> None:
    client = AsyncAuctionClient(
        BASE_URL, API_KEY, budget=Budget(total="1", auctions=10), transport=async_transport(server)
    )

    async with client:
        await client.generate("hello", value="0.1")
    assert client.bidder.spent_micros == 100_000


def test_models_accept_both_usage_and_summary_shapes() -> None:
    usage = sdk.Usage.model_validate(
        {
            "prompt_tokens": 4,
            "completion_tokens": 2,
            "total_tokens": 6,
            "prompt_tokens_details": {"cached_tokens": 3},
        }
    )
    assert usage.cached_tokens == 3
    row = sdk.LedgerSummaryRow.model_validate(
        {
            "period_start": "2030-01-01T00:00:00+00:00",
            "granted_micros": 5,
            "charged_micros": -3,
            "refunded_micros": 1,
            "adjusted_micros": 0,
            "net_micros": 3,
            "entries": 7,
        }
    )
    assert (row.net_micros, row.entries, row.requests) == (3, 7, None)
    assert (row.fees_micros, row.floors_micros) == (0, 0)  # a server that names neither
