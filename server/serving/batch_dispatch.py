"""Handing cleared batches to the engine, and knowing how busy the engine is.

`BatchDispatch.dispatch` turns a cleared batch's tickets into engine requests in the
auction's order (each with its clearance's sequence as its priority), hands them to the prefix
deferral (`server.serving.deferred_dispatch`), and starts one follower per request once it is sent
(`server.serving.following.Serving`: its stream, its outcome, its refund).

It also counts what the pool needs to decide when to close a batch (`server.serving.pool`): the
requests outstanding at the engine, and those sent but not started (no first token yet), whose
total is how saturated the engine is. Every change of either wakes the pool.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from inference_auctions.billing import Ledger
from inference_auctions.server.engine.base import Engine, EngineRequest
from inference_auctions.server.engine.generation import Generation
from inference_auctions.server.ledger_writer.writer import LedgerWriter
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.serving import departure
from inference_auctions.server.serving.clearing import ClearedBatch
from inference_auctions.server.serving.deferral import DeferralSettings
from inference_auctions.server.serving.deferred_dispatch import DeferredDispatch
from inference_auctions.server.serving.dispatch_ahead import Speculation
from inference_auctions.server.serving.engine_capacity import EngineCapacity
from inference_auctions.server.serving.following import Serving
from inference_auctions.server.serving.tickets import Clearance, Ticket
from inference_auctions.server.settings import ServerSettings

__all__ = ["BatchDispatch", "deferral_settings"]


class BatchDispatch:
    """Sends cleared batches to the engine and follows each request (see the docstring);
    `wake` is called whenever the engine may admit more."""

    def __init__(
        self,
        settings: ServerSettings,
        engine: Engine,
        ledger: Ledger,
        writer: LedgerWriter,
        metrics: Metrics,
        wake: Callable[[], None],
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._wake = wake
        # In-step prefix deferral: the dispatcher sends each request when the rule lets it go.
        self._deferral = DeferredDispatch(engine, deferral_settings(settings), metrics)
        self._serving = Serving(
            settings, ledger, writer, metrics, self.freed, started=self._started
        )
        self.inflight = 0
        # Sent to the engine (or held back by deferral) without a first token yet: engine rid
        # -> prompt tokens. Their total is how saturated the engine is (`saturated`).
        self._unstarted: dict[str, int] = {}
        self._unstarted_tokens = 0
        # Recent (overhead, batching wait) of each request, for benchmarks and operators.
        self._timings: deque[tuple[float, float]] = deque(maxlen=100_000)
        self._followers: set[asyncio.Task[None]] = set()
        # What the engine can admit next, learnt from it (`server.serving.engine_capacity`).
        self.capacity = EngineCapacity(
            engine,
            tokens_override=settings.saturation_tokens,
            requests_override=settings.saturation_requests,
            poll_seconds=settings.engine_poll_ms / 1000,
            unstarted=lambda: len(self._unstarted),
            wake=wake,
        )

    def dispatch(
        self,
        ordered: list[Ticket],
        clearances: list[Clearance],
        batch: ClearedBatch,
        speculation: Speculation | None = None,
    ) -> None:
        """Hand the batch to the engine in the auction's order; follow each request. A batch
        sent ahead of its commit (`speculation`) is followed under the commit's verdict."""
        self.inflight += len(ordered)
        requests = []
        now = time.monotonic()
        for ticket, clearance in zip(ordered, clearances, strict=True):
            ticket.dispatched = now
            self._unstarted[ticket.engine_rid] = len(ticket.tokens)
            self._unstarted_tokens += len(ticket.tokens)
            self._metrics.dispatch_lag.observe(now - ticket.arrived)
            if ticket.overhead is not None and ticket.batching_wait is not None:
                self._metrics.overhead.observe(ticket.overhead)
                self._timings.append((ticket.overhead, ticket.batching_wait))
            requests.append(
                EngineRequest(
                    rid=ticket.engine_rid,
                    input_ids=ticket.tokens,
                    sampling_params=self._engine_sampling(ticket),
                    priority=clearance.sequence,
                    stream=True,
                )
            )
        settled = None if speculation is None else speculation.settled

        def follow(place: int, generation: Generation) -> None:
            task = self._follow(self._serving.serve(ordered[place], generation, batch, settled))
            departure.sent(ordered[place], generation.cancel)
            if speculation is not None:
                speculation.follow(generation, task)

        self._deferral.dispatch(batch.outcome, requests, follow)

    async def void(self, speculation: Speculation) -> None:
        """Take a batch sent ahead back from the engine, its requests no longer in flight."""
        for engine_rid in await speculation.void(self._deferral):
            self.freed(engine_rid)

    def saturated(self) -> bool:
        """Whether the engine has what it can admit at its next step (`engine_capacity`)."""
        return self.capacity.saturated(self._unstarted_tokens, len(self._unstarted), self.inflight)

    def freed(self, engine_rid: str) -> None:
        """A request left the engine (or failed before it started)."""
        self._unstarted_tokens -= self._unstarted.pop(engine_rid, 0)
        self._deferral.ended(engine_rid)  # a request held back for this one's prefix may go
        self.inflight -= 1
        self._wake()

    def recent_timings(self) -> list[tuple[float, float]]:
        """(overhead, batching wait) in seconds of the most recent requests, oldest first."""
        return list(self._timings)

    async def drain(self) -> None:
        """Wait until every request sent has been followed to its end."""
        while self._followers:
            await asyncio.gather(*list(self._followers), return_exceptions=True)

    def close(self) -> None:
        """Stop the deferral's timer; nothing is dispatched afterwards."""
        self._deferral.close()

    def _started(self, engine_rid: str) -> None:
        self._unstarted_tokens -= self._unstarted.pop(engine_rid, 0)
        self._deferral.first_token(engine_rid)  # a request held back for its prefix may go
        self._wake()

    def _follow(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._followers.add(task)
        task.add_done_callback(self._followers.discard)
        return task

    def _engine_sampling(self, ticket: Ticket) -> dict[str, Any]:
        """The sampling parameters sent to the engine. Every request is streamed from the
        engine, so that its first token is seen (saturation, deferral); one whose client
        waits for the whole answer asks for a chunk per `engine_stream_interval` tokens
        instead of one per token (SGLang's per-request `stream_interval`: the first token, then
        every k-th), which spares both processes most of the per-chunk work."""
        if ticket.streamed:
            return ticket.sampling_params
        return {**ticket.sampling_params, "stream_interval": self._settings.engine_stream_interval}


def deferral_settings(settings: ServerSettings) -> DeferralSettings | None:
    """The deferral rule's settings; None when it is off or cannot apply (ordered mode)."""
    if not settings.deferral or settings.engine_mode != "priority":
        return None
    return DeferralSettings(settings.deferral_tokens, settings.deferral_max_hold_ms / 1000)
