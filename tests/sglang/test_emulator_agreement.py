"""The emulator keeps agreeing with the real SGLang on what the auction depends on.

The same workload (`bench.engine_agreement`: requests in groups sharing a system prefix, pairs
of groups sharing part of it, now and then a prompt sent before whole; priorities from mixed
bids; sent out of order, one running request at a time, the same KV size) through
`emulate-sglang` and through the real SGLang: per request the same `cached_tokens` and type
of `finish_reason`, first tokens in the same order, the same top-level keys, and the keys the
server reads in both (docs/ENGINE.md has the table of the full-size run, 200 requests). Here
48 requests in 6 groups: every kind of match the cache makes, in a few seconds of each engine.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench.engine_agreement import compare, first_token_order, run_workload, workload
from bench.sglang_cpu.launcher import SGLangServer
from tests.processes import free_port, wait_until_healthy
from tests.sglang.conftest import MAX_RUNNING_REQUESTS, MAX_TOTAL_TOKENS

PREFIX = 150  # tokens a group's prompts share; pairs of groups share the first half
# What the server reads from `meta_info` (server.engine.protocol, server.serving.following).
READ_BY_THE_SERVER = {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"}


@pytest.fixture
def emulator(sglang: SGLangServer) -> Iterator[str]:
    """`emulate-sglang` with the real one's KV size, prefill chunk and running limit."""
    port = free_port()
    command = [sys.executable, "-m", "inference_auctions.server.cli", "emulate-sglang"]
    command += ["--port", str(port), "--time-scale", "0.2"]
    command += ["--cache-tokens", str(MAX_TOTAL_TOKENS), "--chunked-prefill-size", "4096"]
    command += ["--max-running-requests", str(MAX_RUNNING_REQUESTS)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def test_the_emulator_agrees_with_sglang_on_what_the_auction_reads(
    emulator: str, sglang_url: str
) -> None:
    bodies = workload(requests=48, groups=6, prefix=PREFIX)
    emulated, real = run_workload(emulator, bodies), run_workload(sglang_url, bodies)
    agreement = compare(emulated, real)
    print(agreement.table())
    assert agreement.cached_equal == agreement.requests, agreement
    # Every kind of match happened: none, a pair's shared root, a group's prefix, a whole
    # prompt sent before (all but its last token).
    cached = {r["meta_info"]["cached_tokens"] for r in real}
    prompt = len(bodies[0]["input_ids"])
    assert {0, PREFIX // 2, PREFIX, prompt - 1} <= cached, cached
    assert agreement.finish_types_equal == agreement.requests
    assert agreement.first_token_order_equal
    # Sent out of order, served in the auction's: the engines' priority queues did it.
    assert first_token_order(real) == list(range(len(bodies)))
    assert agreement.top_keys_equal
    assert agreement.present_in_both
    assert not READ_BY_THE_SERVER & (
        agreement.meta_keys_only_emulator | agreement.meta_keys_only_sglang
    )
