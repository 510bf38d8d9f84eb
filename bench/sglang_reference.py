"""Time SGLang's own radix cache and dfs-weight ordering on a batch of prompts.

This is the reference side of the ordering benchmark: it runs SGLang's code, not ours, so the
project's numbers can be compared with what SGLang itself spends on the same batch. It measures

* insert_s: inserting every prompt into a fresh ``RadixCache.create_simulated()``, one
  ``RadixCache.insert`` per prompt, as the scheduler does once a prompt's KV is cached;
* order_s: one ``SchedulePolicy.calc_priority`` call with ``--schedule-policy dfs-weight`` over
  all requests waiting at once. That is SGLang's whole per-step ordering work: a
  ``match_prefix`` per request against the tree (which sets ``req.last_node``, the node the
  request hangs on), then ``_sort_by_dfs_weight``, which calls ``_dfs_weight_order``.

It prints one JSON line with the best of ``--repeat`` runs (each run starts from a fresh tree
and fresh requests, so no run sees another's splits or access times).

A live SGLang 0.5.23 server keeps its main tree in a ``UnifiedRadixCache`` (with a Rust tree core
when the torch version allows); ``RadixCache`` is its pure-Python tree, which the scheduler
also uses for in-batch matching. Both give the same dfs-weight order; this script times the
Python one because it runs without memory pools.

It runs in the separate SGLang virtualenv made by ``bench/setup_sglang_reference.sh``, never
in the project's own, and imports nothing from this repository::

    bench/setup_sglang_reference.sh .sglang-ref
    .sglang-ref/.venv/bin/python bench/sglang_reference.py --input BATCH.npz --repeat 3

``BATCH.npz`` holds the prompts as token ids: ``tokens`` (one concatenated int64 array) and
``offsets`` (int64, n + 1 start offsets). ``--synthetic N`` builds the standard test batch
instead (half the prompts in groups of 16 sharing a 900-token article, half singletons,
~1,000 tokens each) and ``--save PATH`` writes it out in the same format.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

try:  # run as a module of the repository (type checks, tests)
    from bench import torchvision_stub
except ImportError:  # run as a script in SGLang's virtualenv, where bench/ is on sys.path
    import torchvision_stub  # type: ignore[no-redef, import-not-found]

TokenArray = npt.NDArray[np.int64]

# Shape of the synthetic batch (see the module docstring).
GROUP_SIZE = 16
ARTICLE_TOKENS = 900
PROMPT_TOKENS = 1000
VOCAB = 32_000


@dataclass(frozen=True)
class SGLang:
    """The SGLang entry points the benchmark calls (imported lazily: SGLang's import pulls in
    torch and transformers and takes seconds, which must not be timed)."""

    torch: Any
    radix_cache: Any  # RadixCache
    radix_key: Any  # RadixKey
    insert_params: Any  # InsertParams
    schedule_policy: Any  # SchedulePolicy
    req: Any  # Req
    sampling_params: Any  # SamplingParams


def load_sglang() -> SGLang:
    torchvision_stub.install()
    radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
    base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
    policy = importlib.import_module("sglang.srt.managers.schedule_policy")
    batch = importlib.import_module("sglang.srt.managers.schedule_batch")
    sampling = importlib.import_module("sglang.srt.sampling.sampling_params")
    return SGLang(
        torch=importlib.import_module("torch"),
        radix_cache=radix.RadixCache,
        radix_key=radix.RadixKey,
        insert_params=base.InsertParams,
        schedule_policy=policy.SchedulePolicy,
        req=batch.Req,
        sampling_params=sampling.SamplingParams,
    )


def synthetic_batch(n: int, seed: int) -> tuple[TokenArray, TokenArray]:
    """Half the prompts in groups of 16 sharing a 900-token article, half singletons; all
    ~1,000 random tokens long and shuffled, so that a group's members arrive interleaved."""
    rng = np.random.default_rng(seed)
    grouped = n // 2
    prompts: list[TokenArray] = []
    for start in range(0, grouped, GROUP_SIZE):
        article = rng.integers(0, VOCAB, ARTICLE_TOKENS, dtype=np.int64)
        for _ in range(min(GROUP_SIZE, grouped - start)):
            tail = rng.integers(0, VOCAB, PROMPT_TOKENS - ARTICLE_TOKENS, dtype=np.int64)
            prompts.append(np.concatenate([article, tail]))
    prompts.extend(
        rng.integers(0, VOCAB, PROMPT_TOKENS, dtype=np.int64) for _ in range(n - grouped)
    )
    order = rng.permutation(n)
    lengths = np.array([len(prompts[i]) for i in order], dtype=np.int64)
    offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
    return np.concatenate([prompts[i] for i in order]), offsets


def load_batch(path: Path) -> tuple[TokenArray, TokenArray]:
    with np.load(path) as data:
        return data["tokens"].astype(np.int64), data["offsets"].astype(np.int64)


def split_prompts(tokens: TokenArray, offsets: TokenArray) -> list[array[int]]:
    # SGLang keeps token ids as array("q") (Req.origin_input_ids, RadixKey.token_ids); its key
    # comparisons assert both sides have the same type, so the prompts must be arrays too.
    prompts = []
    for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        prompt = array("q")
        prompt.frombytes(tokens[start:end].tobytes())
        prompts.append(prompt)
    return prompts


def run_once(sg: SGLang, prompts: list[array[int]]) -> tuple[float, float]:
    """One fresh tree and one fresh queue; returns (insert seconds, order seconds)."""
    cache = sg.radix_cache.create_simulated()
    # The scheduler inserts the KV indices it already holds; build stand-ins for them here so
    # that only the tree work is timed.
    values = [sg.torch.arange(len(p), dtype=sg.torch.int64) for p in prompts]
    keys = [sg.radix_key(p) for p in prompts]

    # Tree nodes point at their parents, so an earlier run's tree is freed only by the cyclic
    # collector; collect it now, or a later timed phase pays for it. The collector stays on
    # while timing, as in a running scheduler.
    gc.collect()
    start = time.perf_counter()
    for key, value in zip(keys, values, strict=True):
        cache.insert(sg.insert_params(key=key, value=value))
    insert_s = time.perf_counter() - start

    # Requests as the scheduler builds them (the same construction as SGLang's own tests); the
    # policy object owns a second, in-batch tree that calc_priority resets on every call.
    params = sg.sampling_params(temperature=0, max_new_tokens=1)
    queue = [
        sg.req(rid=str(i), origin_input_text="", origin_input_ids=p, sampling_params=params)
        for i, p in enumerate(prompts)
    ]
    policy = sg.schedule_policy(
        policy="dfs-weight",
        tree_cache=cache,
        enable_hierarchical_cache=False,
        enable_priority_scheduling=False,
        schedule_low_priority_values_first=False,
    )

    gc.collect()
    start = time.perf_counter()
    policy.calc_priority(queue)
    order_s = time.perf_counter() - start

    # Guard against timing a no-op: every prompt is cached, so every request must have matched
    # all of it, and the order must be a permutation of the queue.
    assert all(r.prefix_len == len(r.origin_input_ids) for r in queue), "prompt not matched"
    assert sorted(int(r.rid) for r in queue) == list(range(len(prompts)))
    return insert_s, order_s


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", type=Path, help="batch .npz with tokens and offsets")
    source.add_argument("--synthetic", type=int, metavar="N", help="build the test batch")
    parser.add_argument("--seed", type=int, default=0, help="seed for --synthetic")
    parser.add_argument("--save", type=Path, help="write the --synthetic batch to this .npz")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    args = parser.parse_args(argv)

    if args.input is not None:
        tokens, offsets = load_batch(args.input)
    else:
        tokens, offsets = synthetic_batch(args.synthetic, args.seed)
        if args.save is not None:
            np.savez(args.save, tokens=tokens, offsets=offsets)
    prompts = split_prompts(tokens, offsets)

    sg = load_sglang()
    runs = [run_once(sg, prompts) for _ in range(max(1, args.repeat))]
    result = {
        "n": len(prompts),
        "total_tokens": int(offsets[-1] - offsets[0]),
        "insert_s": min(r[0] for r in runs),
        "order_s": min(r[1] for r in runs),
        # Best whole run, not the sum of two minima from different runs.
        "total_s": min(r[0] + r[1] for r in runs),
        "sglang_version": version("sglang"),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
