"""`inference-auction demo`: a real server, four users at once, one batch, real charges.

Batching is work-conserving, so on an idle engine a lone first arrival would go out alone and
pay nothing; the demo's server collects a batch until every demo user waits. These tests run
the command as a newcomer does and check what it shows against the ledger and the mechanism.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_auctions.server.auction import AuctionRequest, run_auction
from inference_auctions.server.cli.demo_story import explain

REPO = Path(__file__).parents[2]
CLI = [sys.executable, "-m", "inference_auctions.server.cli", "demo"]


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("run", [1, 2])
def test_the_demo_always_clears_one_batch_of_several_users_with_charges(run: int) -> None:
    result = _demo("--json")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    requests = outcome["requests"]
    assert len({r["batch_id"] for r in requests}) == 1, requests
    assert {r["user"] for r in requests} == {"alice", "bob", "carol", "dave"}
    assert sorted(r["position"] for r in requests) == [0, 1, 2, 3]
    assert all(r["batch_size"] == 4 for r in requests)
    charged = [r for r in requests if r["request_charge_micros"] > 0]
    assert len(charged) >= 2, requests
    for r in requests:
        # One request each: the request's share is the user's whole batch charge, the ledger
        # moved by exactly that, and nobody paid more than their bid.
        assert r["request_charge_micros"] == r["user_batch_charge_micros"] <= r["bid_micros"]
        assert r["balance_before_micros"] - r["balance_after_micros"] == r["request_charge_micros"]
    by_user = {r["user"]: r for r in requests}
    for story in outcome["charges"]:
        exact = Fraction(story["externality"])
        assert story["charge_micros"] == by_user[story["user"]]["user_batch_charge_micros"]
        assert story["charge_micros"] == exact.numerator // exact.denominator
        assert exact == sum((Fraction(d["cost"]) for d in story["delays"]), Fraction(0))


def test_the_readme_opens_with_the_demos_real_output() -> None:
    started = time.monotonic()
    result = _demo("--exit")
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert elapsed < 60, f"the demo took {elapsed:.0f} s"
    shown = [line for line in result.stdout.splitlines() if re.match(r"\s+\d\s+\w+\s+\d\.", line)]
    charges = [line for line in result.stdout.splitlines() if " pays " in line or " + " in line]
    assert len(shown) == 4 and len(charges) >= 4, result.stdout
    first_screen = "\n".join((REPO / "README.md").read_text().splitlines()[:60])
    assert "inference-auction demo" in first_screen
    for line in shown + charges:
        assert line in first_screen, line


def test_the_demo_keeps_the_server_up_and_points_at_the_dashboard(tmp_path: Path) -> None:
    process = subprocess.Popen(CLI, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C"):
                break
        text = "".join(lines)
        url = re.search(r"See it on the dashboard: (\S+)/dashboard", text)
        assert url is not None, text
        page = httpx.get(url.group(1) + "/dashboard", timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
        key = re.search(r"the operator's key (iak_\S+)", text)
        assert key is not None, text
        market = httpx.get(
            url.group(1) + "/v1/dashboard/market",
            headers={"Authorization": f"Bearer {key.group(1)}"},
            timeout=10,
        )
        assert market.status_code == 200, market.text
    finally:
        process.terminate()
        process.wait(30)
        process.stdout.close()
    # Terminated as `kill` does, the demo stops its server too: nothing is left listening.
    with pytest.raises(httpx.ConnectError):
        httpx.get(url.group(1) + "/health", timeout=5)


_BATCHES = st.lists(
    st.tuples(
        st.sampled_from(["u1", "u2", "u3", "u4"]),
        st.lists(st.integers(1, 4), min_size=1, max_size=4),
        st.integers(0, 2_000_000),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(_BATCHES)
def test_every_charge_is_the_delay_its_bids_impose(batch: list[tuple[str, list[int], int]]) -> None:
    requests = [
        AuctionRequest(rid=f"r{i}", user=user, tokens=tokens, bid=bid)
        for i, (user, tokens, bid) in enumerate(batch)
    ]
    outcome = run_auction(requests)
    stories = explain(requests, outcome)
    assert {story.user for story in stories} == set(outcome.payments)
    for story in stories:
        exact = story.externality
        assert story.charge_micros == exact.numerator // exact.denominator
        assert all(delay.user != story.user for delay in story.delays)
