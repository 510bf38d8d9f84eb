"""The engine simulator: order, cache reuse, continuous batching, memory, time, determinism."""

from __future__ import annotations

import random
import time

import pytest

from inference_auctions.server.emulator.cost_model import CostModel
from inference_auctions.server.emulator.simulator import EngineSimulator, RequestOutcome, SimRequest
from tests.emulator.radix_paths import cached_sequences

COST = CostModel()


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 1 << 20) for _ in range(length)]


def _admission_order(outcomes: list[RequestOutcome]) -> list[str]:
    return [o.rid for o in sorted(outcomes, key=lambda o: (o.admitted_at, o.first_token_at))]


def test_a_lone_request_costs_one_prefill_and_a_decode_step_per_further_token() -> None:
    sim = EngineSimulator()
    (outcome,) = sim.run_batch([SimRequest("a", _prompt(1, 1000), max_new_tokens=4)])
    assert outcome.cached_tokens == 0
    assert outcome.ttft == pytest.approx(COST.prefill_time(1000))
    decode = sum(COST.decode_time(1000 + k) for k in (1, 2, 3))
    assert outcome.e2e_latency == pytest.approx(COST.prefill_time(1000) + decode)
    assert outcome.completion_tokens == 4
    assert outcome.queue_time == 0.0


def test_waiting_requests_are_served_by_priority_then_arrival() -> None:
    # A one-token prefill budget makes every prefill step admit exactly one request.
    sim = EngineSimulator(chunked_prefill_size=1)
    priorities = [5, 3, 9, 3, 1, 7, 5, 0]
    requests = [
        SimRequest(f"r{i}", _prompt(i, 50), max_new_tokens=1, priority=p, arrival=i * 1e-6)
        for i, p in enumerate(priorities)
    ]
    outcomes = sim.run_batch(requests)
    expected = sorted(range(len(priorities)), key=lambda i: (priorities[i], i))
    # The first request arrived alone and was admitted before the others arrived.
    assert _admission_order(outcomes) == ["r0"] + [f"r{i}" for i in expected if i != 0]


def test_high_values_first_and_no_priority_scheduling_change_the_order() -> None:
    requests = [
        SimRequest(f"r{i}", _prompt(i, 50), max_new_tokens=1, priority=p)
        for i, p in enumerate([1, 3, 2])
    ]
    high_first = EngineSimulator(chunked_prefill_size=1, low_priority_values_first=False)
    assert _admission_order(high_first.run_batch(requests)) == ["r1", "r2", "r0"]
    arrival_only = EngineSimulator(chunked_prefill_size=1, priority_scheduling=False)
    assert _admission_order(arrival_only.run_batch(requests)) == ["r0", "r1", "r2"]


def test_ttft_is_monotone_in_priority_for_equal_prompts() -> None:
    rng = random.Random(7)
    priorities = rng.sample(range(1000), 200)
    requests = [
        SimRequest(f"r{p}", _prompt(p, 300), max_new_tokens=3, priority=p) for p in priorities
    ]
    outcomes = {o.rid: o for o in EngineSimulator().run_batch(requests)}
    ttfts = [outcomes[f"r{p}"].first_token_at or 0.0 for p in sorted(priorities)]
    assert ttfts == sorted(ttfts)
    assert ttfts[0] < ttfts[-1]


def test_a_shared_prefix_is_cached_for_a_later_request() -> None:
    article = _prompt(0, 800)
    sim = EngineSimulator()
    first = SimRequest("a", article + _prompt(1, 100), max_new_tokens=1)
    later = SimRequest("b", article + _prompt(2, 100), max_new_tokens=1, arrival=1.0)
    same = SimRequest("c", article + _prompt(1, 100), max_new_tokens=1, arrival=2.0)
    a, b, c = sim.run_batch([first, later, same])
    assert (a.cached_tokens, b.cached_tokens) == (0, 800)
    # A repeated prompt reuses all but its last token, which SGLang always recomputes.
    assert c.cached_tokens == 899
    assert b.ttft == pytest.approx(COST.prefill_time(100))
    assert sim.stats.cached_tokens == 800 + 899
    assert sim.stats.prompt_tokens == 2700


def test_requests_in_the_same_prefill_step_do_not_share_new_tokens() -> None:
    article = _prompt(0, 800)
    sim = EngineSimulator()
    a, b = sim.run_batch(
        [
            SimRequest("a", [*article, 1], max_new_tokens=1),
            SimRequest("b", [*article, 2], max_new_tokens=1),
        ]
    )
    assert a.admitted_at == b.admitted_at
    assert (a.cached_tokens, b.cached_tokens) == (0, 0)
    assert sim.cache.size == 802


def test_decode_steps_interleave_running_requests_and_prefill_goes_first() -> None:
    sim = EngineSimulator()
    sim.submit(SimRequest("long", _prompt(1, 100), max_new_tokens=20))
    sim.submit(SimRequest("late", _prompt(2, 100), max_new_tokens=3, arrival=0.1))
    steps = sim.run()
    kinds = [(step.kind, step.rids) for step in steps]
    assert kinds[0] == ("prefill", ("long",))
    # "late" arrives while "long" decodes; the next step after its arrival is its prefill.
    late_prefill = kinds.index(("prefill", ("late",)))
    assert all(kind == "decode" for kind, _ in kinds[1:late_prefill])
    assert kinds[late_prefill + 1] == ("decode", ("long", "late"))
    assert ("decode", ("long",)) in kinds[late_prefill + 2 :]
    long, late = sim.outcome("long"), sim.outcome("late")
    assert late.finished_at is not None and long.finished_at is not None
    assert late.finished_at < long.finished_at


def test_memory_bounds_the_running_batch_and_is_returned() -> None:
    sim = EngineSimulator(cache_tokens=1000)
    requests = [SimRequest(f"r{i}", _prompt(i, 300), max_new_tokens=50) for i in range(6)]
    for request in requests:
        sim.submit(request)
    most_running = 0
    while sim.next_event_time() is not None or sim.num_waiting:
        sim.advance_to(sim.next_event_time() or sim.now)
        assert sim.used_tokens <= 1000
        assert sim.cache.size <= 1000
        most_running = max(most_running, sim.num_running)
    assert most_running == 2  # 350 tokens each: a third does not fit next to two
    assert all(sim.outcome(r.rid).completion_tokens == 50 for r in requests)
    assert sim.used_tokens == sim.cache.size  # nothing reserved once all finished


def test_finished_requests_leave_prompt_and_output_in_the_cache() -> None:
    sim = EngineSimulator()
    prompt, output = _prompt(1, 10), [101, 102, 103]
    sim.run_batch([SimRequest("a", prompt, max_new_tokens=3, output_ids=output)])
    assert cached_sequences(sim.cache) == [(*prompt, 101, 102)]
    follow_up = SimRequest("b", [*prompt, 101, 102, 103, 7], max_new_tokens=1, arrival=sim.now)
    (b,) = sim.run_batch([follow_up])
    assert b.cached_tokens == 12


def test_the_simulation_is_deterministic() -> None:
    def run() -> list[RequestOutcome]:
        rng = random.Random(3)
        requests = [
            SimRequest(
                f"r{i}",
                _prompt(rng.randrange(20), 400) + _prompt(i, rng.randrange(1, 200)),
                max_new_tokens=rng.randrange(1, 20),
                priority=rng.randrange(50),
                arrival=rng.random(),
            )
            for i in range(300)
        ]
        return EngineSimulator(cache_tokens=5000).run_batch(requests)

    assert run() == run()


def test_abort_releases_a_waiting_or_running_request() -> None:
    sim = EngineSimulator(cache_tokens=1000)
    sim.submit(SimRequest("run", _prompt(1, 400), max_new_tokens=100))
    sim.submit(SimRequest("wait", _prompt(2, 400), max_new_tokens=200))
    sim.advance_to(1.0)
    assert sim.num_running == 1 and sim.num_waiting == 1
    assert sim.abort("wait")
    assert sim.abort("run")
    assert not sim.abort("run")
    assert sim.num_running == 0 and sim.num_waiting == 0
    assert sim.outcome("run").aborted and sim.outcome("wait").aborted
    assert sim.cache.protected_size == 0
    assert sim.used_tokens == sim.cache.size
    assert all(not step.rids for step in sim.run())  # the open decode step ends empty


def test_a_request_aborted_during_its_prefill_is_released_when_the_step_ends() -> None:
    sim = EngineSimulator()
    sim.submit(SimRequest("a", _prompt(1, 500), max_new_tokens=10))
    sim.advance_to(0.0)
    assert sim.num_running == 1
    assert sim.abort("a")
    sim.run()
    assert sim.outcome("a").aborted
    assert sim.used_tokens == 0


def test_invalid_requests_are_refused() -> None:
    sim = EngineSimulator(cache_tokens=100)
    sim.submit(SimRequest("a", [1, 2], max_new_tokens=1))
    with pytest.raises(ValueError, match="Duplicate request ID"):
        sim.submit(SimRequest("a", [1, 2], max_new_tokens=1))
    with pytest.raises(ValueError, match="longer than the model's context length"):
        sim.submit(SimRequest("b", list(range(100)), max_new_tokens=1))
    with pytest.raises(ValueError, match="must not be empty"):
        sim.submit(SimRequest("c", [], max_new_tokens=1))
    with pytest.raises(ValueError, match="max_new_tokens"):
        sim.submit(SimRequest("d", [1], max_new_tokens=-1))
    sim.submit(SimRequest("e", list(range(90)), max_new_tokens=50))
    sim.run()
    assert sim.outcome("e").completion_tokens == 10  # clipped to the context
    sim.forget("a")
    sim.submit(SimRequest("a", [1, 2], max_new_tokens=1, arrival=sim.now))


def test_flush_cache_only_when_idle() -> None:
    sim = EngineSimulator()
    sim.submit(SimRequest("a", _prompt(1, 10), max_new_tokens=5))
    assert not sim.flush_cache()
    sim.run()
    assert sim.cache.size > 0
    assert sim.flush_cache()
    assert sim.cache.size == 0


def test_a_long_prompt_pays_one_step_overhead_per_chunk() -> None:
    sim = EngineSimulator(chunked_prefill_size=1000)
    (outcome,) = sim.run_batch([SimRequest("a", _prompt(1, 2500), max_new_tokens=1)])
    assert outcome.ttft == pytest.approx(COST.prefill_time(2500, steps=3))


def test_a_thousand_requests_of_a_thousand_tokens_simulate_quickly() -> None:
    rng = random.Random(0)
    articles = [_prompt(10_000 + k, 900) for k in range(32)]
    requests = []
    for i in range(1024):
        shared = articles[rng.randrange(32)] if i % 2 else _prompt(20_000 + i, 900)
        requests.append(SimRequest(f"r{i}", shared + _prompt(i, 100), 16, priority=i))
    sim = EngineSimulator()
    started = time.perf_counter()
    outcomes = sim.run_batch(requests)
    elapsed = time.perf_counter() - started
    assert all(o.completion_tokens == 16 for o in outcomes)
    assert elapsed < 2.0, f"{elapsed:.2f} s"
