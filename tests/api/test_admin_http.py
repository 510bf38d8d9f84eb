"""The admin API beside the CLI, through HTTP on a real server (SQLite and PostgreSQL):
enabling, keys, money, rate limits, and the record of who did what."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.server.harness import RunningServer

GENERATE = {"text": "Hello", "bid": "0", "sampling_params": {"max_new_tokens": 8}}


@pytest.fixture
def admin(server: RunningServer) -> Callable[[], httpx.Client]:
    """Clients with the key of the admin `root`."""
    key = server.create_user("root", admin=True)
    return lambda: server.client(key)


def test_an_admin_enables_a_user_and_rotates_its_key(
    server: RunningServer, admin: Callable[[], httpx.Client]
) -> None:
    old = server.create_user("alice")
    with admin() as root:
        assert root.post("/v1/admin/users/alice/disable").json()["disabled"] is True
        assert root.post("/v1/admin/users/alice/enable").json()["disabled"] is False
        rotated = root.post("/v1/admin/users/alice/rotate-key").json()
        assert rotated["name"] == "default" and rotated["api_key"].startswith("iak_")
        assert root.post("/v1/admin/users/zed/enable").status_code == 404
    with server.client(old) as client:
        gone = client.get("/v1/ledger/balance")
        assert gone.status_code == 401 and gone.json()["error"]["code"] == "invalid_api_key"
    with server.client(rotated["api_key"]) as client:
        assert client.get("/v1/ledger/balance").json()["user"] == "alice"
        # A user's key is no admin key.
        refused = client.post("/v1/admin/users/alice/enable")
        assert refused.status_code == 403


def test_named_keys_are_listed_created_revoked_and_expire(
    server: RunningServer, admin: Callable[[], httpx.Client]
) -> None:
    server.create_user("alice")
    soon = datetime.now(UTC) + timedelta(seconds=1.5)
    with admin() as root:
        ci = root.post("/v1/admin/users/alice/keys", json={"name": "ci"})
        assert ci.status_code == 201, ci.text
        short = root.post(
            "/v1/admin/users/alice/keys", json={"name": "short", "expires_at": soon.isoformat()}
        ).json()
        assert datetime.fromisoformat(short["expires_at"]) == soon
        again = root.post("/v1/admin/users/alice/keys", json={"name": "ci"})
        assert again.status_code == 409 and again.json()["error"]["param"] == "name"
        listed = root.get("/v1/admin/users/alice/keys").json()["keys"]
        assert [k["name"] for k in listed] == ["default", "ci", "short"]
        assert all("api_key" not in k for k in listed)
        assert ci.json()["api_key"].startswith(f"iak_{ci.json()['prefix']}_")
        past = root.post(
            "/v1/admin/users/alice/keys",
            json={"name": "late", "expires_at": "2020-01-01T00:00:00Z"},
        )
        assert past.status_code == 400 and past.json()["error"]["param"] == "expires_at"
        naive = root.post(
            "/v1/admin/users/alice/keys", json={"name": "n", "expires_at": "2099-01-01T00:00:00"}
        )
        assert naive.status_code == 400 and naive.json()["error"]["param"] == "expires_at"
        bad_name = root.post("/v1/admin/users/alice/keys", json={"name": "a b"})
        assert bad_name.status_code == 400 and bad_name.json()["error"]["param"] == "key_name"
    with server.client(ci.json()["api_key"]) as client:
        assert client.get("/v1/ledger/balance").json()["user"] == "alice"
    with admin() as root:
        revoked = root.delete("/v1/admin/users/alice/keys/ci").json()
        assert revoked["revoked_at"] is not None
        assert root.delete("/v1/admin/users/alice/keys/ci").status_code == 404
        everything = root.get("/v1/admin/users/alice/keys", params={"revoked": "true"}).json()
        assert [k["name"] for k in everything["keys"]] == ["default", "ci", "short"]
    # Past its expiry (and the 2 s a server remembers a key), the short key is refused.
    time.sleep(max(0.0, (soon - datetime.now(UTC)).total_seconds()) + 2.1)
    with server.client(short["api_key"]) as client:
        assert client.get("/v1/ledger/balance").status_code == 401
    with server.client(ci.json()["api_key"]) as client:
        assert client.get("/v1/ledger/balance").status_code == 401


def test_grants_and_adjustments_count_once_per_key(
    server: RunningServer, admin: Callable[[], httpx.Client]
) -> None:
    key = server.create_user("alice", budget=1_000_000)
    with admin() as root:
        first = root.post("/v1/admin/users/alice/grant", json={"amount": "2", "reason": "bonus"})
        assert first.status_code == 200, first.text
        assert (first.json()["kind"], first.json()["amount_micros"]) == ("grant", 2_000_000)
        replay = root.post("/v1/admin/users/alice/grant", json={"amount": "2"}).json()
        assert replay["id"] == first.json()["id"] and replay["replayed"] is True
        other = root.post("/v1/admin/users/alice/grant", json={"amount": "3"})
        assert other.status_code == 409 and other.json()["error"]["param"] == "amount"
        body = {"amount": "0.5", "debit": True, "reason": "refund by hand", "key": "ticket-7"}
        debit = root.post("/v1/admin/users/alice/adjust", json=body).json()
        assert debit["amount_micros"] == -500_000 and debit["replayed"] is False
        again = root.post("/v1/admin/users/alice/adjust", json=body).json()
        assert again["id"] == debit["id"] and again["replayed"] is True
        changed = root.post("/v1/admin/users/alice/adjust", json={**body, "amount": "0.6"})
        assert changed.status_code == 409 and changed.json()["error"]["param"] == "key"
        too_much = root.post(
            "/v1/admin/users/alice/adjust", json={**body, "amount": "100", "key": "t-8"}
        )
        assert too_much.status_code == 400 and too_much.json()["error"]["param"] == "amount"
        negative = root.post(
            "/v1/admin/users/alice/adjust", json={**body, "amount": "-1", "key": "t-9"}
        )
        assert negative.status_code == 400 and negative.json()["error"]["param"] == "amount"
        no_key = root.post("/v1/admin/users/alice/adjust", json={"amount": "1", "reason": "x"})
        assert no_key.status_code == 400 and no_key.json()["error"]["param"] == "key"
    with server.client(key) as client:
        assert client.get("/v1/ledger/balance").json()["available_micros"] == 2_500_000


def test_a_users_requests_per_minute_are_limited_as_openai_says(
    server: RunningServer, admin: Callable[[], httpx.Client]
) -> None:
    key = server.create_user("alice")
    with admin() as root:
        limits = root.put("/v1/admin/users/alice/limits", json={"requests_per_minute": 2})
        assert limits.json()["requests_per_minute"] == 2
        assert limits.json()["tokens_per_minute"] is None
        for bad in (0, "x", 10**7):
            refused = root.put("/v1/admin/users/alice/limits", json={"requests_per_minute": bad})
            assert refused.status_code == 400, bad
            assert refused.json()["error"]["param"] == "requests_per_minute"
    with server.client(key) as client:
        first = client.get("/v1/ledger/balance")
        generated = client.post("/generate", json=GENERATE)
        limited = client.get("/v1/ledger/balance")
    # Answers carry OpenAI's headers too, counting down.
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert generated.status_code == 200
    assert generated.headers["x-ratelimit-limit-requests"] == "2"
    assert generated.headers["x-ratelimit-remaining-requests"] == "0"
    assert "retry-after" not in generated.headers
    assert limited.status_code == 429
    assert limited.json()["error"]["type"] == "rate_limited"
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"  # as OpenAI names it
    headers = limited.headers
    assert 1 <= int(headers["retry-after"]) <= 60
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert "x-ratelimit-limit-tokens" not in headers


def test_a_users_tokens_per_minute_are_limited(
    server: RunningServer, admin: Callable[[], httpx.Client]
) -> None:
    key = server.create_user("alice")
    with admin() as root:
        root.put("/v1/admin/users/alice/limits", json={"tokens_per_minute": 100})
    body = {**GENERATE, "sampling_params": {"max_new_tokens": 60}}
    with server.client(key) as client:
        first = client.post("/generate", json=body)
        assert first.status_code == 200, first.text
        counted = first.json()["meta_info"]["prompt_tokens"] + 60
        assert first.headers["x-ratelimit-remaining-tokens"] == str(100 - counted)
        assert first.headers["x-ratelimit-reset-tokens"].endswith("s")
        second = client.post("/generate", json=body)
        huge = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200},
        )
    assert second.status_code == 429
    assert second.headers["x-ratelimit-limit-tokens"] == "100"
    assert second.headers["x-ratelimit-remaining-tokens"] == str(100 - counted)
    assert "x-ratelimit-limit-requests" not in second.headers
    assert int(second.headers["retry-after"]) >= 1
    assert huge.status_code == 400 and huge.json()["error"]["param"] == "max_tokens"


def test_every_admin_action_is_readable_with_who_did_it(
    server: RunningServer, admin: Callable[[], httpx.Client]
) -> None:
    server.create_user("alice")
    with admin() as root:
        bob_created = root.post("/v1/admin/users", json={"name": "bob", "budget": "1"})
        assert bob_created.json()["period"] == "day"  # what the SDK's pacing needs
        root.post("/v1/admin/users/bob/keys", json={"name": "ci"})
        root.put("/v1/admin/users/bob/limits", json={"tokens_per_minute": 5000})
        root.post("/v1/admin/users/bob/adjust", json={"amount": "1", "reason": "r", "key": "k1"})
        root.post("/v1/admin/users/alice/disable")
        bob = root.get("/v1/admin/actions", params={"user": "bob"}).json()["actions"]
        everyone = root.get("/v1/admin/actions").json()["actions"]
        page = root.get("/v1/admin/actions", params={"after": everyone[1]["id"], "limit": 1})
        assert root.get("/v1/admin/actions", params={"limit": 0}).status_code == 400
    assert [(a["actor"], a["action"]) for a in bob] == [
        ("root", "create_user"),
        ("root", "create_key"),
        ("root", "set_limits"),
        ("root", "adjust"),
    ]
    assert bob[1]["details"]["key_name"] == "ci" and "api_key" not in str(bob)
    # The users the test harness made went through the library, and say so.
    assert [(a["actor"], a["action"], a["user"]) for a in everyone[:2]] == [
        ("library", "create_user", "root"),
        ("library", "create_user", "alice"),
    ]
    assert everyone[-1]["action"] == "disable_user" and everyone[-1]["actor"] == "root"
    assert [a["id"] for a in page.json()["actions"]] == [everyone[2]["id"]]
