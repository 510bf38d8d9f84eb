"""Rids made by the server and by the SDK: unique, unguessable, and ordered by time, so that
the ledger's rid-keyed indexes grow at their right edge (bench/ledger_rid_order.py measures
why). The SDK cannot import the server, so each has its own `new_rid`; both are tested here,
against the same clock, so that they cannot drift apart."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

from inference_auctions.sdk import _base_client
from inference_auctions.server.api import generation

MAKERS = pytest.mark.parametrize(
    "new_rid", [generation.new_rid, _base_client.new_rid], ids=["server", "sdk"]
)


@MAKERS
def test_a_rid_is_32_lowercase_hex_digits_like_a_uuid(new_rid: Callable[[], str]) -> None:
    assert re.fullmatch(r"[0-9a-f]{32}", new_rid())


@MAKERS
def test_rids_made_in_one_millisecond_are_still_unique(new_rid: Callable[[], str]) -> None:
    rids = [new_rid() for _ in range(20_000)]
    assert len(set(rids)) == len(rids)


@MAKERS
def test_rids_sort_in_the_order_of_the_milliseconds_they_were_made_in(
    new_rid: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter(range(1_700_000_000_000, 1_700_000_000_000 + 500))
    monkeypatch.setattr(time, "time_ns", lambda: next(clock) * 1_000_000)
    rids = [new_rid() for _ in range(500)]
    assert sorted(rids) == rids


@MAKERS
def test_the_random_part_differs_within_one_millisecond(
    new_rid: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_000 * 1_000_000)
    rids = [new_rid() for _ in range(100)]
    assert len({rid[:12] for rid in rids}) == 1
    assert len({rid[12:] for rid in rids}) == 100


def test_the_server_and_the_sdk_stamp_the_same_millisecond_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_712_345_678_901 * 1_000_000)
    assert generation.new_rid()[:12] == _base_client.new_rid()[:12] == f"{1_712_345_678_901:012x}"
