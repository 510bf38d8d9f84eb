"""`free_traffic`, end to end on a real server and port: under `idle` (the default) a free
request is not sent to the engine while a paying one is there, and goes once it has ended;
under `shared` it goes beside it. Shown by the order in which the engine received and ended
requests, with a paying request held at the engine for as long as the test wants."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import httpx
import pytest

from inference_auctions.billing import Ledger
from inference_auctions.server.emulator.embedded import EmbeddedEngine
from inference_auctions.server.engine.protocol import Generation
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase
from tests.server.harness import TEST_SETTINGS, serve_app

FREE = [f"free-{index}" for index in range(3)]


class _RecordingEngine(EmbeddedEngine):
    """The embedded engine, writing down each request it receives (with its sampling) and each
    that ends (by the client's rid), and holding back the one whose rid is `hold` until
    `release()`."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.events: list[tuple[str, str]] = []
        self.sampling: dict[str, dict[str, Any]] = {}
        self._held: list[Generation] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def _send(self, generations: list[Generation]) -> None:
        self._loop = asyncio.get_running_loop()
        for generation in generations:
            rid = generation.request.rid.rsplit("/", 1)[-1]
            self.events.append(("sent", rid))
            self.sampling[rid] = dict(generation.request.sampling_params)
            generation.on_end(functools.partial(self.events.append, ("ended", rid)))
        held = [g for g in generations if g.request.rid.endswith("/hold")]
        self._held.extend(held)
        super()._send([g for g in generations if g not in held])

    @property
    def held(self) -> int:
        return len(self._held)

    def release(self) -> None:
        assert self._loop is not None, "nothing was held"
        self._loop.call_soon_threadsafe(EmbeddedEngine._send, self, self._held)

    def when(self, kind: str, rid: str) -> int:
        """The place of an event in the engine's order."""
        return self.events.index((kind, rid))


async def _metric(client: httpx.AsyncClient, name: str) -> float:
    text = (await client.get("/metrics")).text
    line = next(x for x in text.splitlines() if x.startswith(f"{name} "))
    return float(line.split()[1])


class _Market(NamedTuple):
    """A server in front of a recording engine, a payer's and a free user's clients, and an
    unauthenticated one for the metrics."""

    engine: _RecordingEngine
    ledger: Ledger
    client: httpx.AsyncClient
    paying: httpx.AsyncClient
    freeloading: httpx.AsyncClient


@contextlib.asynccontextmanager
async def _market(
    ledger_db: MigratedDatabase, time_scale: float, **settings: Any
) -> AsyncIterator[_Market]:
    engine = _RecordingEngine(time_scale=time_scale)
    options = ServerSettings(database_url=ledger_db.url, **{**TEST_SETTINGS, **settings})
    with serve_app(options, engine=engine) as url:
        ledger = Ledger(ledger_db.new_engine())
        payer = ledger.create_user("payer", budget_micros=10**9).api_key
        free = ledger.create_user("free", budget_micros=0).api_key
        async with (
            httpx.AsyncClient(base_url=url, timeout=120) as client,
            httpx.AsyncClient(
                base_url=url, timeout=120, headers={"Authorization": f"Bearer {payer}"}
            ) as paying,
            httpx.AsyncClient(
                base_url=url, timeout=120, headers={"Authorization": f"Bearer {free}"}
            ) as freeloading,
        ):
            yield _Market(engine, ledger, client, paying, freeloading)


def _body(rid: str) -> dict[str, Any]:
    return {"text": f"Question {rid}?", "rid": rid, "sampling_params": {"max_new_tokens": 4}}


async def _held_paying_beside_free(
    ledger_db: MigratedDatabase, free_traffic: str
) -> tuple[_RecordingEngine, list[httpx.Response]]:
    """A paying request held at the engine; three free requests sent meanwhile, then a second
    paying request that runs to its end; then the held one is released. The engine could start
    every one of them at once (`saturation_requests`), so only the rule holds a free one back."""
    async with _market(
        ledger_db, 0.01, free_traffic=free_traffic, saturation_requests=16
    ) as market:
        engine, _, client, paying, freeloading = market
        held = asyncio.create_task(paying.post("/generate", json=_body("hold") | {"bid": "0.01"}))
        while not engine.held:
            await asyncio.sleep(0.005)
        tasks = [
            asyncio.create_task(freeloading.post("/generate", json=_body(rid))) for rid in FREE
        ]
        if free_traffic == "idle":  # they wait in the pool...
            while await _metric(client, "inference_auction_queue_length") < len(FREE):
                await asyncio.sleep(0.005)
        else:  # ...or are served beside the held one
            for task in tasks:
                assert (await task).status_code == 200
        # A clearing after the free arrivals: a paying request goes, and ends.
        second = await paying.post("/generate", json=_body("pay-2") | {"bid": "0.01"})
        assert second.status_code == 200, second.text
        engine.release()
        responses = [await held, *[await task for task in tasks], second]
    return engine, responses


@pytest.mark.anyio
async def test_idle_free_requests_wait_until_no_paying_request_is_at_the_engine(
    ledger_db: MigratedDatabase,
) -> None:
    engine, responses = await _held_paying_beside_free(ledger_db, "idle")
    assert [r.status_code for r in responses] == [200] * len(responses)
    # Nothing free reached the engine while the held paying request was there, even though a
    # later paying request was sent, and ended, meanwhile...
    assert engine.when("sent", "pay-2") < engine.when("ended", "pay-2")
    assert engine.when("ended", "pay-2") < engine.when("ended", "hold")
    # ...and every free one went once it had ended.
    assert all(engine.when("ended", "hold") < engine.when("sent", rid) for rid in FREE)
    assert all(engine.when("sent", rid) < engine.when("ended", rid) for rid in FREE)


@pytest.mark.anyio
async def test_shared_free_requests_go_beside_a_paying_request(
    ledger_db: MigratedDatabase,
) -> None:
    engine, responses = await _held_paying_beside_free(ledger_db, "shared")
    assert [r.status_code for r in responses] == [200] * len(responses)
    # Sent and served while the paying request was held at the engine.
    held_end = engine.when("ended", "hold")
    assert all(engine.when("sent", "hold") < engine.when("sent", rid) for rid in FREE)
    assert all(engine.when("ended", rid) < held_end for rid in FREE)


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_free_long_answer_yields_the_engine_to_a_paying_request_and_resumes(
    ledger_db: MigratedDatabase, streamed: bool
) -> None:
    """Under `idle`: a free long answer is running when a paying request arrives. The free
    one is stopped at once (though the engine had room for both: on a CPU a decode step costs
    in proportion to the requests in it), the paying one served, then the free one resumes
    from where it was and ends with every token it asked for, as one answer (streamed: every
    chunk continues the one before)."""
    long_answer = 600
    async with _market(ledger_db, 0.05, free_traffic="idle") as market:
        engine, ledger, client, paying, freeloading = market
        body = _body("long") | {
            "sampling_params": {"max_new_tokens": long_answer, "min_new_tokens": long_answer - 8},
            "stream": streamed,
        }
        freed = asyncio.create_task(freeloading.post("/generate", json=body))
        while await _metric(client, "inference_auction_engine_ttft_seconds_count") < 1:
            await asyncio.sleep(0.01)  # the free answer is streaming at the engine
        paid = await paying.post("/generate", json=_body("pay") | {"bid": "0.01"})
        assert paid.status_code == 200, paid.text
        answer = await freed
        preempted = await _metric(client, "inference_auction_free_preempted_total")
        report = ledger.reconcile()
    assert answer.status_code == 200, answer.text
    if streamed:
        events = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
        chunks = [json.loads(event) for event in events[1:] if event != "[DONE]"]
        texts = [chunk["text"] for chunk in chunks]
        assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
        counts = [chunk["meta_info"]["completion_tokens"] for chunk in chunks]
        assert counts == sorted(counts) and len(set(counts)) == len(counts)
        payload = chunks[-1]
    else:
        payload = answer.json()
    assert payload["meta_info"]["completion_tokens"] == long_answer
    assert len(payload["output_ids"]) == long_answer
    assert preempted == 1
    # The engine's order: the free one sent, and stopped for the paying one, which ends
    # before the free one is sent again, under a rid of its own, to its end.
    assert sorted(engine.events) == sorted(
        [(kind, rid) for rid in ("long", "pay", "long~1") for kind in ("sent", "ended")]
    )
    assert engine.when("sent", "long") < engine.when("ended", "long") < engine.when("ended", "pay")
    assert engine.when("ended", "pay") < engine.when("sent", "long~1")
    # Sent again for what it had left: both its maximum and its minimum less what it produced.
    first, again = engine.sampling["long"], engine.sampling["long~1"]
    done = long_answer - again["max_new_tokens"]
    assert 0 < done < long_answer
    assert (first["max_new_tokens"], first["min_new_tokens"]) == (long_answer, long_answer - 8)
    assert again["min_new_tokens"] == long_answer - 8 - done
    assert report.ok, report


@pytest.mark.anyio
async def test_a_free_request_nearly_done_is_not_preempted(ledger_db: MigratedDatabase) -> None:
    """A free answer with fewer tokens left than stopping and resuming it is worth runs to its
    end beside the paying request that came meanwhile: it is sent once."""
    # Slow enough to be running when the payer comes.
    async with _market(ledger_db, 1.0, free_traffic="idle") as market:
        engine, _, client, paying, freeloading = market
        body = _body("short") | {"sampling_params": {"max_new_tokens": 24}}
        freed = asyncio.create_task(freeloading.post("/generate", json=body))
        while await _metric(client, "inference_auction_engine_ttft_seconds_count") < 1:
            await asyncio.sleep(0.01)
        paid = await paying.post("/generate", json=_body("pay") | {"bid": "0.01"})
        answer = await freed
        preempted = await _metric(client, "inference_auction_free_preempted_total")
    assert paid.status_code == 200 and answer.status_code == 200
    assert answer.json()["meta_info"]["completion_tokens"] == 24
    assert preempted == 0
    assert engine.when("sent", "pay") < engine.when("ended", "short")  # it ran beside it
    assert [rid for kind, rid in engine.events if kind == "sent"].count("short") == 1
