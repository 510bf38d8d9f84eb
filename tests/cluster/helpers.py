"""Requests and ledger checks shared by the scale-out tests."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import httpx

from inference_auctions.billing import Ledger
from inference_auctions.server.cluster.replica import REPLICA_HEADER


def generate(
    url: str,
    key: str,
    prompt: str,
    *,
    bid: str = "0.05",
    rid: str | None = None,
    max_new_tokens: int = 4,
    timeout: float = 60,
) -> httpx.Response:
    """One SGLang-native `/generate` with a bid, as an SGLang client sends it (JSON)."""
    body: dict[str, Any] = {
        "text": prompt,
        "bid": bid,
        "rid": rid or secrets.token_hex(8),
        "sampling_params": {"max_new_tokens": max_new_tokens},
    }
    with httpx.Client(base_url=url, timeout=timeout) as client:
        return client.post("/generate", headers={"Authorization": f"Bearer {key}"}, json=body)


def replica_of(reply: httpx.Response) -> str:
    """The replica that answered, from the header every replica sets."""
    return reply.headers[REPLICA_HEADER]


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll `condition` until it is true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout} s")
        time.sleep(0.05)


def charges_by_batch(ledger: Ledger, user: str) -> dict[str, int]:
    """The user's charge entries by batch id; fails if any batch charged the user twice."""
    charged: dict[str, int] = {}
    for entry in ledger.entries(user, kind="charge", limit=1000).entries:
        assert entry.batch_id is not None
        assert entry.batch_id not in charged, f"{user} charged twice in batch {entry.batch_id}"
        charged[entry.batch_id] = -entry.amount_micros
    return charged
