"""An in-memory auction server that speaks the HTTP contract, for `httpx.MockTransport`.

It batches concurrent requests (a batch closes when `batch_size` requests have joined or after
`wait` seconds), charges every batch `charge_share` of its bids (1 = the adversarial case of
charging the full bid), treats the rid as an idempotency key, and records what it saw so tests
can check the SDK's promises from the server's side.

With a price `floor`, a request bidding at least the floor pays it plus `charge_share` of the
rest of its bid, and each request reports its own charge (floor included), booked as a `charge`
entry per batch and a `floor` entry per request; a bid below the floor pays nothing. `rule` and
`pool`, when set, are the bodies of `GET /v1/market/rule` and `GET /v1/market/pool` (404 when
None, as on a server without them).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

import httpx

API_KEY = "sk-test"
# Queued behaviours for the next attempts on a path: a response to return, an exception to
# raise before processing, or DROP to process the request and then lose the response.
DROP = "drop-after-processing"
Scripted = httpx.Response | Exception | str


@dataclass
class _Batch:
    id: str
    bids: dict[str, int] = field(default_factory=dict)
    closed: bool = False
    charge: int = 0
    event: asyncio.Event | None = None
    shares: dict[str, int] = field(default_factory=dict)


class FakeServer:
    """The server side of the contract, with the invariants it observed."""

    def __init__(
        self,
        *,
        batch_size: int = 1,
        charge_share: Fraction = Fraction(1),
        wait: float = 1.0,
        stream_error: bool = False,
        floor: int = 0,
    ) -> None:
        self.batch_size = batch_size
        self.floor = floor
        self.rule: dict[str, Any] | None = None
        self.pool: dict[str, Any] | None = None
        self.charge_share = charge_share
        self.wait = wait
        self.stream_error = stream_error
        self.cond = threading.Condition()
        self.script: dict[str, deque[Scripted]] = {}
        self.attempts: list[httpx.Request] = []
        self.results: dict[str, tuple[str, dict[str, Any]]] = {}
        self.batches: list[_Batch] = []
        self.open: _Batch | None = None
        self.total_charged = 0
        self.in_flight = 0
        self.max_committed = 0
        self.balance: dict[str, Any] = {
            "user": "alice",
            "balance_micros": 10**9,
            "held_micros": 0,
            "available_micros": 10**9,
            "spent_this_period_micros": 0,
            "period": "none",
            "period_start": None,
        }
        self.entries: list[dict[str, Any]] = []
        self.budget_period: dict[str, Any] = {
            "user": "alice",
            "period": "day",
            "timezone": "UTC",
            "period_start": "2030-01-01T00:00:00+00:00",
            "period_end": "2030-01-02T00:00:00+00:00",
            "now": "2030-01-01T12:00:00+00:00",
            "grant_micros": 10_000_000,
            "spent_micros": 0,
            "remaining_micros": 10_000_000,
            "balance_micros": 10**9,
            "held_micros": 0,
            "available_micros": 10**9,
            "auctions": 0,
        }

    # -- scripting ---------------------------------------------------------------------------

    def queue(self, path: str, *behaviours: Scripted) -> None:
        """Make the next attempts on `path` behave as given, in order."""
        self.script.setdefault(path, deque()).extend(behaviours)

    def attempts_on(self, path: str) -> list[httpx.Request]:
        """The attempts received on `path`."""
        return [r for r in self.attempts if _route(r) == path]

    def rids(self, path: str = "/generate") -> list[str]:
        """The rid of every attempt on `path`, in order."""
        return [json.loads(r.content)["rid"] for r in self.attempts_on(path)]

    # -- entry points ------------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Synchronous handler."""
        early, body = self._begin(request)
        if early is not None:
            return early
        if body is None:
            return self._ledger(request)
        batch = self._join(body)
        with self.cond:
            if not self.cond.wait_for(lambda: batch.closed, timeout=self.wait):
                self._close(batch)
        return self._finish(request, body, batch)

    async def ahandle(self, request: httpx.Request) -> httpx.Response:
        """Asynchronous handler: waits for the batch without blocking the event loop."""
        await request.aread()
        early, body = self._begin(request)
        if early is not None:
            return early
        if body is None:
            return self._ledger(request)
        batch = self._join(body)
        assert batch.event is not None
        try:
            await asyncio.wait_for(batch.event.wait(), timeout=self.wait)
        except TimeoutError:
            with self.cond:
                self._close(batch)
        return self._finish(request, body, batch)

    # -- the request path --------------------------------------------------------------------

    def _begin(self, request: httpx.Request) -> tuple[httpx.Response | None, dict[str, Any] | None]:
        with self.cond:
            self.attempts.append(request)
            if request.headers.get("authorization") != f"Bearer {API_KEY}":
                return _error(401, "authentication_error", "bad key"), None
            script = self.script.get(_route(request))
            behaviour = script.popleft() if script else None
        if isinstance(behaviour, Exception):
            raise behaviour
        if isinstance(behaviour, httpx.Response):
            return behaviour, None
        if request.method == "GET":
            return None, None
        body = json.loads(request.content)
        body["_drop"] = behaviour == DROP
        with self.cond:
            cached = self.results.get(body["rid"])
        if cached is not None:
            fingerprint, payload = cached
            if fingerprint != _fingerprint(body):
                return _error(409, "idempotency_conflict", "rid reused"), None
            return self._render(request, body, payload), None
        return None, body

    def _join(self, body: dict[str, Any]) -> _Batch:
        bid = int(Decimal(body["bid"]) * 1_000_000)
        with self.cond:
            self.in_flight += bid
            self.max_committed = max(self.max_committed, self.in_flight + self.total_charged)
            if self.open is None:
                event = _event_if_async()
                self.open = _Batch(id=f"batch-{len(self.batches)}", event=event)
                self.batches.append(self.open)
            batch = self.open
            batch.bids[body["rid"]] = bid
            if len(batch.bids) >= self.batch_size:
                self._close(batch)
            return batch

    def _close(self, batch: _Batch) -> None:
        # Called with the lock held.
        if batch.closed:
            return
        batch.closed = True
        if self.open is batch:
            self.open = None
        total = sum(batch.bids.values())
        self.in_flight -= total
        if self.floor:
            self._charge_over_floor(batch)
        else:
            batch.charge = int(total * self.charge_share)
            self._book("charge", batch.charge, batch.id)
        self.total_charged += batch.charge
        self.cond.notify_all()
        if batch.event is not None:
            batch.event.set()

    def _charge_over_floor(self, batch: _Batch) -> None:
        # Called with the lock held: the floor and a share of the rest from each entrant.
        rolling = 0
        for rid, bid in batch.bids.items():
            if bid < self.floor:
                batch.shares[rid] = 0
                continue
            part = int((bid - self.floor) * self.charge_share)
            batch.shares[rid] = self.floor + part
            rolling += part
            self._book("floor", self.floor, batch.id, rid)
        batch.charge = sum(batch.shares.values())
        self._book("charge", rolling, batch.id)

    def _book(self, kind: str, amount: int, batch_id: str, rid: str | None = None) -> None:
        self.entries.append(
            {
                "id": len(self.entries) + 1,
                "kind": kind,
                "amount_micros": -amount,
                "batch_id": batch_id,
                "rid": rid,
                "reason": None,
                "created_at": "2030-01-01T00:00:00+00:00",
            }
        )

    def _finish(
        self, request: httpx.Request, body: dict[str, Any], batch: _Batch
    ) -> httpx.Response:
        rid = body["rid"]
        ordered = sorted(batch.bids, key=lambda r: -batch.bids[r])
        n = len(ordered)
        position = ordered.index(rid)
        auction = {
            "batch_id": batch.id,
            "position": position,
            "batch_size": n,
            "priority": 1.0 if n == 1 else (n - 1 - position) / (n - 1),
            "bid_micros": batch.bids[rid],
            "charge_micros": batch.charge,
        }
        if self.floor:
            auction["user_batch_charge_micros"] = batch.charge
            auction["request_charge_micros"] = batch.shares[rid]
        if _route(request) == "/generate":
            payload = _generation(rid, body, auction)
        else:
            payload = _chat(rid, auction)
        with self.cond:
            self.results[rid] = (_fingerprint(body), payload)
        if body["_drop"]:
            raise httpx.ReadTimeout("response lost", request=request)
        return self._render(request, body, payload)

    def _render(
        self, request: httpx.Request, body: dict[str, Any], payload: dict[str, Any]
    ) -> httpx.Response:
        if not body.get("stream"):
            return httpx.Response(200, json=payload)
        if _route(request) == "/generate":
            events = _generation_events(payload, error=self.stream_error)
        else:
            events = _chat_events(payload)
        lines = [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
        return httpx.Response(
            200,
            content="".join(lines).encode(),
            headers={"content-type": "text/event-stream"},
        )

    def _ledger(self, request: httpx.Request) -> httpx.Response:
        path = _route(request)
        if path == "/v1/ledger/balance":
            return httpx.Response(200, json=self.balance)
        if path == "/v1/ledger/entries":
            start = int(request.url.params.get("cursor") or 0)
            limit = int(request.url.params.get("limit") or 100)
            page = self.entries[start : start + limit]
            more = start + limit < len(self.entries)
            cursor = str(start + limit) if more else None
            return httpx.Response(200, json={"entries": page, "next_cursor": cursor})
        if path == "/v1/spend":
            # The ledger's entries: scripted ones and this server's own charges.
            booked = sum(
                e["amount_micros"]
                for e in self.entries
                if e["kind"] in ("charge", "refund", "floor")
            )
            scripted = {e["batch_id"] for e in self.entries if e["kind"] == "charge"}
            spend = {
                "since": request.url.params["since"],
                "now": request.url.params["since"],
                "spent_micros": max(0, -booked),
                "held_micros": 0,
                "auctions": len(scripted),
            }
            return httpx.Response(200, json=spend)
        if path == "/v1/budget":
            return httpx.Response(200, json=self.budget_period)
        if path == "/v1/market/rule" and self.rule is not None:
            return httpx.Response(200, json=self.rule)
        if path == "/v1/market/pool" and self.pool is not None:
            return httpx.Response(200, json=self.pool)
        if path == "/v1/ledger/summary":
            row = {
                "period_start": "2030-01-01T00:00:00Z",
                "charged_micros": self.total_charged,
                "refunded_micros": 0,
                "granted_micros": 10**9,
                "requests": len(self.results),
            }
            return httpx.Response(200, json={"by": request.url.params["by"], "rows": [row]})
        return _error(404, "not_found", path)


def _route(request: httpx.Request) -> str:
    # Tests may give the client a base URL with a path prefix.
    return request.url.path.removeprefix("/api")


def _fingerprint(body: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in body.items() if k != "_drop"}, sort_keys=True)


def _event_if_async() -> asyncio.Event | None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return None
    return asyncio.Event()


def _generation(rid: str, body: dict[str, Any], auction: dict[str, Any]) -> dict[str, Any]:
    return {
        "text": f"echo: {body['text']}",
        "output_ids": [1, 2, 3],
        "meta_info": {
            "id": rid,
            "finish_reason": {"type": "stop"},
            "prompt_tokens": 5,
            "completion_tokens": 3,
            "cached_tokens": 2,
            "e2e_latency": 0.5,
            "first_token_latency": 0.1,
            "auction": auction,
        },
    }


def _chat(rid: str, auction: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion",
        "created": 1_900_000_000,
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
        "auction": auction,
    }


def _generation_events(payload: dict[str, Any], *, error: bool) -> list[dict[str, Any]]:
    meta = payload["meta_info"]
    first = {
        "text": "",
        "output_ids": [],
        "meta_info": {"id": meta["id"], "finish_reason": None, "auction": meta["auction"]},
    }
    if error:
        return [first, {"error": {"type": "engine_error", "message": "engine died"}}]
    text = payload["text"]
    half = {**payload, "text": text[: len(text) // 2], "meta_info": {**meta, "finish_reason": None}}
    return [first, half, payload]


def _chat_events(payload: dict[str, Any]) -> list[dict[str, Any]]:
    base = {k: payload[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    first = base | {
        "choices": [{"index": 0, "delta": {"role": "assistant"}}],
        "auction": payload["auction"],
    }
    words = [
        base | {"choices": [{"index": 0, "delta": {"content": w}}]} for w in ("Hello", " there")
    ]
    last = base | {
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": payload["usage"],
    }
    return [first, *words, last]


def _error(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    body = {"error": {"type": kind, "message": message, "param": None}}
    return httpx.Response(status, json=body, headers=headers)


def error_response(
    status: int, kind: str = "error", *, retry_after: str | None = None
) -> httpx.Response:
    """A contract-shaped error response, optionally with `Retry-After`."""
    headers = {"retry-after": retry_after} if retry_after is not None else None
    return _error(status, kind, f"scripted {status}", headers)


Handler = Callable[[httpx.Request], httpx.Response]
