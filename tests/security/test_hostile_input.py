"""Hostile input, case by case: the auction core, then the HTTP API of a real server.

The auction core either clears a batch correctly or refuses it with an `AuctionInputError`
that names the request and the field; it never crashes, and it clears 10^5 requests.

The server answers every hostile request with a 4xx that says why, and a refused request
changes nothing in the ledger: oversized prompts and bodies, deeply repeated prefixes,
unicode and control characters, unpaired surrogates, negative and non-finite numbers in every
numeric field, hostile request ids, duplicate and replayed request ids.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import socket
import time
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_auctions.server.api.bodies import MAX_BODY_BYTES
from inference_auctions.server.api.schemas import SamplingParams
from inference_auctions.server.auction import (
    AuctionInputError,
    AuctionOutcome,
    AuctionRequest,
    run_auction,
)
from inference_auctions.server.auction.reference import reference_order, reference_payments
from tests.auction.exact import exact_payments
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.security.conftest import ledger_snapshot
from tests.server.harness import RunningServer, running_server

GENERATION_PATHS = ["/generate", "/v1/completions", "/v1/chat/completions"]


# The auction core


def _check_outcome(batch: list[AuctionRequest], outcome: AuctionOutcome) -> None:
    """What every cleared batch satisfies, whatever its input looked like."""
    assert sorted(outcome.order) == sorted(r.rid for r in batch)
    assert [outcome.positions[rid] for rid in outcome.order] == list(range(len(batch)))
    bids_by_user: Counter[str] = Counter()
    for request in batch:
        bids_by_user[request.user] += int(request.bid)
    assert set(outcome.payments) == set(bids_by_user)
    for user, payment in outcome.payments.items():
        # Nobody pays more than their bids (fractional priority is at most 1).
        assert 0 <= payment <= bids_by_user[user]


_TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"]) | st.sampled_from("\x00\n\u202e\ufeff"),
    max_size=8,
)
_HOSTILE_IDS = st.one_of(_TEXT, st.none(), st.integers(), st.binary(max_size=4))
_HOSTILE_TOKENS = st.one_of(
    st.lists(st.integers(min_value=-(2**70), max_value=2**70), max_size=6),
    st.lists(st.integers(min_value=0, max_value=3), max_size=6),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=3),
    st.lists(st.booleans(), min_size=1, max_size=3),
    st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=1, max_size=3),
    _TEXT,
    st.binary(max_size=4),
    st.none(),
    st.integers(),
    st.builds(lambda xs: np.array(xs, dtype=np.uint64), st.lists(st.integers(0, 2**64 - 1))),
    st.builds(lambda xs: np.array(xs, dtype=np.int8), st.lists(st.integers(-128, 127))),
    st.builds(lambda xs: np.array(xs, dtype=np.float32), st.lists(st.floats(width=32))),
)
_HOSTILE_BIDS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.fractions(),
    st.booleans(),
    st.none(),
    _TEXT,
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(np.float64, st.floats()),
)


@st.composite
def _hostile_batches(draw: st.DrawFn) -> list[Any]:
    size = draw(st.integers(min_value=0, max_value=6))
    batch: list[Any] = []
    for index in range(size):
        if draw(st.integers(0, 19)) == 0:
            batch.append(draw(st.one_of(st.none(), st.integers(), _TEXT, st.tuples(_TEXT))))
            continue
        clean = draw(st.booleans())
        batch.append(
            AuctionRequest(
                rid=f"r{index}" if clean else draw(_HOSTILE_IDS),
                user=draw(st.sampled_from(["a", "b"])) if clean else draw(_HOSTILE_IDS),
                tokens=draw(_HOSTILE_TOKENS),
                bid=draw(_HOSTILE_BIDS),
            )
        )
    return batch


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(_hostile_batches())
def test_the_auction_core_clears_or_refuses_by_name_never_crashes(batch: list[Any]) -> None:
    try:
        outcome = run_auction(batch)
    except AuctionInputError as error:
        assert error.field in {"request", "rid", "user", "tokens", "bid"}
        assert str(error).startswith("request ")
        return
    _check_outcome(batch, outcome)


@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.lists(st.sampled_from([0, 1, 2**63 - 1]), max_size=4),
            st.integers(min_value=0, max_value=2**80),
        ),
        max_size=7,
    )
)
def test_huge_bids_and_token_ids_are_cleared_exactly(
    drawn: list[tuple[str, list[int], int]],
) -> None:
    # Far past int64 and float precision: any overflow or rounding would show here.
    batch = [
        AuctionRequest(f"r{i}", user, tokens, bid) for i, (user, tokens, bid) in enumerate(drawn)
    ]
    outcome = run_auction(batch)
    _check_outcome(batch, outcome)
    where = {request.rid: index for index, request in enumerate(batch)}
    assert [where[rid] for rid in outcome.order] == reference_order(batch, [r.bid for r in batch])
    exact = reference_payments(batch)
    assert exact_payments(batch) == exact
    assert outcome.payments == {user: math.floor(value) for user, value in exact.items()}


@pytest.mark.parametrize(
    "bid",
    [
        -1,
        -(2**70),
        float("nan"),
        float("inf"),
        float("-inf"),
        1.0,
        Decimal("NaN"),
        Decimal("1"),
        Fraction(1, 2),
        True,
        None,
        "1",
        np.float64(1),
        np.int64(-1),
    ],
    ids=repr,
)
def test_a_bid_that_is_not_a_non_negative_int_is_refused_by_name(bid: object) -> None:
    batch = [AuctionRequest("ok", "a", [1, 2], 5), AuctionRequest("bad", "b", [1, 3], bid)]  # type: ignore[arg-type]
    with pytest.raises(AuctionInputError) as refused:
        run_auction(batch)
    assert (refused.value.rid, refused.value.field) == ("bad", "bid")


def test_duplicate_rids_in_a_batch_are_refused() -> None:
    batch = [AuctionRequest("same", "a", [1], 1), AuctionRequest("same", "b", [2], 2)]
    with pytest.raises(AuctionInputError, match="duplicate") as refused:
        run_auction(batch)
    assert refused.value.field == "rid"


def test_unicode_and_control_characters_in_rids_and_users_are_kept_verbatim() -> None:
    names = ["\x00", "a\nb", "\u202eevil", "日本語", "🙂" * 50, "x" * 10_000, "\ufeff", " "]
    batch = [AuctionRequest(f"{name}#{i}", name, [1, i], i + 1) for i, name in enumerate(names)]
    outcome = run_auction(batch)
    _check_outcome(batch, outcome)
    assert set(outcome.users.values()) == set(names)


def test_a_batch_of_100_000_requests_clears() -> None:
    rng = random.Random(20_240_601)
    system = list(range(1, 200))  # one long shared system prompt, then branches
    batch = []
    for i in range(100_000):
        shape = i % 4
        if shape == 0:
            tokens = system[: rng.randrange(1, len(system))]
        elif shape == 1:
            tokens = system + [rng.randrange(1_000) for _ in range(rng.randrange(8))]
        elif shape == 2:
            tokens = [7] * rng.randrange(1, 40)  # deeply repeated, nested prefixes
        else:
            tokens = [rng.randrange(2**31) for _ in range(rng.randrange(1, 16))]
        batch.append(AuctionRequest(f"r{i}", f"u{i % 5_000}", tokens, rng.randrange(10**9)))
    started = time.perf_counter()
    outcome = run_auction(batch)
    elapsed = time.perf_counter() - started
    assert elapsed < 120, elapsed
    assert sorted(outcome.order) == sorted(r.rid for r in batch)
    assert outcome.size == 100_000
    assert 0 <= outcome.revenue <= sum(r.bid for r in batch)


def test_deeply_repeated_prefixes_are_served_contiguously() -> None:
    # Every prompt is a prefix of the next: a chain of 800 nested nodes, plus identical
    # copies, a prompt of 50,000 repeated tokens and unrelated prompts in between.
    rng = random.Random(7)
    batch = [AuctionRequest(f"n{k}", f"u{k}", [7] * k, rng.randrange(10**6)) for k in range(1, 801)]
    batch += [
        AuctionRequest(f"c{k}", f"v{k % 3}", [7] * 400, rng.randrange(10**6)) for k in range(200)
    ]
    batch += [AuctionRequest("long", "w", [7] * 50_000, 10**6)]
    batch += [AuctionRequest(f"o{k}", "x", [8, k], rng.randrange(10**6)) for k in range(100)]
    outcome = run_auction(batch)
    _check_outcome(batch, outcome)
    nested = sorted(outcome.positions[r.rid] for r in batch if r.tokens and r.tokens[0] == 7)
    assert nested == list(range(nested[0], nested[0] + len(nested)))
    assert outcome.tree.depth >= 400


# The HTTP API of a real server


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[RunningServer]:
    """A server on SQLite, for what concerns the HTTP layer rather than the ledger backend."""
    with migrated_database("sqlite", tmp_path) as db, running_server(db) as running:
        yield running


def _post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=content, headers={"content-type": "application/json"})


def _refused(response: httpx.Response, status: int = 400, says: str = "") -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] != "internal_error"
    assert says in error["message"], error
    return error


def _prompt_body(path: str, prompt: Any, **extra: Any) -> dict[str, Any]:
    if path == "/generate":
        key = "input_ids" if isinstance(prompt, list) else "text"
        body = {key: prompt, "sampling_params": {"max_new_tokens": 2}}
    elif path == "/v1/completions":
        body = {"prompt": prompt, "max_tokens": 2}
    else:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
    return {**body, "bid": "0.01", **extra}


def test_prompts_over_the_size_limits_are_refused_before_any_hold(server: RunningServer) -> None:
    key = server.create_user("mallory")
    limits = server.settings
    over_chars = "a" * (limits.max_prompt_chars + 1)
    # Under the character limit, over the token limit: one token per "a " pair.
    over_tokens = "a " * (limits.max_prompt_tokens + 1)
    assert len(over_tokens) <= limits.max_prompt_chars
    over_ids = [1] * (limits.max_prompt_tokens + 1)
    before = ledger_snapshot(server.ledger.engine)
    with server.client(key) as client:
        for path in GENERATION_PATHS:
            _refused(_post(client, path, _prompt_body(path, over_chars)), says="the limit is")
            _refused(_post(client, path, _prompt_body(path, over_tokens)), says="tokens")
        for path in ["/generate", "/v1/completions"]:
            _refused(_post(client, path, _prompt_body(path, over_ids)), says="tokens")
        # A whole body over 16 MiB, of valid JSON.
        huge = _prompt_body("/generate", "a" * (MAX_BODY_BYTES + 1))
        _refused(_post(client, "/generate", huge), says="the limit is")
    assert ledger_snapshot(server.ledger.engine) == before


def test_a_body_declared_over_the_limit_is_refused_before_it_is_read(
    sqlite_server: RunningServer,
) -> None:
    key = sqlite_server.create_user("mallory")
    host, port = sqlite_server.url.removeprefix("http://").split(":")
    head = (
        f"POST /generate HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {MAX_BODY_BYTES * 64}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(head.encode() + b'{"text": "')  # and never the rest of a GiB
        reply = b""
        while b"the limit is" not in reply and len(reply) < 65536:
            chunk = connection.recv(65536)  # times out if the server waits for the body
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert b"the limit is" in reply


def test_a_streamed_body_over_the_limit_is_cut_off(sqlite_server: RunningServer) -> None:
    key = sqlite_server.create_user("mallory")

    def chunks() -> Iterator[bytes]:  # chunked transfer: no length is declared
        yield b'{"text": "'
        for _ in range(4 * MAX_BODY_BYTES >> 20):
            yield b"a" * (1 << 20)

    with sqlite_server.client(key) as client:
        error = _refused(client.post("/generate", content=chunks()), says="the limit is")
    # The server stopped reading just past the limit instead of buffering all 64 MiB.
    read = int(error["message"].split(" bytes")[0].rsplit(" ", 1)[-1].replace(",", ""))
    assert MAX_BODY_BYTES < read < 2 * MAX_BODY_BYTES, error["message"]


@pytest.mark.anyio
async def test_deeply_repeated_prefixes_clear_settle_and_reconcile(server: RunningServer) -> None:
    keys = {name: server.create_user(name) for name in ("ann", "ben", "cat")}
    names = list(keys)
    # Each prompt is a prefix of the next: one chain of nested prompts, up to ~12k tokens.
    requests = [
        (
            names[i % 3],
            {
                "text": "la " * (1 + 400 * i),
                "bid": f"0.{i + 1:02d}",
                "sampling_params": {"max_new_tokens": 1},
            },
        )
        for i in range(30)
    ]

    async def send() -> list[httpx.Response]:
        clients = {name: server.async_client(key) for name, key in keys.items()}
        try:
            return list(
                await asyncio.gather(*(clients[n].post("/generate", json=b) for n, b in requests))
            )
        finally:
            for client in clients.values():
                await client.aclose()

    replies = await send()
    assert [r.status_code for r in replies] == [200] * len(requests), [r.text for r in replies]
    bids: Counter[tuple[str, str]] = Counter()
    charges: dict[tuple[str, str], int] = {}
    for (name, body), reply in zip(requests, replies, strict=True):
        auction = reply.json()["meta_info"]["auction"]
        assert auction["bid_micros"] == int(Decimal(body["bid"]) * 10**6)
        bids[name, auction["batch_id"]] += auction["bid_micros"]
        charges[name, auction["batch_id"]] = auction["charge_micros"]
    for user_batch, charge in charges.items():
        assert 0 <= charge <= bids[user_batch]  # a user's charge in a batch: at most its bids
    assert server.ledger.reconcile().ok
    for name in names:
        assert server.ledger.balance(name).held_micros == 0
    with server.client(keys["ann"]) as client:
        nested = b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        _refused(_post(client, "/generate", nested), says="nested too deeply")


PRINTABLE_BUT_ODD = [
    "nul\x00inside",
    "bell\x07 escape\x1b[31m red",
    "\r\n\t\x0b\x0c",
    "right-to-left \u202eoverride",
    "zero\u200bwidth\u200djoiner",
    "\ufeffbyte order mark",
    "combining e\u0301\u0301\u0301",
    "日本語のプロンプト",
    "emoji 🙂👩‍👩‍👧 flags 🇫🇷",
    "astral \U0010ffff \U000e0001",
    "line\u2028separator\u2029",
    "\x7f\x80\x9f c1 controls",
]


def test_unicode_and_control_characters_in_prompts_are_served(
    sqlite_server: RunningServer,
) -> None:
    key = sqlite_server.create_user("olga")
    with sqlite_server.client(key) as client:
        for path in GENERATION_PATHS:
            for prompt in PRINTABLE_BUT_ODD:
                for stream in (False, True):
                    body = _prompt_body(path, prompt, stream=stream, stop=[prompt])
                    if path == "/generate":
                        body["sampling_params"]["stop"] = [prompt]
                        del body["stop"]
                    reply = _post(client, path, body)
                    assert reply.status_code == 200, (path, prompt, reply.text[:300])
                    if stream:
                        assert reply.text.rstrip().endswith("data: [DONE]")
                        assert '"error"' not in reply.text
                    else:
                        reply.json()
    assert sqlite_server.ledger.reconcile().ok


def test_unpaired_surrogates_are_refused_and_change_nothing(server: RunningServer) -> None:
    key = server.create_user("sam")
    admin = server.create_user("root", admin=True)
    escaped = [
        b'{"text": "\\ud800", "bid": "0.1"}',
        b'{"text": "ok \\udfff tail", "bid": "0.1"}',
        b'{"text": "\\ude00\\ud83d", "bid": "0.1"}',  # a pair in the wrong order
        b'{"text": "x", "bid": "0.1", "sampling_params": {"stop": ["\\ud800"]}}',
        b'{"text": "x", "bid": "0.1", "rid": "\\ud800"}',
        b'{"text": "x", "bid": "0.1", "\\ud800": 1}',
    ]
    raw = [
        b'{"text": "\xed\xa0\x80", "bid": "0.1"}',  # the UTF-8 form of U+D800, not valid UTF-8
        '{"text": "\ud800", "bid": "0.1"}'.encode("utf-16-le", "surrogatepass"),
    ]
    before = ledger_snapshot(server.ledger.engine)
    with server.client(key) as client:
        for body in escaped + raw:
            reply = _post(client, "/generate", body)
            assert reply.status_code == 400, (body, reply.text[:300])
            assert reply.json()["error"]["type"] == "invalid_request"
        for path in ("/v1/completions", "/v1/chat/completions"):
            body = json.dumps(_prompt_body(path, "x\ud800y")).encode()  # json escapes it
            _refused(_post(client, path, body), says="surrogate")
    with server.client(admin) as client:
        _refused(_post(client, "/v1/admin/users", b'{"name": "\\ud800"}'), says="surrogate")
    assert ledger_snapshot(server.ledger.engine) == before
    # A correctly paired surrogate (an emoji written as an escape) is ordinary text.
    with server.client(key) as client:
        reply = _post(client, "/generate", b'{"text": "\\ud83d\\ude00", "bid": "0.1"}')
        assert reply.status_code == 200, reply.text


HOSTILE_RIDS: list[Any] = [
    "",
    " ",
    "a b",
    "a/b",  # the ledger keys a request as "<user>/<rid>": a slash could reach another user's
    "../../etc/passwd",
    "a\x00b",
    "tab\there",
    "ä",
    "\u202eevil",
    "🙂",
    "x" * 97,
    "a\nb",
    123,
    ["a"],
    {"a": 1},
    True,
]


def test_hostile_request_ids_are_refused_and_change_nothing(server: RunningServer) -> None:
    key = server.create_user("rita")
    before = ledger_snapshot(server.ledger.engine)
    with server.client(key) as client:
        for path in GENERATION_PATHS:
            for rid in HOSTILE_RIDS:
                error = _refused(_post(client, path, _prompt_body(path, "hi", rid=rid)))
                assert error["param"] == "rid", (path, rid, error)
    assert ledger_snapshot(server.ledger.engine) == before


# Values no numeric field of the API takes: not finite, out of any range, or too long to parse.
NEVER_A_NUMBER = [
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e400",
    b"-1e400",
    b"1e-500",
    b"1e999999999",
    b"-1e-999999999",
    b"1" + b"0" * 5_000,
    b"-" + b"9" * 5_000,
    b"1" + b"0" * 5_000 + b".5",
]
NEGATIVE = [b"-1", b"-0.5", b"-1e20"]


def _numeric_cases() -> list[tuple[str, str, bytes]]:
    """(path, what a negative number does there, a JSON body with `@` where the number goes)."""
    completion = b'{"prompt": "x", "max_tokens": 2, "bid": "0.01", %s}'
    chat = b'{"messages": [{"role": "user", "content": "x"}], "bid": "0.01", %s}'
    sampling = b'{"text": "x", "bid": "0.01", "sampling_params": {%s}}'
    cases = [
        ("/generate", "refused", b'{"text": "x", "bid": @}'),
        ("/generate", "refused", b'{"input_ids": [1, @], "bid": "0.01"}'),
        ("/v1/completions", "refused", b'{"prompt": [1, @], "bid": "0.01"}'),
        ("/v1/completions", "refused", b'{"prompt": "x", "bid": "0.01", "max_tokens": @}'),
        ("/v1/chat/completions", "refused", chat % b'"max_tokens": @'),
        ("/v1/chat/completions", "refused", chat % b'"max_completion_tokens": @'),
    ]
    for field, negative in [
        (b'"bid": @', "refused"),
        (b'"temperature": @', "refused"),
        (b'"top_p": @', "refused"),
        (b'"seed": @', "allowed"),
    ]:
        cases.append(("/v1/completions", negative, completion.replace(b'"bid": "0.01", %s', field)))
        cases.append(("/v1/chat/completions", negative, chat.replace(b'"bid": "0.01", %s', field)))
    for field, negative in [
        (b'"max_new_tokens": @', "refused"),
        (b'"min_new_tokens": @', "refused"),
        (b'"temperature": @', "refused"),
        (b'"top_p": @', "refused"),
        (b'"top_k": @', "refused below -1"),
        (b'"min_p": @', "refused"),
        (b'"frequency_penalty": @', "refused below -2"),
        (b'"presence_penalty": @', "refused below -2"),
        (b'"repetition_penalty": @', "refused"),
        (b'"stop_token_ids": [@]', "refused"),
        (b'"sampling_seed": @', "allowed"),
        (b'"logit_bias": {"5": @}', "allowed"),
        (b'"custom_params": {"k": [@]}', "allowed"),
    ]:
        cases.append(("/generate", negative, sampling % field))
    return cases


def test_negative_and_non_finite_numbers_are_refused_in_every_numeric_field(
    server: RunningServer,
) -> None:
    key = server.create_user("nina")
    admin = server.create_user("root", admin=True)
    before = ledger_snapshot(server.ledger.engine)
    with server.client(key) as client:
        for path, negative, template in _numeric_cases():
            values = {
                "refused": [*NEVER_A_NUMBER, *NEGATIVE],
                "refused below -1": [*NEVER_A_NUMBER, b"-2", b"-1e20"],
                "refused below -2": [*NEVER_A_NUMBER, b"-3", b"-1e20"],
                "allowed": NEVER_A_NUMBER,
            }[negative]
            for value in values:
                body = template.replace(b"@", value)
                reply = _post(client, path, body)
                assert reply.status_code == 400, (path, body[:200], reply.text[:300])
                assert reply.json()["error"]["type"] == "invalid_request"
            # A money field also refuses the same values written as strings.
            if b'"bid": @' in template:
                for text in [
                    b'"-1"',
                    b'"NaN"',
                    b'"Infinity"',
                    b'"1e400"',
                    b'"' + b"1" * 5_000 + b'"',
                ]:
                    _refused(_post(client, path, template.replace(b"@", text)), says="bid")
        for params in [
            {"limit": "-1"},
            {"limit": "NaN"},
            {"limit": "Infinity"},
            {"limit": "1e400"},
            {"limit": "1" * 5_000},
            {"since": "NaN"},
            {"since": "-Infinity"},
            {"until": "1e400"},
            {"since": "-" + "9" * 5_000},
        ]:
            _refused(client.get("/v1/ledger/entries", params=params))
        _refused(client.get("/v1/ledger/summary", params={"since": "NaN"}))
    with server.client(admin) as client:
        for value in [*NEVER_A_NUMBER, *NEGATIVE, b'"-1"', b'"NaN"', b'"' + b"9" * 5_000 + b'"']:
            for body in [
                b'{"name": "new-user", "budget": @}',
                b'{"name": "new-user", "budget": "1", "batch_cap": @}',
            ]:
                _refused(_post(client, "/v1/admin/users", body.replace(b"@", value)))
            reply = client.put(
                "/v1/admin/users/nina/budget",
                content=b'{"budget": @}'.replace(b"@", value),
                headers={"content-type": "application/json"},
            )
            _refused(reply)
    assert ledger_snapshot(server.ledger.engine) == before


def test_ledger_queries_refuse_cursors_and_dates_out_of_range(server: RunningServer) -> None:
    key = server.create_user("quinn")
    with server.client(key) as client:
        for cursor in ["\u00b2", "\u0663", "1" * 200, "9" * 19, "-1", " 1", "1\n", "0x10"]:
            error = _refused(client.get("/v1/ledger/entries", params={"cursor": cursor}))
            assert error["param"] == "cursor"
        # Valid ISO 8601 with no UTC form: before year 1 or after year 9999 once shifted.
        for field, moment in [
            ("since", "0001-01-01T00:00:00+23:59"),
            ("until", "9999-12-31T23:59:59-23:59"),
            ("since", "0001-01-01T00:00:00+01:00"),
        ]:
            for path in ("/v1/ledger/entries", "/v1/ledger/summary"):
                error = _refused(client.get(path, params={field: moment}))
                assert error["param"] == field
        # The extremes themselves are fine, on both ledger backends.
        wide = {"since": "0001-01-01T00:00:00+00:00", "until": "9999-12-31T23:59:59+00:00"}
        for path in ("/v1/ledger/entries", "/v1/ledger/summary"):
            assert client.get(path, params=wide).status_code == 200
        assert client.get("/v1/ledger/entries", params={"cursor": "9" * 18}).json()["entries"] == []


def test_sampling_parameters_reach_the_engine_as_plain_json() -> None:
    # The exact JSON reader turns 0.5 into Decimal("0.5"); what goes to SGLang over HTTP must
    # still encode as standard JSON (no Decimal, no NaN), or the request fails at the engine.
    params = SamplingParams.model_validate(
        {
            "temperature": Decimal("0.5"),
            "logit_bias": {"5": Decimal("-1.5")},
            "custom_params": {"a": Decimal("0.25"), "b": [Decimal("1e-3"), {"c": Decimal("2")}]},
        }
    )
    sent = json.loads(json.dumps(params.for_engine(), allow_nan=False))
    assert sent["custom_params"] == {"a": 0.25, "b": [0.001, {"c": 2.0}]}
    for bad in [
        {"logit_bias": {"5": Decimal("NaN")}},
        {"custom_params": {"a": [Decimal("Infinity")]}},
    ]:
        with pytest.raises(ValueError, match="finite"):
            SamplingParams.model_validate(bad)


@pytest.mark.anyio
async def test_one_rid_in_flight_with_different_payloads_gets_one_hold(
    server: RunningServer,
) -> None:
    key = server.create_user("dora")
    bodies = [
        {
            "text": "same rid",
            "bid": f"0.{i + 1}",
            "rid": "dup-1",
            "sampling_params": {"max_new_tokens": 2},
        }
        for i in range(6)
    ]

    async def race() -> list[httpx.Response]:
        async with server.async_client(key) as client:
            return list(await asyncio.gather(*(client.post("/generate", json=b) for b in bodies)))

    replies = await race()
    statuses = sorted(r.status_code for r in replies)
    assert statuses == [200] + [409] * 5, [r.text[:200] for r in replies]
    winner = next(r for r in replies if r.status_code == 200).json()["meta_info"]["auction"]
    holds = [e for e in server.ledger.entries("dora").entries if e.kind == "hold"]
    assert [h.amount_micros for h in holds] == [winner["bid_micros"]]
    assert server.ledger.balance("dora").held_micros == 0
    assert server.ledger.reconcile().ok


def test_a_replayed_rid_with_another_payload_is_409_and_holds_nothing_more(
    ledger_db: MigratedDatabase,
) -> None:
    body = {
        "text": "the original",
        "bid": "0.5",
        "rid": "replay-1",
        "sampling_params": {"max_new_tokens": 3},
    }
    others = [
        {**body, "bid": "0.6"},
        {**body, "text": "something else"},
        {**body, "sampling_params": {"max_new_tokens": 4}},
        {**body, "sampling_params": {"max_new_tokens": 3, "temperature": 0.5}},
        {key: value for key, value in body.items() if key != "text"} | {"input_ids": [1, 2]},
    ]
    with running_server(ledger_db) as server:
        key = server.create_user("rex")
        with server.client(key) as client:
            first = _post(client, "/generate", body)
            assert first.status_code == 200, first.text
            settled = ledger_snapshot(server.ledger.engine)
            for other in others:
                _refused(_post(client, "/generate", other), 409, "different payload")
            # The same rid on another endpoint is another payload too.
            completion = {
                "prompt": "the original",
                "bid": "0.5",
                "rid": "replay-1",
                "max_tokens": 3,
            }
            _refused(_post(client, "/v1/completions", completion), 409)
            # The same payload again is the same request: its answer again, no new charge.
            again = _post(client, "/generate", body)
            assert again.status_code == 200 and again.json() == first.json()
            assert ledger_snapshot(server.ledger.engine) == settled
    # A new process has forgotten the answer: the replay is refused from the ledger's record.
    with running_server(ledger_db) as server, server.client(key) as client:
        for replay in [body, *others]:
            assert _refused(_post(client, "/generate", replay), 409)["param"] == "rid"
        assert ledger_snapshot(server.ledger.engine) == settled
