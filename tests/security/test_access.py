"""Access: a user's key reaches only that user's money and requests; admin routes need the
admin key; keys are stored only as hashes and compared in constant time; rate limits are
per key. Every case runs against a real server on both ledger backends."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from inference_auctions.billing import apikeys
from inference_auctions.billing import keys as billing_keys
from inference_auctions.billing.models import ApiKey, Base, User
from tests.db_fixtures import MigratedDatabase
from tests.security.conftest import ledger_snapshot
from tests.server.harness import RunningServer, running_server

# Every route with the key it needs: None for public ones.
ROUTES: list[tuple[str, str, str | None]] = [
    ("POST", "/generate", "user"),
    ("POST", "/v1/completions", "user"),
    ("POST", "/v1/chat/completions", "user"),
    ("GET", "/v1/models", None),  # routers probe it without a key, as SGLang's
    ("GET", "/v1/ledger/balance", "user"),
    ("GET", "/v1/ledger/entries", "user"),
    ("GET", "/v1/ledger/summary", "user"),
    ("GET", "/v1/budget", "user"),
    ("GET", "/v1/spend", "user"),
    ("GET", "/v1/market/prices", "user"),
    ("GET", "/v1/market/rule", "user"),
    ("GET", "/v1/market/pool", "user"),
    ("GET", "/v1/market/tiers", "user"),
    ("GET", "/v1/admin/users", "admin"),
    ("POST", "/v1/admin/users", "admin"),
    ("POST", "/v1/admin/users/{name}/disable", "admin"),
    ("POST", "/v1/admin/users/{name}/enable", "admin"),
    ("POST", "/v1/admin/users/{name}/rotate-key", "admin"),
    ("GET", "/v1/admin/users/{name}/keys", "admin"),
    ("POST", "/v1/admin/users/{name}/keys", "admin"),
    ("DELETE", "/v1/admin/users/{name}/keys/{key_name}", "admin"),
    ("PUT", "/v1/admin/users/{name}/limits", "admin"),
    ("POST", "/v1/admin/users/{name}/grant", "admin"),
    ("POST", "/v1/admin/users/{name}/adjust", "admin"),
    ("GET", "/v1/admin/actions", "admin"),
    ("PUT", "/v1/admin/users/{name}/budget", "admin"),
    ("GET", "/v1/admin/users/{name}/balance", "admin"),
    ("GET", "/v1/admin/reconcile", "admin"),
    ("GET", "/v1/admin/timings", "admin"),
    ("GET", "/health", None),
    ("GET", "/health/live", None),
    ("GET", "/metrics", None),
    ("GET", "/model_info", "user"),
    ("GET", "/server_info", None),  # likewise
    ("GET", "/version", None),
    ("GET", "/get_model_info", "user"),
    ("GET", "/get_server_info", None),
    ("GET", "/flush_cache", "admin"),
    ("POST", "/flush_cache", "admin"),
    ("POST", "/v1/dashboard/session", "user"),
    ("GET", "/v1/dashboard/session", "user"),
    ("DELETE", "/v1/dashboard/session", None),  # signing out needs nothing and always works
    ("GET", "/v1/dashboard/account", "user"),
    ("GET", "/v1/dashboard/market", "admin"),
]

# What user B sends to every route, aimed at user A's things where a route names any.
ATTACKS: dict[str, Any] = {
    "/generate": {"text": "A's prompt", "bid": "0.1", "rid": "a-1"},
    "/v1/completions": {"prompt": "A's prompt", "bid": "0.1", "rid": "a-1", "max_tokens": 2},
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "A's prompt"}],
        "bid": "0.1",
        "rid": "a-1",
        "max_tokens": 2,
    },
    "/v1/admin/users": {"name": "alice", "budget": "1000", "admin": True},
    "/v1/admin/users/{name}/budget": {"budget": "0"},
    "/v1/admin/users/{name}/keys": {"name": "mine"},
    "/v1/admin/users/{name}/limits": {"requests_per_minute": 1},
    "/v1/admin/users/{name}/grant": {"amount": "1000"},
    "/v1/admin/users/{name}/adjust": {"amount": "1000", "reason": "mine", "key": "k"},
}


def _call(client: httpx.Client, method: str, path: str, target: str = "alice") -> httpx.Response:
    body = ATTACKS.get(path)
    return client.request(method, path.format(name=target, key_name="default"), json=body)


def _spend(
    server: RunningServer, key: str, rid: str, text: str, bid: str = "0.5"
) -> dict[str, Any]:
    with server.client(key) as client:
        reply = client.post(
            "/generate",
            json={"text": text, "bid": bid, "rid": rid, "sampling_params": {"max_new_tokens": 3}},
        )
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def test_every_route_is_classified_here(server: RunningServer) -> None:
    # A new route must say here who may call it, so that the tests below cover it.
    spec = httpx.get(server.url + "/openapi.json").json()
    listed = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    known = {(method, path) for method, path, _ in ROUTES}
    assert listed == known, f"add to ROUTES: {listed - known}; gone: {known - listed}"


def test_no_key_or_a_garbage_key_is_401_everywhere_but_health_and_metrics(
    server: RunningServer,
) -> None:
    alice = server.create_user("alice")
    server.create_user("root", admin=True)
    near_miss = alice[:-1] + ("A" if alice[-1] != "A" else "B")  # the last character differs
    prefix, secret = alice.removeprefix("iak_").split("_", 1)
    bad_headers: list[dict[str, str]] = [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer garbage"},
        {"Authorization": f"Basic {alice}"},
        {"Authorization": f"Bearer {near_miss}"},
        {"Authorization": f"Bearer {alice[:-1]}"},
        {"Authorization": f"Bearer {alice}x"},
        {"Authorization": f"Bearer iak_{prefix}_"},  # the right prefix, no secret
        {"Authorization": f"Bearer iak_{'0' * len(prefix)}_{secret}"},  # the secret, no prefix
        {"Authorization": f"Bearer {alice.upper()}"},
        {"X-API-Key": alice},
    ]
    before = ledger_snapshot(server.ledger.engine)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for method, path, needs in ROUTES:
            for headers in bad_headers:
                reply = client.request(
                    method,
                    path.format(name="alice", key_name="default"),
                    json=ATTACKS.get(path),
                    headers=headers,
                )
                if needs is None:
                    assert reply.status_code == 200, (path, headers)
                    continue
                assert reply.status_code == 401, (method, path, headers, reply.text)
                assert reply.json()["error"]["type"] == "unauthenticated"
                assert reply.headers["www-authenticate"] == "Bearer"
    assert ledger_snapshot(server.ledger.engine) == before


def test_admin_routes_are_403_for_a_user_key_and_change_nothing(server: RunningServer) -> None:
    alice = server.create_user("alice")
    bob = server.create_user("bob")
    root = server.create_user("root", admin=True)
    _spend(server, alice, "a-1", "A's prompt")
    before = ledger_snapshot(server.ledger.engine)
    for key in (alice, bob):
        with server.client(key) as client:
            for method, path, needs in ROUTES:
                if needs != "admin":
                    continue
                answers = set()
                for target in ("alice", "bob", "root", "nobody"):
                    reply = _call(client, method, path, target)
                    assert reply.status_code == 403, (method, path, target, reply.text)
                    assert reply.json()["error"]["type"] == "forbidden"
                    answers.add(reply.text)
                assert len(answers) == 1  # nothing tells which users exist
    assert ledger_snapshot(server.ledger.engine) == before
    # The same calls with the admin key do reach the routes.
    with server.client(root) as client:
        assert client.get("/v1/admin/users/alice/balance").json()["user"] == "alice"
        assert {u["name"] for u in client.get("/v1/admin/users").json()["users"]} == {
            "alice",
            "bob",
            "root",
        }


def test_a_user_sees_and_spends_only_their_own_money(server: RunningServer) -> None:
    alice = server.create_user("alice", budget=7_000_000)
    bob = server.create_user("bob", budget=3_000_000)
    _spend(server, alice, "a-1", "A's secret prompt")
    _spend(server, alice, "a-2", "A's second prompt")
    alice_view = server.ledger.entries("alice").entries
    alice_ids = {e.id for e in alice_view}
    with server.client(alice) as client:
        alice_cursor = client.get("/v1/ledger/entries", params={"limit": 1}).json()["next_cursor"]
    with server.client(bob) as client:
        balance = client.get("/v1/ledger/balance").json()
        assert balance["user"] == "bob"
        assert balance["balance_micros"] == 3_000_000 and balance["held_micros"] == 0
        pages = [
            {},
            {"limit": 1000},
            {"kind": "hold"},
            {"kind": "charge"},
            {"since": "2000-01-01T00:00:00Z"},
            {"cursor": "0"},
            {"cursor": alice_cursor},  # A's cursor shows B's entries after it, not A's
        ]
        for params in pages:
            entries = client.get("/v1/ledger/entries", params=params).json()["entries"]
            assert not {e["id"] for e in entries} & alice_ids, params
            assert all(not e["rid"] or e["rid"].startswith("bob/") for e in entries)
            assert all(e["amount_micros"] == 3_000_000 for e in entries if e["kind"] == "grant")
        for by in ("day", "week", "month"):
            rows = client.get("/v1/ledger/summary", params={"by": by}).json()["rows"]
            assert sum(r["granted_micros"] for r in rows) == 3_000_000
            assert sum(r["charged_micros"] for r in rows) == 0
        # There is no parameter that selects another user: unknown ones change nothing.
        for params in ({"user": "alice"}, {"name": "alice"}, {"user_id": "1"}):
            assert client.get("/v1/ledger/balance", params=params).json()["user"] == "bob"
            entries = client.get("/v1/ledger/entries", params=params).json()["entries"]
            assert not {e["id"] for e in entries} & alice_ids
    assert server.ledger.entries("alice").entries == alice_view
    # The public endpoints name no user.
    public = httpx.get(server.url + "/metrics").text + httpx.get(server.url + "/health").text
    assert "alice" not in public and "bob" not in public
    assert server.ledger.balance("bob").balance_micros == 3_000_000


def test_a_rid_reused_by_another_user_is_a_separate_request(server: RunningServer) -> None:
    alice = server.create_user("alice")
    bob = server.create_user("bob")
    carol = server.create_user("carol")
    first = _spend(server, alice, "shared-1", "A's secret prompt", bid="0.7")
    alices = [
        h for h in ledger_snapshot(server.ledger.engine)["holds"] if h[0].startswith("alice/")
    ]
    # A's exact payload under A's rid: B's own request, cleared and held for B, not A's answer.
    copy = _spend(server, bob, "shared-1", "A's secret prompt", bid="0.7")
    assert copy["meta_info"]["auction"]["batch_id"] != first["meta_info"]["auction"]["batch_id"]
    # Another payload under A's rid: a new request, not a 409 that would tell C A used it.
    other = _spend(server, carol, "shared-1", "C's own prompt", bid="0.2")
    assert other["meta_info"]["auction"]["bid_micros"] == 200_000
    holds = {row[0]: row for row in ledger_snapshot(server.ledger.engine)["holds"]}
    assert {rid for rid in holds if rid.endswith("/shared-1")} == {
        "alice/shared-1",
        "bob/shared-1",
        "carol/shared-1",
    }
    assert [h for rid, h in holds.items() if rid.startswith("alice/")] == alices
    # Each user's rid now names that user's request: a conflict is with one's own payload.
    with server.client(bob) as client:
        body = {"text": "C's own prompt", "bid": "0.2", "rid": "shared-1"}
        conflict = client.post("/generate", json={**body, "sampling_params": {"max_new_tokens": 3}})
    assert conflict.status_code == 409 and "C's own prompt" not in conflict.text
    # A's replay still gets A's own answer.
    assert _spend(server, alice, "shared-1", "A's secret prompt", bid="0.7") == first


def _secret(key: str) -> str:
    """The random part of `iak_<prefix>_<secret>` (which may itself hold underscores)."""
    return key[len("iak_") + apikeys.PREFIX_LENGTH + 1 :]


def test_api_keys_are_stored_only_as_hashes(server: RunningServer) -> None:
    keys = {name: server.create_user(name, admin=name == "root") for name in ("alice", "root")}
    with server.client(keys["root"]) as client:
        created = client.post("/v1/admin/users", json={"name": "carol", "budget": "1"}).json()
        keys["carol"] = created["api_key"]
        listing = client.get("/v1/admin/users").text
    rotated = server.ledger.rotate_api_key("alice")
    old_alice, keys["alice"] = keys["alice"], rotated
    with server.ledger.engine.connect() as connection:
        active = (
            select(User.name, ApiKey.key_prefix, ApiKey.key_hash)
            .join(ApiKey, ApiKey.user_id == User.id)
            .where(ApiKey.revoked_at.is_(None))
        )
        rows = {row.name: row for row in connection.execute(active)}
    dump = repr(ledger_snapshot(server.ledger.engine))
    for name, key in keys.items():
        secret = _secret(key)
        assert rows[name].key_hash == hashlib.sha256(key.encode()).hexdigest()
        assert key.removeprefix("iak_").startswith(rows[name].key_prefix)
        for text in (key, secret, secret[:16], secret[-16:]):
            assert text not in dump, name
            assert text not in listing
    assert _secret(old_alice) not in dump
    assert "key_hash" not in listing and rows["alice"].key_hash not in listing
    # Only the users table holds key material at all.
    key_columns = {
        f"{table.name}.{column.name}"
        for table in Base.metadata.sorted_tables
        for column in table.columns
        if "key" in column.name and "idempotency" not in column.name
    }
    assert key_columns == {"api_keys.key_prefix", "api_keys.key_hash"}
    with server.client(old_alice) as client:
        assert client.get("/v1/ledger/balance").status_code == 401
    with server.client(rotated) as client:
        assert client.get("/v1/ledger/balance").json()["user"] == "alice"


def test_keys_are_compared_in_constant_time(server: RunningServer) -> None:
    assert "hmac.compare_digest(" in inspect.getsource(apikeys.matches)
    assert "apikeys.matches(" in inspect.getsource(billing_keys.key_owner)
    key = server.create_user("alice")
    digest = apikeys.hash_key(key)
    assert apikeys.matches(key, digest)
    last = key[-1]
    for wrong in {"A", "B", "0", "_", "-"} - {last}:
        near = key[:-1] + wrong
        assert apikeys.key_prefix(near) == apikeys.key_prefix(key)
        assert not apikeys.matches(near, digest)
        assert server.ledger.authenticate(near) is None
    for wrong in (key[:-1], key + "x", key.upper(), "", "iak_", key.replace("iak_", "iak-")):
        assert server.ledger.authenticate(wrong) is None
    user = server.ledger.authenticate(key)
    assert user is not None and user.name == "alice"


@pytest.mark.anyio
async def test_rate_limits_are_per_key(ledger_db: MigratedDatabase) -> None:
    with running_server(ledger_db, rate_limit_per_second=1, rate_limit_burst=2) as server:
        alice = server.create_user("alice")
        bob = server.create_user("bob")
        before = ledger_snapshot(server.ledger.engine)
        with server.client(alice) as a, server.client(bob) as b:
            assert [a.get("/v1/ledger/balance").status_code for _ in range(2)] == [200, 200]
            refused = a.post("/generate", json={"text": "x", "bid": "1"})
            limited = a.get("/v1/ledger/balance")
            for reply in (refused, limited):
                assert reply.status_code == 429
                assert reply.json()["error"]["type"] == "rate_limited"
                assert 1 <= int(reply.headers["retry-after"]) <= 2
            assert ledger_snapshot(server.ledger.engine) == before  # no hold for a 429
            # Bob has his own bucket, untouched by Alice's.
            assert [b.get("/v1/ledger/balance").status_code for _ in range(2)] == [200, 200]
            assert b.get("/v1/ledger/balance").status_code == 429
            # Requests without a valid key are not charged to anybody's bucket.
            with httpx.Client(base_url=server.url) as anonymous:
                for _ in range(5):
                    assert anonymous.get("/v1/ledger/balance").status_code == 401

        async def burst(key: str, count: int) -> list[int]:
            async with server.async_client(key) as client:
                replies = await asyncio.gather(
                    *(client.get("/v1/ledger/balance") for _ in range(count))
                )
            return [reply.status_code for reply in replies]

        carol = server.create_user("carol")
        statuses = await burst(carol, 6)
        assert statuses.count(200) == 2 and statuses.count(429) == 4
