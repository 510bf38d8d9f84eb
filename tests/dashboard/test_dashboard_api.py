"""The dashboard's JSON API against a real server on both ledger backends: sessions, access
rules, numbers that agree with the ledger, and answers that stay small with 10,000 batches."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from inference_auctions.billing.models import (
    AuctionBatch,
    BatchRequest,
    EntryKind,
    LedgerEntry,
    User,
)
from inference_auctions.server.api.dashboard_routes import _projection
from inference_auctions.server.dashboard.sessions import COOKIE_NAME, SessionStore
from tests.dashboard.seeding import create_users_before, seed_batches, send_traffic
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.server.harness import RunningServer, running_server
from tests.server.money_audit import audit_money_against_answers


@contextmanager
def _sign_in(server: RunningServer, key: str) -> Iterator[httpx.Client]:
    """A client holding only the session cookie bought with `key`."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        reply = client.post("/v1/dashboard/session", headers={"Authorization": f"Bearer {key}"})
        assert reply.status_code == 200, reply.text
        yield client


def test_sign_in_sets_an_httponly_strict_expiring_cookie_that_logout_ends(
    server: RunningServer,
) -> None:
    alice = server.create_user("alice")
    with httpx.Client(base_url=server.url, timeout=60) as client:
        reply = client.post("/v1/dashboard/session", headers={"Authorization": f"Bearer {alice}"})
        assert reply.status_code == 200
        assert reply.json() == {"user": "alice", "admin": False, "expires_in_seconds": 8 * 3600}
        cookie = reply.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE_NAME}=")
        attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/", "max-age=28800"} <= attributes
        token = client.cookies[COOKIE_NAME]
        assert alice not in cookie and alice not in reply.text  # the key is not echoed
        assert client.get("/v1/dashboard/session").json()["user"] == "alice"
        assert client.get("/v1/dashboard/account").json()["user"] == "alice"
        assert client.delete("/v1/dashboard/session").status_code == 200
        assert COOKIE_NAME not in client.cookies
    # The ended token is worthless, even when replayed by hand.
    replay = httpx.get(
        server.url + "/v1/dashboard/account",
        headers={"Cookie": f"{COOKIE_NAME}={token}"},
        timeout=60,
    )
    assert replay.status_code == 401
    assert replay.json()["error"]["type"] == "unauthenticated"


def test_a_bad_key_gets_no_session_and_a_key_in_the_url_is_ignored(server: RunningServer) -> None:
    alice = server.create_user("alice")
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for headers in ({}, {"Authorization": "Bearer iak_nope_nope"}, {"X-API-Key": alice}):
            reply = client.post("/v1/dashboard/session", headers=headers)
            assert reply.status_code == 401, headers
            assert "set-cookie" not in reply.headers
        reply = client.post("/v1/dashboard/session", params={"api_key": alice, "key": alice})
        assert reply.status_code == 401
        assert client.get("/v1/dashboard/account", params={"api_key": alice}).status_code == 401
        forged = client.get("/v1/dashboard/account", headers={"Cookie": f"{COOKIE_NAME}={alice}"})
        assert forged.status_code == 401  # a key is not a session token


def test_a_users_session_reaches_only_its_own_account(server: RunningServer) -> None:
    alice = server.create_user("alice", budget=7_000_000)
    bob = server.create_user("bob", budget=3_000_000)
    server.create_user("root", admin=True)
    send_traffic(server, {"alice": alice, "bob": bob}, rounds=1)
    with _sign_in(server, bob) as client:
        for params in ({}, {"user": "alice"}, {"name": "alice"}):
            body = client.get("/v1/dashboard/account", params=params).json()
            assert body["user"] == "bob" and body["balance"]["user"] == "bob"
            assert all(r["rid"].startswith("bob-") for r in body["recent"])
            assert body["budget_micros"] == 3_000_000
        market = client.get("/v1/dashboard/market")
        assert market.status_code == 403
        assert market.json()["error"]["type"] == "forbidden"
        assert "alice" not in market.text
        # The cookie opens the dashboard's endpoints only; the admin API still wants a key.
        for path in ("/v1/admin/users", "/v1/admin/users/alice/balance", "/v1/ledger/balance"):
            assert client.get(path).status_code == 401, path


def test_a_disabled_user_is_signed_out(server: RunningServer) -> None:
    alice = server.create_user("alice")
    with _sign_in(server, alice) as client:
        server.ledger.disable_user("alice")
        reply = client.get("/v1/dashboard/account")
        assert reply.status_code == 403
        server.ledger.enable_user("alice")
        assert client.get("/v1/dashboard/account").status_code == 401  # the session ended


def test_the_account_view_matches_the_ledger(server: RunningServer) -> None:
    keys = {name: server.create_user(name) for name in ("alice", "bob", "carol")}
    send_traffic(server, keys, rounds=3)
    with _sign_in(server, keys["alice"]) as client:
        body = client.get("/v1/dashboard/account").json()
    balance = server.ledger.balance("alice")
    assert body["balance"]["balance_micros"] == balance.balance_micros
    assert body["balance"]["held_micros"] == balance.held_micros == 0
    assert body["balance"]["spent_this_period_micros"] == balance.spent_this_period_micros
    assert balance.spent_this_period_micros > 0
    assert body["spend"]["spent_micros"][-1] == balance.spent_this_period_micros
    assert body["spend"]["spent_micros"] == sorted(body["spend"]["spent_micros"])
    with server.ledger.engine.connect() as connection:
        user_id = connection.scalar(select(User.id).where(User.name == "alice"))
        requests = connection.scalar(select(func.count()).where(BatchRequest.user_id == user_id))
        charges = dict(
            connection.execute(
                select(LedgerEntry.batch_id, -LedgerEntry.amount_micros).where(
                    LedgerEntry.user_id == user_id, LedgerEntry.kind == EntryKind.CHARGE
                )
            ).all()
        )
    assert body["requests"] == {
        "total": requests,
        "served": requests,
        "failed": 0,
        "abandoned": 0,
    }
    assert requests == 6
    assert len(body["recent"]) == 6
    shares: dict[str, int] = {}
    for request in body["recent"]:
        assert request["batch_charge_micros"] == charges.get(request["batch_id"], 0)
        assert 0 <= request["position"] < request["batch_size"]
        assert 0 <= request["request_charge_micros"] <= request["bid_micros"]
        shares[request["batch_id"]] = (
            shares.get(request["batch_id"], 0) + request["request_charge_micros"]
        )
    # Each request shows its share; the shares of a batch add up to the user's batch total.
    assert shares == {b: charges.get(b, 0) for b in shares}
    assert any(
        sum(r["batch_id"] == b for r in body["recent"]) > 1 and charges.get(b, 0) > 0
        for b in shares
    ), "no batch with several charged requests of alice: the split went untested"
    assert sorted(body["clearing"]["charge_micros"]) == sorted(
        charges.get(b, 0) for b in {r["batch_id"] for r in body["recent"]}
    )
    assert body["pace"] is None and body["projection"] is None  # a lifetime budget


def test_a_periodic_budget_gets_a_pacing_line_and_a_projection(server: RunningServer) -> None:
    key = server.ledger.create_user(
        "dora", budget_micros=5_000_000, period="month", timezone="Europe/Berlin"
    ).api_key
    send_traffic(server, {"dora": key, "eve": server.create_user("eve")}, rounds=4)
    with _sign_in(server, key) as client:
        body = client.get("/v1/dashboard/account").json()
    start = datetime.fromisoformat(body["period_start"])
    end = datetime.fromisoformat(body["period_end"])
    assert start.astimezone(UTC) <= datetime.now(UTC) < end
    assert start.tzinfo is not None and (end - start) >= timedelta(days=28)
    assert body["pace"]["spent_micros"] == [0, 5_000_000]
    assert body["pace"]["t"] == [start.timestamp(), end.timestamp()]
    charges = [e for e in server.ledger.entries("dora").entries if e.kind == "charge"]
    assert body["projection"]["charges"] == len(charges) >= 3
    assert body["projection"]["at_period_end_micros"] >= body["balance"]["spent_this_period_micros"]


def test_the_projection_is_exact_integer_arithmetic() -> None:
    start = datetime(2026, 3, 1, tzinfo=UTC)
    end = datetime(2026, 3, 5, tzinfo=UTC)
    quarter = start + (end - start) / 4
    assert _projection(1_000_001, 10_000_000, start, end, quarter, 3) == {
        "at_period_end_micros": 4_000_004,
        "budget_runs_out_at": None,
        "charges": 3,
    }
    projection = _projection(5_000_000, 10_000_000, start, end, quarter, 3)
    assert projection["at_period_end_micros"] == 20_000_000
    # Twice the pace: the budget runs out half-way through the period.
    assert projection["budget_runs_out_at"] == datetime(2026, 3, 3, tzinfo=UTC).isoformat()
    assert _projection(0, 0, start, end, start, 3)["at_period_end_micros"] == 0


def test_the_projection_takes_the_rate_over_the_users_own_activity() -> None:
    # Created at 16:01, 1.92 of a 5-credit day spent by 16:07: at that rate the budget is gone
    # at 16:16:37.5, not "2.85 by period end, within budget" (the rate over the whole day).
    day = datetime(2026, 12, 3, tzinfo=UTC)
    first, now = day + timedelta(hours=16, minutes=1), day + timedelta(hours=16, minutes=7)
    projection = _projection(1_920_000, 5_000_000, first, day + timedelta(days=1), now, 4)
    assert projection["at_period_end_micros"] == 1_920_000 + 1_920_000 * (473 * 60) // (6 * 60)
    assert projection["budget_runs_out_at"] == (now + timedelta(seconds=577.5)).isoformat()
    # Charges a moment ago are not a rate: the activity counts as at least a minute long.
    just = _projection(100_000, 5_000_000, now, now + timedelta(minutes=10), now, 3)
    assert just["at_period_end_micros"] == 100_000 + 100_000 * 10
    idle = _projection(0, 5_000_000, now, now + timedelta(hours=1), now, 3)
    assert idle["budget_runs_out_at"] is None


def test_one_or_two_charges_make_no_forecast() -> None:
    # 0.05 of a 1-credit day, once, a minute after the day began: at that "rate" the budget
    # would run out in 20 minutes, and the dashboard drew it in red.
    day = datetime(2026, 12, 3, tzinfo=UTC)
    now = day + timedelta(minutes=1)
    for charges in (1, 2):
        early = _projection(50_000, 1_000_000, day, day + timedelta(days=1), now, charges)
        assert early == {
            "at_period_end_micros": None,
            "budget_runs_out_at": None,
            "charges": charges,
        }
    third = _projection(50_000, 1_000_000, day, day + timedelta(days=1), now, 3)
    assert third["budget_runs_out_at"] == (day + timedelta(minutes=20)).isoformat()


def test_a_late_starter_who_spends_fast_is_told_the_budget_runs_out(server: RunningServer) -> None:
    key = server.ledger.create_user("ada", budget_micros=2_000_000, period="month").api_key
    send_traffic(server, {"ada": key, "eve": server.create_user("eve")}, rounds=4)
    with _sign_in(server, key) as client:
        body = client.get("/v1/dashboard/account").json()
    spent = body["balance"]["spent_this_period_micros"]
    assert spent > 0
    # Weeks of a month at the rate of the last few seconds: far beyond a budget of 2 credits.
    assert body["projection"]["at_period_end_micros"] > 2_000_000
    assert body["projection"]["budget_runs_out_at"] is not None
    # The spend line stays at 0 until the user's first charge, not from the period's start.
    times, amounts = body["spend"]["t"], body["spend"]["spent_micros"]
    assert amounts[0] == amounts[1] == 0 and times[1] > times[0]
    assert times[1] >= datetime.now(UTC).timestamp() - 120


def test_the_market_view_matches_the_ledger_and_needs_an_admin(server: RunningServer) -> None:
    keys = {name: server.create_user(name) for name in ("alice", "bob", "carol", "dave")}
    root = server.create_user("root", admin=True)
    send_traffic(server, keys, rounds=3)
    with _sign_in(server, root) as client:
        body = client.get("/v1/dashboard/market").json()
    with server.ledger.engine.connect() as connection:
        batches, requests, revenue, welfare = connection.execute(
            select(
                func.count(),
                func.sum(AuctionBatch.n),
                func.sum(AuctionBatch.revenue_micros),
                func.sum(AuctionBatch.welfare_micros),
            )
        ).one()
        charges = {
            (batch_id, name): -amount
            for batch_id, name, amount in connection.execute(
                select(LedgerEntry.batch_id, User.name, LedgerEntry.amount_micros)
                .join(User)
                .where(LedgerEntry.kind == EntryKind.CHARGE)
            )
        }
        # The posted floor (on by default) taken at settlement; nothing here fails, so none
        # is given back.
        floors = -connection.execute(
            select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0)).where(
                LedgerEntry.kind == EntryKind.FLOOR
            )
        ).scalar_one()
    assert body["totals"] == {
        "batches": batches,
        "requests": requests,
        "revenue_micros": revenue,
        "fees_micros": 0,  # no request fee on this server
        "floors_micros": floors,
        "welfare_micros": welfare,
        "served": requests,
        "failed": 0,
        "abandoned": 0,
    }
    assert requests == 24 and revenue > 0
    series = body["series"]
    assert len(series["t"]) == body["window_seconds"] // body["bucket_seconds"]
    assert round(sum(series["batches_per_second"]) * body["bucket_seconds"]) == batches
    assert sum(series["revenue_micros_per_minute"]) * body["bucket_seconds"] // 60 == revenue
    assert any(rate is not None and 0 < rate <= 1 for rate in series["cache_hit_rate"])
    assert any(ttft for ttft in series["ttft_mean_ms"] if ttft is not None)
    clearing = body["clearing"]
    assert sum(clearing["charge_micros"]) == revenue
    assert all(0 <= p <= 1 for p in clearing["priority"])
    spenders = body["top_spenders"]
    spent = {name: server.ledger.balance(name).spent_this_period_micros for name in keys}
    assert [s["user"] for s in spenders] == sorted(
        (n for n in spent if spent[n] > 0), key=lambda n: (-spent[n], n)
    )
    assert {s["user"]: s["spent_micros"] for s in spenders} == {
        n: v for n, v in spent.items() if v > 0
    }
    assert sum(charges.values()) == revenue
    assert body["ledger"]["open_holds"] == {"count": 0, "amount_micros": 0, "oldest": None}
    assert body["ledger"]["failed_writes_total"] == 0
    assert body["replicas"][0]["this"] and body["replicas"][0]["up"]
    # Nobody bid low: the prefix watch has nobody to show.
    assert body["prefix_squatters"] == {"low_bid_micros": 1_000, "accounts": []}
    # The reconciliation runs in the background and is reported on a later poll.
    deadline = time.monotonic() + 20
    with _sign_in(server, root) as client:
        while (reconcile := client.get("/v1/dashboard/market").json()["ledger"]["reconcile"])[
            "ok"
        ] is None:
            assert time.monotonic() < deadline, reconcile
            time.sleep(0.1)
    assert reconcile["ok"] is True and reconcile["accounts_checked"] == 5
    assert reconcile["finished_at"] is not None
    with server.client(keys["alice"]) as client:
        assert client.get("/v1/dashboard/market").status_code == 403
    with server.client(root) as client:  # the bearer key works as on every other endpoint
        assert client.get("/v1/dashboard/market").status_code == 200


def test_answers_stay_small_with_10000_batches(tmp_path: Path) -> None:
    # SQLite only: seeding 10,000 batches into PostgreSQL takes half a minute on a busy machine,
    # and the queries are the same SQL on both backends (checked on both above).
    with (
        migrated_database("sqlite", tmp_path) as db,
        running_server(db) as server,
    ):
        _check_answers_stay_small(server)


def _check_answers_stay_small(server: RunningServer) -> None:
    names = [f"user{i:02d}" for i in range(12)]
    keys = create_users_before(server.ledger, names, timedelta(hours=1))
    root = server.create_user("root", admin=True)
    charged = seed_batches(server.ledger, names, 10_000, span=timedelta(minutes=12))
    assert server.ledger.reconcile().ok
    with _sign_in(server, root) as client:
        started = time.perf_counter()
        market = client.get("/v1/dashboard/market")
        market_seconds = time.perf_counter() - started
    body = market.json()
    assert body["totals"]["batches"] == 10_000 and body["totals"]["requests"] == 20_000
    assert body["totals"]["revenue_micros"] == sum(charged.values())
    assert len(body["clearing"]["priority"]) == 1500  # the newest points, not all 20,000
    assert len(market.content) < 150_000
    top = body["top_spenders"]
    assert [s["spent_micros"] for s in top] == sorted(charged.values(), reverse=True)[:10]
    with server.client(keys["user00"]) as client:
        started = time.perf_counter()
        account = client.get("/v1/dashboard/account")
        account_seconds = time.perf_counter() - started
    mine = account.json()
    assert mine["requests"]["total"] == 20_000 // 12 + (1 if 20_000 % 12 else 0)
    assert mine["spend"]["spent_micros"][-1] == charged["user00"]
    assert len(mine["spend"]["t"]) <= 122 and len(mine["recent"]) == 20
    assert len(account.content) < 60_000
    # Generous bounds for a loaded machine; the browser test holds the page to 1 s.
    assert market_seconds < 2 and account_seconds < 2, (market_seconds, account_seconds)


class _PageAudit(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.inline_scripts = 0
        self.script_sources: list[str] = []
        self.handlers: list[str] = []
        self.styles = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        self.handlers += [n for n in names if n.startswith("on")]
        self.styles += "style" in names or tag == "style"
        if tag == "script":
            if names.get("src"):
                self.script_sources.append(names["src"] or "")
            else:
                self.inline_scripts += 1


def test_the_page_is_static_same_origin_and_under_a_strict_policy(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        page = client.get("/dashboard")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
        assert directives["script-src"] == "'self'" and directives["default-src"] == "'none'"
        assert directives["connect-src"] == "'self'" and directives["frame-ancestors"] == "'none'"
        assert "unsafe" not in policy and "http" not in policy
        assert page.headers["x-content-type-options"] == "nosniff"
        audit = _PageAudit()
        audit.feed(page.text)
        assert audit.inline_scripts == 0 and not audit.handlers and audit.styles == 0
        assert audit.script_sources == ["/dashboard/app.js"]
        for asset in ("app.js", "charts.js", "format.js", "style.css", "favicon.svg"):
            reply = client.get(f"/dashboard/{asset}")
            assert reply.status_code == 200, asset
            assert reply.headers["content-security-policy"] == policy
            # Nothing is fetched from anywhere but this server.
            assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", reply.text), asset
        for missing in ("../app.py", "secrets.txt", "%2e%2e%2fapp.py"):
            assert client.get(f"/dashboard/{missing}").status_code == 404
    schema = httpx.get(server.url + "/openapi.json").json()
    documented = {path for path in schema["paths"] if path.startswith("/v1/dashboard")}
    assert documented == {"/v1/dashboard/session", "/v1/dashboard/account", "/v1/dashboard/market"}
    assert "/dashboard" not in schema["paths"]


def test_the_session_store_expires_and_bounds_its_size() -> None:
    store = SessionStore(ttl=0.2, size=3)
    first = store.create("alice")
    session = store.get(first)
    assert session is not None and session.user == "alice"
    assert first not in store._sessions and len(first) >= 43  # only digests are kept
    time.sleep(0.25)
    assert store.get(first) is None
    tokens = [store.create(f"user{i}") for i in range(5)]
    assert len(store) == 3
    assert store.get(tokens[-1]) is not None and store.get(tokens[0]) is None
    # A user signing in again and again replaces its own oldest sessions, nobody else's.
    store = SessionStore(ttl=60, size=100, per_user=2)
    others = store.create("bob")
    mallory = [store.create("mallory") for _ in range(50)]
    assert len(store) == 3 and store.get(others) is not None
    assert store.get(mallory[-1]) is not None and store.get(mallory[0]) is None


def test_no_key_reaches_the_servers_logs(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    # uvicorn's loggers do not propagate to the root: the capture is attached to each.
    names = ("uvicorn", "uvicorn.access", "uvicorn.error", "inference_auctions")
    loggers = [logging.getLogger(name) for name in names]
    caplog.set_level(logging.DEBUG)
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
        logger.addHandler(caplog.handler)
    try:
        alice = server.create_user("alice")
        root = server.create_user("root", admin=True)
        send_traffic(server, {"alice": alice}, rounds=1)
        with _sign_in(server, alice) as client:
            assert client.get("/v1/dashboard/account").status_code == 200
            assert client.get("/v1/dashboard/market").status_code == 403
            client.delete("/v1/dashboard/session")
        with _sign_in(server, root) as client:
            assert client.get("/v1/dashboard/market").status_code == 200
        refused = httpx.post(
            server.url + "/v1/dashboard/session",
            headers={"Authorization": f"Bearer {alice}x"},
            timeout=60,
        )
        assert refused.status_code == 401
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(caplog.handler)
            logger.setLevel(level)
    access = [r for r in caplog.records if r.name == "uvicorn.access"]
    assert any("/v1/dashboard/session" in r.getMessage() for r in access)  # the log was on
    text = "\n".join(r.getMessage() for r in caplog.records)
    # `iak_<prefix>_<secret>`: the secret itself may contain "_", so split off the two parts
    # before it, never after the last "_" (which may leave a character or two).
    secret = alice.split("_", 2)[2]
    assert len(secret) > 20
    assert alice not in text and secret not in text and root not in text


@pytest.mark.anyio
async def test_the_market_view_flags_zero_bids_under_other_users_prefixes(
    server: RunningServer,
) -> None:
    keys = {name: server.create_user(name) for name in ("alice", "bob")}
    mallory = server.create_user("mallory")
    root = server.create_user("root", admin=True)

    async def send(key: str, rid: str, text: str, bid: str) -> None:
        async with server.async_client(key) as client:
            body = {
                "text": text,
                "bid": bid,
                "rid": rid,
                "sampling_params": {"max_new_tokens": 2},
            }
            reply = await client.post("/generate", json=body)
            assert reply.status_code == 200, reply.text

    for index in range(4):
        await asyncio.gather(
            *(
                send(
                    key,
                    f"{name}-{index}",
                    f"A long shared system prompt. {name} asks {index}.",
                    "0.5",
                )
                for name, key in keys.items()
            ),
            # Micro-bids under the others' shared prefix, and one with a fresh prompt (a zero
            # bid waits outside the auction, apart from bidders: a decoy must bid to join them).
            send(mallory, f"m-{index}", f"A long shared system prompt. decoy {index}.", "0.000001"),
            send(mallory, f"f-{index}", f"Nothing alike {index}.", "0.000001"),
        )
    with _sign_in(server, root) as client:
        body = client.get("/v1/dashboard/market").json()
    flagged = body["prefix_squatters"]["accounts"]
    assert [entry["user"] for entry in flagged] == ["mallory"]
    (entry,) = flagged
    assert entry["low_bid_requests"] == 8
    assert 1 <= entry["under_others"] <= 4 and entry["other_users"] >= 1


def test_a_session_ends_with_the_key_that_bought_it(server: RunningServer) -> None:
    # Before: a session outlived a rotated key, and the incident response (disable, rotate,
    # enable) with no dashboard call while disabled left it valid.
    alice = server.create_user("alice")
    with _sign_in(server, alice) as client:
        assert client.get("/v1/dashboard/account").status_code == 200
        new_key = server.ledger.rotate_api_key("alice")
        ended = client.get("/v1/dashboard/account")
        assert ended.status_code == 401 and "rotated" in ended.json()["error"]["message"]
    with _sign_in(server, new_key) as client:
        assert client.get("/v1/dashboard/account").status_code == 200
        server.ledger.disable_user("alice")
        newer_key = server.ledger.rotate_api_key("alice")
        server.ledger.enable_user("alice")
        assert client.get("/v1/dashboard/account").status_code == 401  # enable revives nothing
    with _sign_in(server, newer_key) as client:
        server.ledger.disable_user("alice")
        server.ledger.enable_user("alice")  # no dashboard call while disabled
        assert client.get("/v1/dashboard/account").status_code == 401
    assert server.ledger.reconcile().ok


def test_a_flood_of_sign_ins_cannot_sign_the_operator_out() -> None:
    store = SessionStore(ttl=60, size=10, per_user=2)
    operator = store.create("root", admin=True)
    for i in range(200):  # many accounts, each within its own per-user bound
        store.create(f"user{i}")
    assert len(store) == 10
    session = store.get(operator)
    assert session is not None and session.user == "root"


@pytest.mark.anyio
async def test_requests_whose_client_left_are_counted_by_outcome(
    ledger_db: MigratedDatabase,
) -> None:
    # Before: the views counted served and failed only; an abandoned request (charged, its
    # client gone after its first token) was in the total and in neither count.
    long = {"max_new_tokens": 6_000, "ignore_eos": True}
    with running_server(
        ledger_db,
        emulator_time_scale=60.0,  # a first token takes about half a second
        batch_size=2,
        max_wait_ms=10_000,
        engine_stream_interval=1,
    ) as server:
        keys = {name: server.create_user(name) for name in ("al", "bo")}
        root = server.create_user("root", admin=True)

        async def leave_after(name: str, bid: str, chunks: int) -> None:
            body = {"rid": "r", "text": f"{name} " * 50, "bid": bid, "sampling_params": long}
            async with (
                server.async_client(keys[name]) as client,
                client.stream("POST", "/generate", json={**body, "stream": True}) as response,
            ):
                assert response.status_code == 200
                seen = 0
                async for line in response.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen > chunks:
                        return

        async def both() -> None:
            await asyncio.gather(leave_after("al", "2", 1), leave_after("bo", "1", 0))

        await both()
        deadline = time.monotonic() + 10
        while any(
            (found := server.ledger.find_request(f"{n}/r")) is None or found.status == "scheduled"
            for n in keys
        ):
            assert time.monotonic() < deadline, "the requests were never settled"
            time.sleep(0.05)
        with server.client(keys["al"]) as client:
            mine = client.get("/v1/dashboard/account").json()["requests"]
        with server.client(root) as client:
            totals = client.get("/v1/dashboard/market").json()["totals"]
        audit_money_against_answers(server.ledger, {"al/r": "abandoned", "bo/r": "failed"})
    assert mine == {"total": 1, "served": 0, "failed": 0, "abandoned": 1}
    assert (totals["requests"], totals["served"], totals["failed"], totals["abandoned"]) == (
        2,
        0,
        1,
        1,
    )
