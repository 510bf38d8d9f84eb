"""The emulator measured against the real SGLang: one workload through both, compared.

    python -m bench.engine_agreement --emulator URL --sglang URL [--requests 200]

Both engines must run with the same KV size and running-request limit (the tests start
`emulate-sglang --cache-tokens 16384 --chunked-prefill-size 4096 --max-running-requests 1`
beside `sglang.launch_server --max-total-tokens 16384 --max-running-requests 1`). The workload,
sent straight to each engine's `/generate` as the auction server sends it (`input_ids`, a
`priority` that is the schedule sequence, streamed): groups of requests sharing a system
prefix, each with a question of its own, bids mixed (their auction order is their priority).
A long request occupies the engine's one slot until every request of the workload waits there
(then it is aborted), so each engine admits them in priority order, one at a time: the order
is then the engines' own, not the network's.

Compared per request: `cached_tokens`, the type of `finish_reason`, the place of its first
token in the order of first tokens, and the response's keys (top level and `meta_info`);
present in both: text, ids, timings. The table printed is what docs/ENGINE.md quotes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["Agreement", "compare", "first_token_order", "run_workload", "workload"]

_TIMING_KEYS = ("e2e_latency", "first_token_latency", "request_received_ts")


def workload(
    requests: int = 200, groups: int = 8, prefix: int = 150, question: int = 20, seed: int = 7
) -> list[dict[str, Any]]:
    """`/generate` bodies (token ids below 500: any small vocabulary has them), in auction
    order: the priority of each is its place."""
    rng = random.Random(seed)

    def tokens(count: int) -> list[int]:
        return [rng.randrange(10, 500) for _ in range(count)]

    # Two levels of sharing: pairs of groups share a root, each group adds a tail of its own.
    roots = [tokens(prefix // 2) for _ in range((groups + 1) // 2)]
    prefixes = [roots[g // 2] + tokens(prefix - prefix // 2) for g in range(groups)]
    bids = sorted((rng.random() for _ in range(requests)), reverse=True)
    bodies: list[dict[str, Any]] = []
    for place, _bid in enumerate(bids):
        if bodies and place % 8 == 7:
            # Now and then a prompt sent before, whole: a full match in the cache.
            ids = list(rng.choice(bodies)["input_ids"])
        else:
            ids = prefixes[rng.randrange(groups)] + tokens(question)
        bodies.append(
            {
                "input_ids": ids,
                "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
                "priority": 1_000 + place,
                "rid": f"agree-{place}",
                "stream": True,
            }
        )
    return bodies


async def _one(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """The last chunk of a streamed request, with the client's clock of its first chunk."""
    first: float | None = None
    last: dict[str, Any] = {}
    async with client.stream("POST", "/generate", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            if first is None:
                first = time.monotonic()
            last = json.loads(line[6:])
    last["client_first_chunk"] = first
    return last


async def _busy_then_all(url: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=url, timeout=600, trust_env=False, limits=limits
    ) as client:
        await client.post("/flush_cache")
        busy_body = {
            "input_ids": list(range(100, 140)),
            "sampling_params": {"max_new_tokens": 1_900, "ignore_eos": True},
            "priority": 0,
            "rid": "agree-busy",
        }
        busy = asyncio.create_task(client.post("/generate", json=busy_body))
        await _until(client, lambda load: load["num_running_reqs"] >= 1)
        # Sent in an order of their own, not the auction's: only the engine's priority
        # queue can then put them back in auction order.
        sending = list(range(len(bodies)))
        random.Random(len(bodies)).shuffle(sending)
        sent = {place: asyncio.create_task(_one(client, bodies[place])) for place in sending}
        results = asyncio.gather(*(sent[place] for place in range(len(bodies))))
        # Every request waits before the slot frees: the engine alone orders them.
        await _until(client, lambda load: load["num_waiting_reqs"] >= len(bodies))
        await client.post("/abort_request", json={"rid": "agree-busy"})
        await busy
        return list(await results)


async def _until(client: httpx.AsyncClient, condition: Any) -> None:
    while not condition((await client.get("/v1/loads")).json()["loads"][0]):
        await asyncio.sleep(0.01)


def run_workload(url: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each request's last chunk from the engine at `url`, in the workload's order."""
    return asyncio.run(_busy_then_all(url, bodies))


def first_token_order(results: list[dict[str, Any]]) -> list[int]:
    """The workload places in the order the engine produced their first tokens."""

    def first_token(i: int) -> float:
        meta = results[i]["meta_info"]
        return float(meta["request_received_ts"] + meta["first_token_latency"])

    return sorted(range(len(results)), key=first_token)


@dataclass(frozen=True)
class Agreement:
    """How the two engines' answers to one workload compare."""

    requests: int
    cached_equal: int
    cached_emulator: int
    cached_sglang: int
    finish_types_equal: int
    first_token_order_equal: bool
    top_keys_equal: bool
    meta_keys_only_emulator: frozenset[str]
    meta_keys_only_sglang: frozenset[str]
    present_in_both: bool

    def table(self) -> str:
        """The markdown table docs/ENGINE.md quotes."""
        n = self.requests
        rows = [
            ("per-request `cached_tokens`", f"{self.cached_equal}/{n} equal"),
            (
                "total `cached_tokens`",
                f"emulator {self.cached_emulator}, SGLang {self.cached_sglang}",
            ),
            ("type of `finish_reason`", f"{self.finish_types_equal}/{n} equal"),
            ("first-token order", "equal" if self.first_token_order_equal else "differs"),
            ("top-level keys", "equal" if self.top_keys_equal else "differ"),
            (
                "`meta_info` keys only the emulator has",
                ", ".join(sorted(self.meta_keys_only_emulator)) or "none",
            ),
            (
                "`meta_info` keys only SGLang has",
                ", ".join(sorted(self.meta_keys_only_sglang)) or "none",
            ),
            ("text, ids and timings present", "in both" if self.present_in_both else "missing"),
        ]
        lines = ["| compared | result |", "|---|---|"]
        lines += [f"| {what} | {result} |" for what, result in rows]
        return "\n".join(lines)


def _present(result: dict[str, Any]) -> bool:
    meta = result.get("meta_info", {})
    return (
        isinstance(result.get("text"), str)
        and bool(result.get("output_ids"))
        and all(isinstance(meta.get(key), int | float) for key in _TIMING_KEYS)
    )


def compare(emulator: list[dict[str, Any]], sglang: list[dict[str, Any]]) -> Agreement:
    """Compare two engines' answers to the same workload (see the module docstring)."""
    pairs = list(zip(emulator, sglang, strict=True))
    emulator_meta = set().union(*(r["meta_info"].keys() for r in emulator))
    sglang_meta = set().union(*(r["meta_info"].keys() for r in sglang))
    return Agreement(
        requests=len(pairs),
        cached_equal=sum(
            a["meta_info"]["cached_tokens"] == b["meta_info"]["cached_tokens"] for a, b in pairs
        ),
        cached_emulator=sum(a["meta_info"]["cached_tokens"] for a, _ in pairs),
        cached_sglang=sum(b["meta_info"]["cached_tokens"] for _, b in pairs),
        finish_types_equal=sum(
            a["meta_info"]["finish_reason"]["type"] == b["meta_info"]["finish_reason"]["type"]
            for a, b in pairs
        ),
        first_token_order_equal=first_token_order(emulator) == first_token_order(sglang),
        top_keys_equal=all(
            set(a) - {"client_first_chunk"} == set(b) - {"client_first_chunk"} for a, b in pairs
        ),
        meta_keys_only_emulator=frozenset(emulator_meta - sglang_meta),
        meta_keys_only_sglang=frozenset(sglang_meta - emulator_meta),
        present_in_both=all(_present(a) and _present(b) for a, b in pairs),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--emulator", required=True, help="emulate-sglang's URL")
    parser.add_argument("--sglang", required=True, help="the real SGLang's URL")
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    bodies = workload(args.requests)
    agreement = compare(run_workload(args.emulator, bodies), run_workload(args.sglang, bodies))
    print(agreement.table())


if __name__ == "__main__":
    main()
