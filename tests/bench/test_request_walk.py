"""The walk of one request (`bench.request_walk`): the tracer counts what it says, and the
server's walk stays within the limits docs/dev/architecture.md states."""

from __future__ import annotations

import asyncio
import threading

from bench.request_walk import (
    ThreadWalk,
    WalkTracer,
    trace_one_request,
    trace_walk_and_handoffs,
)
from inference_auctions.billing import format_micros, parse_credits, request_key

# docs/dev/architecture.md, "One request's walk": the ceilings this test keeps (46 modules
# since the rolling head's pricing, the per-user rate limits, the key read once for
# authentication and the connection share, and the request's fields for its log lines; 47
# since a dispatched prompt is recorded as resident in the engine's cache; 48 since the posted
# price floor is on by default and steps at every clearing, a lone request's included).
MAX_MODULES = 48
# Returns: 289-297 measured on a quiet machine, 308 once while benchmarks ran beside it (the
# pool takes a turn more or less as the engine's answers come); the ceiling leaves room for that.
MAX_RETURNS = 320
# The hand-offs of the same request, as `--handoffs` counts them (docs/dev/architecture.md):
# two tasks created (the route's, and its generation's, which reads the engine's stream, feeds
# the ticket and records the outcome); two jobs for the ledger's thread (the hold with its
# settlement, the served record); the route's task suspended at most 3 times (the prompt's
# tokens and the request's end; a third when the client's body comes after its headers).
MAX_TASKS_CREATED = 2
MAX_THREAD_TRIPS = 2
MAX_ROUTE_SUSPENSIONS = 3


def test_a_thread_counts_crossings_and_returns_into_modules_it_visited() -> None:
    walk = ThreadWalk()
    for module in ["api", "api", "serving", "engine", "serving", "api", "ledger"]:
        walk.enter(module)
    assert walk.crossings == 5  # api>serving>engine>serving>api>ledger
    assert walk.returns == 2  # back into serving, back into api
    assert walk.steps[2] == ("engine", "serving")


def test_the_tracer_sees_calls_into_the_project_on_every_thread_only_while_recording() -> None:
    tracer = WalkTracer()
    tracer.install()
    try:
        parse_credits("1", "bid")  # before recording: not counted
        with tracer.recording():
            format_micros(parse_credits("0.5", "bid"))
            worker = threading.Thread(target=parse_credits, args=("2", "bid"))
            worker.start()
            worker.join()
    finally:
        tracer.uninstall()
    walk = tracer.walk()
    assert walk.threads == 2
    assert set(walk.modules) == {"billing.money"}
    assert walk.calls >= 3
    assert walk.crossings == 0  # one module: nothing to cross


def test_a_module_counted_as_another_is_crossed_as_that_one() -> None:
    tracer = WalkTracer({"billing.money": "billing.merged", "billing": "billing.door"})
    tracer.install()
    try:
        with tracer.recording():
            format_micros(parse_credits("0.5", "bid"))
            request_key("ada", "walk-1")  # billing.inputs: counted as its folder's
    finally:
        tracer.uninstall()
    walk = tracer.walk()
    assert set(walk.modules) == {"billing.merged", "billing.door"}
    assert walk.crossings == 1


def test_one_generate_through_the_server_stays_within_the_architectures_limits() -> None:
    walk = trace_one_request()
    assert "server.serving.service" in walk.modules, walk.modules
    assert "server.engine.sglang_http" in walk.modules  # the engine ran in its own process
    assert not any(module.startswith("server.emulator") for module in walk.modules)
    assert len(walk.modules) <= MAX_MODULES, walk.modules
    assert walk.returns <= MAX_RETURNS, walk.figures()


def test_the_tracer_counts_tasks_created_their_steps_and_jobs_for_threads() -> None:
    async def worker() -> None:
        await asyncio.sleep(0)  # two suspensions: three steps
        await asyncio.sleep(0)

    async def route() -> None:
        await asyncio.gather(asyncio.create_task(worker()), asyncio.create_task(worker()))
        await asyncio.to_thread(sum, [1, 2])

    tracer = WalkTracer()
    tracer.install()
    try:
        with tracer.recording():
            asyncio.run(route())
    finally:
        tracer.uninstall()
    handoffs = tracer.handoffs()
    # asyncio.run's own (its shutdown's tasks) aside:
    ours = sorted(name for name in handoffs.tasks_created if "<locals>" in name)
    assert ours == [
        "test_the_tracer_counts_tasks_created_their_steps_and_jobs_for_threads.<locals>.route",
        *["test_the_tracer_counts_tasks_created_their_steps_and_jobs_for_threads.<locals>.worker"]
        * 2,
    ]
    worker_steps = [n for task, n in handoffs.task_steps.items() if ".worker #" in task]
    assert worker_steps == [3, 3]
    assert handoffs.thread_trips == {"asyncio.to_thread": 1}


def test_one_generate_s_hand_offs_stay_within_the_budget() -> None:
    # On a loaded machine the route may also wait a turn for what is not the server's own
    # doing (the client's body arriving after its headers, the engine's tokens): the fewest
    # suspensions of up to three traces is what the code itself costs.
    traced = []
    for _ in range(3):
        traced.append(trace_walk_and_handoffs()[1])
        if traced[-1].route_suspensions() <= MAX_ROUTE_SUSPENSIONS:
            break
    handoffs = min(traced, key=lambda traced_once: traced_once.route_suspensions())
    assert handoffs.tasks_created.count("RequestResponseCycle.run_asgi") == 1, handoffs
    assert len(handoffs.tasks_created) <= MAX_TASKS_CREATED, handoffs.tasks_created
    assert handoffs.thread_trips.get("ledger lane", 0) >= 1  # the hold went to the ledger
    assert sum(handoffs.thread_trips.values()) <= MAX_THREAD_TRIPS, handoffs.thread_trips
    assert 1 <= handoffs.route_suspensions() <= MAX_ROUTE_SUSPENSIONS, handoffs.task_steps
