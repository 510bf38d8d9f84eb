"""The retry timing policy, with the real constants."""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime

import httpx

from inference_auctions import sdk


def test_retry_delay_policy() -> None:
    delay = sdk.AuctionClient._retry_delay

    def response(headers: dict[str, str]) -> httpx.Response:
        return httpx.Response(429, headers=headers)

    assert delay(0, response({"retry-after": "3"})) == 3.0
    assert delay(0, response({"retry-after-ms": "250"})) == 0.25
    when = email.utils.format_datetime(datetime.now(UTC).replace(microsecond=0), usegmt=True)
    assert delay(3, response({"retry-after": when})) <= 4.0  # a date in the past: backoff
    for attempt, ceiling in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        for _ in range(20):
            assert 0.75 * ceiling <= delay(attempt, None) <= ceiling
    assert 0.375 <= delay(0, response({"retry-after": "600"})) <= 0.5  # too long: ignored
