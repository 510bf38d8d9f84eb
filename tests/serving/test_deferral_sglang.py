"""In-step prefix deferral, end to end: the auction server in front of `emulate-sglang`.

The emulator models SGLang's FCFS priority scheduling as it is: requests admitted into one
prefill step do not share each other's new prefix tokens. A batch of siblings that waits behind
a long prefill is therefore admitted into one step. Without the rule each sibling computes
the shared prefix; with it only the first does, and the others find it cached.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import httpx
import pytest

from tests.db_fixtures import MigratedDatabase
from tests.processes import emulated_sglang
from tests.server.harness import running_server

SIBLINGS = 6
PREFIX_TOKENS = 256
# At model speed a 16k-token prefill takes 1.6 s: the siblings arrive while it runs.
BUSY_TOKENS = 16_000


@pytest.fixture(scope="module")
def sglang_url() -> Iterator[str]:
    """An `emulate-sglang` process on a free port, running at the modelled GPU's speed."""
    with emulated_sglang(time_scale=1.0) as url:
        yield url


def _wait_until_running(sglang_url: str) -> None:
    """Return once the emulator has admitted a request into a step."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        loads = httpx.get(sglang_url + "/v1/loads", timeout=5).json()
        rank = loads["loads"][0] if "loads" in loads else loads
        if rank["num_running_reqs"] >= 1:
            return
        time.sleep(0.01)
    raise AssertionError("the emulator never started the long request")


async def _serve_siblings(
    server_url: str, key: str, sglang_url: str, base: int
) -> list[dict[str, Any]]:
    """Keep the engine busy with one long prefill, then send a batch of siblings."""
    prefix = list(range(base, base + PREFIX_TOKENS))
    busy_prompt = list(range(base + 10_000, base + 10_000 + BUSY_TOKENS))

    async def run() -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=server_url, headers=headers, timeout=120) as client:
            body = {
                "input_ids": busy_prompt,
                "bid": "0.5",
                "sampling_params": {"max_new_tokens": 4},
            }
            busy = asyncio.create_task(client.post("/generate", json=body))
            await asyncio.to_thread(_wait_until_running, sglang_url)
            replies = await asyncio.gather(
                *(
                    client.post(
                        "/generate",
                        json={
                            "input_ids": [*prefix, base + 20_000 + i],
                            "bid": f"0.0{i + 1}",
                            "sampling_params": {"max_new_tokens": 4},
                        },
                    )
                    for i in range(SIBLINGS)
                )
            )
            assert (await busy).status_code == 200
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
        return [r.json() for r in replies]

    bodies = await run()
    batches = {body["meta_info"]["auction"]["batch_id"] for body in bodies}
    assert len(batches) == 1, "the siblings must clear as one batch"
    return sorted(bodies, key=lambda body: body["meta_info"]["auction"]["position"])


def _metric(server_url: str, name: str) -> float:
    text = httpx.get(server_url + "/metrics", timeout=10).text
    match = re.search(rf"^{name}(?:_total)? (\S+)$", text, re.MULTILINE)
    assert match is not None, name
    return float(match[1])


def _first_token_times(bodies: list[dict[str, Any]]) -> list[float]:
    return [
        b["meta_info"]["request_received_ts"] + b["meta_info"]["first_token_latency"]
        for b in bodies
    ]


# One step's first tokens are one instant, but each is summed here from two different floats,
# so they differ by a few hundred nanoseconds; engine steps are at least milliseconds apart.
# (Rounding to 0.1 ms instead failed whenever the instant sat on a rounding boundary.)
_SAME_INSTANT = 1e-5


def _in_order(times: list[float]) -> bool:
    """Whether `times` never go back by more than the noise of one instant."""
    return all(later >= earlier - _SAME_INSTANT for earlier, later in pairwise(times))


@pytest.mark.anyio
@pytest.mark.parametrize("deferral", [True, False], ids=["deferral", "no-deferral"])
async def test_siblings_compute_their_shared_prefix_once_with_the_rule(
    ledger_db: MigratedDatabase, sglang_url: str, deferral: bool
) -> None:
    base = 1_000 if deferral else 500_000  # no prefix of one run is cached for the other
    # Batches close at the siblings' count; the long request alone closes after a second. The
    # siblings must queue inside the engine behind the long prefill, so the long request's
    # unstarted tokens must not count as saturation (which would keep them in the pool).
    settings = {
        "batch_size": SIBLINGS,
        "max_wait_ms": 1000,
        "max_inflight": 64,
        "saturation_tokens": 2 * BUSY_TOKENS,
    }
    with running_server(ledger_db, engine_url=sglang_url, deferral=deferral, **settings) as server:
        key = server.create_user("alice", budget=100_000_000)
        bodies = await _serve_siblings(server.url, key, sglang_url, base)
        cached = [body["meta_info"]["cached_tokens"] for body in bodies]
        # Bids are distinct, so the auction puts the highest bidder first.
        bids = [body["meta_info"]["auction"]["bid_micros"] for body in bodies]
        assert bids == sorted(bids, reverse=True)
        if deferral:
            # The first sibling computes the prefix; every other one finds it cached.
            assert cached == [0] + [PREFIX_TOKENS] * (SIBLINGS - 1)
            assert _metric(server.url, "inference_auction_deferral_held") == SIBLINGS - 1
            saved = _metric(server.url, "inference_auction_deferral_saved_tokens")
            assert saved == PREFIX_TOKENS * (SIBLINGS - 1)
        else:
            # One prefill step admitted them all: each computed the prefix itself.
            assert cached == [0] * SIBLINGS
            assert _metric(server.url, "inference_auction_deferral_held") == 0
        # First tokens still come in the auction's order.
        times = _first_token_times(bodies)
        assert _in_order(times), times
        if deferral:
            assert times[0] < times[1]
