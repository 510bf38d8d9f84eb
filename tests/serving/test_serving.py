"""End to end: real clients against the real server with the embedded engine, on SQLite and
PostgreSQL. Every money assertion is checked against the ledger, not the responses alone."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections import defaultdict
from datetime import UTC
from typing import Any

import httpx
import pytest

from tests.server.harness import RunningServer


def _charges_by_batch(responses: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """(user, batch) -> charge reported; every response of a batch must report the same."""
    seen: dict[tuple[str, str], int] = {}
    for response in responses:
        auction = response["meta_info"]["auction"]
        key = (response["user"], auction["batch_id"])
        assert seen.setdefault(key, auction["charge_micros"]) == auction["charge_micros"]
    return seen


def _ledger_net_charges(server: RunningServer, user: str) -> int:
    entries = server.ledger.entries(user, limit=1000).entries
    return sum(-e.amount_micros for e in entries if e.kind in ("charge", "refund"))


@pytest.mark.anyio
async def test_concurrent_users_are_charged_exactly_what_they_were_told(
    server: RunningServer,
) -> None:
    users = {f"user{i}": server.create_user(f"user{i}", budget=50_000_000) for i in range(5)}
    article = "Article: " + " ".join(f"word{i}" for i in range(300)) + "."
    rng = random.Random(7)

    async def one(user: str, key: str, index: int) -> dict[str, Any]:
        prompt = (article if index % 2 else f"Alone {user} {index}") + f" Question {index}?"
        bid = f"{rng.randint(0, 900_000) / 1_000_000:.6f}"
        async with server.async_client(key) as client:
            response = await client.post(
                "/generate",
                json={"text": prompt, "bid": bid, "sampling_params": {"max_new_tokens": 8}},
            )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["meta_info"]["auction"]["bid_micros"] == round(float(bid) * 1_000_000)
        return {**body, "user": user}

    jobs = [one(u, k, i) for i in range(8) for u, k in users.items()]
    responses = await asyncio.gather(*jobs)
    charges = _charges_by_batch(responses)
    for user in users:
        reported = sum(v for (u, _), v in charges.items() if u == user)
        assert _ledger_net_charges(server, user) == reported
        # The posted floor (on by default; 40 requests at once raise it): each answer's part.
        floors = sum(
            r["meta_info"]["auction"].get("floor_micros", 0) for r in responses if r["user"] == user
        )
        entries = server.ledger.entries(user, kind="floor", limit=1000).entries
        assert -sum(e.amount_micros for e in entries) == floors
        balance = server.ledger.balance(user)
        assert balance.held_micros == 0
        assert balance.balance_micros == 50_000_000 - reported - floors >= 0
    assert server.ledger.reconcile().ok
    # Every request's serving outcome is recorded next to its charge.
    for response in responses:
        meta = response["meta_info"]
        view = server.ledger.find_request(f"{response['user']}/{meta['id']}")
        assert view is not None and view.status == "served"
        assert view.cached_tokens == meta["cached_tokens"] and view.ttft_ms is not None
    # Backpressure made batches of several requests, and the auction ordered them.
    sizes = {r["meta_info"]["auction"]["batch_size"] for r in responses}
    assert max(sizes) > 1


@pytest.mark.anyio
async def test_the_engine_serves_each_batch_in_the_auctions_order(server: RunningServer) -> None:
    key = server.create_user("alice", budget=100_000_000)

    async def burst() -> list[dict[str, Any]]:
        async with server.async_client(key) as client:
            requests = [
                client.post(
                    "/generate",
                    json={
                        "text": f"Independent prompt number {i} " * 20,
                        "bid": f"0.{i:02d}",
                        "sampling_params": {"max_new_tokens": 4},
                    },
                )
                for i in range(1, 25)
            ]
            return [r.json() for r in await asyncio.gather(*requests)]

    by_batch: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for body in await burst():
        by_batch[body["meta_info"]["auction"]["batch_id"]].append(body)
    multi = [batch for batch in by_batch.values() if len(batch) > 1]
    assert multi, "expected some batches with several requests"
    for batch in multi:
        batch.sort(key=lambda b: b["meta_info"]["auction"]["position"])
        bids = [b["meta_info"]["auction"]["bid_micros"] for b in batch]
        assert bids == sorted(bids, reverse=True)  # disjoint prompts: highest bid first
        first_tokens = [
            b["meta_info"]["request_received_ts"] + b["meta_info"]["first_token_latency"]
            for b in batch
        ]
        assert first_tokens == sorted(first_tokens)


def test_streaming_sends_the_auction_first_then_chunks(server: RunningServer) -> None:
    key = server.create_user("bob")
    body = {
        "text": "Stream me",
        "bid": "0.5",
        "stream": True,
        "sampling_params": {"max_new_tokens": 6},
    }
    with server.client(key) as client, client.stream("POST", "/generate", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    first = chunks[0]
    assert first["text"] == "" and first["meta_info"]["finish_reason"] is None
    assert first["meta_info"]["auction"]["batch_size"] >= 1
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert chunks[-1]["meta_info"]["completion_tokens"] == 6
    texts = [c["text"] for c in chunks[1:]]
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))


def test_a_bid_the_budget_cannot_cover_is_402_and_changes_nothing(server: RunningServer) -> None:
    key = server.create_user("carol", budget=1_000_000)
    before = server.ledger.entries("carol").entries
    with server.client(key) as client:
        response = client.post("/generate", json={"text": "hi", "bid": "1.000001"})
        assert response.status_code == 402
        assert response.json()["error"]["type"] == "insufficient_funds"
        assert "carol" in response.json()["error"]["message"]
        # A zero bid is always admitted.
        free = client.post("/generate", json={"text": "hi", "bid": 0})
        assert free.status_code == 200, free.text
        assert free.json()["meta_info"]["auction"]["charge_micros"] == 0
    after = server.ledger.entries("carol").entries
    assert [e for e in after if e.kind not in ("hold", "release")] == [
        e for e in before if e.kind not in ("hold", "release")
    ]
    assert server.ledger.balance("carol").balance_micros == 1_000_000


def test_a_402_under_a_daily_budget_says_when_it_renews(server: RunningServer) -> None:
    key = server.ledger.create_user("erin", budget_micros=100_000, period="day").api_key
    lifetime_key = server.create_user("frank", budget=100_000)
    with server.client(key) as client, server.client(lifetime_key) as lifetime:
        refused = client.post("/generate", json={"text": "hi", "bid": "0.2"})
        assert refused.status_code == 402
        renews = server.ledger.balance("erin").period_end
        assert renews is not None and renews.hour == 0 and renews.minute == 0  # midnight UTC
        when = renews.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        message = refused.json()["error"]["message"]
        assert f"wait for the budget to renew at {when}" in message, message
        # A lifetime budget never renews: the answer promises nothing.
        never = lifetime.post("/generate", json={"text": "hi", "bid": "0.2"})
        assert never.status_code == 402 and "renew" not in never.json()["error"]["message"]


def test_bad_input_is_a_4xx_that_names_the_problem_and_changes_nothing(
    server: RunningServer,
) -> None:
    key = server.create_user("dave")
    long_prompt = list(range(1, server.settings.max_prompt_tokens + 2))
    cases: list[tuple[dict[str, str] | None, Any, int, str]] = [
        (None, {"text": "x", "bid": "1"}, 401, "Authorization"),
        ({"Authorization": "Bearer nope"}, {"text": "x"}, 401, "not valid"),
        ({}, {"text": "x", "bid": "-1"}, 400, "bid: must not be negative"),
        ({}, {"text": "x", "bid": "NaN"}, 400, "bid: must be a finite"),
        ({}, b'{"text": "x", "bid": NaN}', 400, "bid: must be a finite"),
        ({}, {"text": "x", "bid": "0.0000001"}, 400, "at most 6 decimal"),
        ({}, {"text": "x", "bid": "1e3"}, 400, "bid"),
        ({}, {"text": "x", "bid": "99999999"}, 400, "above the maximum"),
        ({}, {"text": "x", "bid": True}, 400, "bid"),
        ({}, b'{"text": "x", ', 400, "not valid JSON"),
        ({}, b"[1, 2]", 400, "JSON object"),
        ({}, {"bid": "1"}, 400, "text is missing"),
        ({}, {"text": "", "bid": "1"}, 400, "empty"),
        ({}, {"input_ids": long_prompt}, 400, "the limit is"),
        ({}, {"input_ids": [1, -2]}, 400, "input_ids"),
        ({}, {"text": "x", "sampling_params": {"bogus": 1}}, 400, "sampling_params.bogus"),
        ({}, {"text": "x", "sampling_params": {"max_new_tokens": 10**9}}, 400, "limit"),
        ({}, {"text": ["a", "b"]}, 400, "one prompt per request"),
        ({}, {"text": "x", "rid": "has space"}, 400, "rid"),
    ]
    with server.client(key) as client:
        for headers, body, status, message in cases:
            send_headers = {"Authorization": f"Bearer {key}"} if headers == {} else headers or {}
            client.headers.clear()
            client.headers.update(send_headers)
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            response = client.post("/generate", content=content)
            assert response.status_code == status, (body, response.text)
            error = response.json()["error"]
            assert message in error["message"], (body, error)
    assert server.ledger.entries("dave").entries[-1].kind == "grant"
    assert server.ledger.balance("dave").held_micros == 0


@pytest.mark.anyio
async def test_a_retried_rid_is_charged_once_and_a_conflicting_one_is_409(
    server: RunningServer,
) -> None:
    key = server.create_user("erin")
    body = {
        "text": "Same request",
        "bid": "0.3",
        "rid": "erin-req-1",
        "sampling_params": {"max_new_tokens": 4},
    }

    async def twice() -> list[httpx.Response]:
        async with server.async_client(key) as client:
            return list(
                await asyncio.gather(*(client.post("/generate", json=body) for _ in range(3)))
            )

    first, *retries = await twice()
    assert first.status_code == 200
    assert all(r.status_code == 200 and r.json() == first.json() for r in retries)
    with server.client(key) as client:
        again = client.post("/generate", json=body)
        assert again.status_code == 200 and again.json() == first.json()
        conflict = client.post("/generate", json={**body, "bid": "0.4"})
        assert conflict.status_code == 409
        assert conflict.json()["error"]["param"] == "rid"
    holds = [e for e in server.ledger.entries("erin").entries if e.kind == "hold"]
    assert len(holds) == 1


def test_openai_client_works_with_a_bid_in_extra_body(server: RunningServer) -> None:
    import openai

    key = server.create_user("frank")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
    try:
        models = client.models.list()
        model = models.data[0].id
        completion = client.completions.create(
            model=model, prompt="Say hello", max_tokens=5, extra_body={"bid": "0.25"}
        )
        assert completion.choices[0].text
        assert completion.usage is not None and completion.usage.completion_tokens == 5
        auction = completion.model_extra["auction"] if completion.model_extra else None
        assert auction is not None and auction["bid_micros"] == 250_000
        chat = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Hi there"}],
            max_tokens=4,
            extra_body={"bid": 0.1},
        )
        assert chat.choices[0].message.content
        assert chat.model_extra and chat.model_extra["auction"]["bid_micros"] == 100_000
        pieces = list(
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Stream"}],
                max_tokens=5,
                stream=True,
                extra_body={"bid": "0.01"},
            )
        )
        assert pieces[0].model_extra and "auction" in pieces[0].model_extra
        text = "".join(p.choices[0].delta.content or "" for p in pieces)
        assert text.strip()
        assert pieces[-1].choices[0].finish_reason == "length"
    finally:
        client.close()
    assert server.ledger.reconcile().ok


def test_ledger_endpoints_show_the_callers_own_money(server: RunningServer) -> None:
    key = server.create_user("gina", budget=5_000_000)
    other = server.create_user("hank")
    with server.client(key) as client:
        assert client.post("/generate", json={"text": "hello", "bid": "0.2"}).status_code == 200
        balance = client.get("/v1/ledger/balance").json()
        assert balance["user"] == "gina"
        assert balance["balance_micros"] + balance["spent_this_period_micros"] == 5_000_000
        entries = client.get("/v1/ledger/entries", params={"kind": "grant"}).json()["entries"]
        assert [e["amount_micros"] for e in entries] == [5_000_000]
        summary = client.get("/v1/ledger/summary", params={"by": "month"}).json()
        assert summary["rows"][0]["granted_micros"] == 5_000_000
        assert client.get("/v1/admin/users").status_code == 403
    with server.client(other) as client:
        assert client.get("/v1/ledger/balance").json()["user"] == "hank"


def test_health_and_metrics(server: RunningServer) -> None:
    key = server.create_user("ivan")
    with server.client(key) as client:
        client.post("/generate", json={"text": "count me", "bid": "0.1"})
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.json()["ledger"] == "ok"
        metrics = client.get("/metrics").text
    for name in (
        "inference_auction_queue_length",
        "inference_auction_batches_total",
        "inference_auction_batch_size_bucket",
        "inference_auction_auction_seconds_bucket",
        "inference_auction_revenue_micros_total",
        "inference_auction_welfare_micros_total",
        "inference_auction_dispatch_lag_seconds_bucket",
        "inference_auction_engine_ttft_seconds_bucket",
        "inference_auction_cache_hit_rate",
    ):
        assert name in metrics, name
    assert "inference_auction_batches_total 1.0" in metrics


@pytest.mark.anyio
async def test_concurrent_retries_of_a_refused_request_all_get_the_refusal(
    server: RunningServer,
) -> None:
    key = server.create_user("pat", budget=100_000)
    body = {"text": "too expensive", "bid": "5", "rid": "pat-1"}

    async def together() -> list[httpx.Response]:
        async with server.async_client(key) as client:
            return list(
                await asyncio.gather(*(client.post("/generate", json=body) for _ in range(4)))
            )

    assert [r.status_code for r in await together()] == [402] * 4
    assert server.ledger.balance("pat").held_micros == 0


def test_sglang_management_endpoints(server: RunningServer) -> None:
    user = server.create_user("quinn")
    admin = server.create_user("root", admin=True)
    with server.client(user) as client:
        assert client.get("/model_info").json()["model_path"] == "inference-auction-emulated"
        assert client.get("/server_info").json()["engine"] == "embedded"
        assert client.post("/flush_cache").status_code == 403  # everyone's cache: admins only
    with server.client(admin) as client:
        flushed = client.post("/flush_cache")
        assert flushed.status_code == 200 and "flushed" in flushed.text
        assert client.get("/flush_cache").status_code == 200
