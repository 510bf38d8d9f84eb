"""Serving one dispatched request: its deadlines, its durable outcome, its refund.

The engine's chunks go to the ticket as they come, except the last: that one is withheld until
the request's outcome is committed to the ledger (`served`, moving it out of `scheduled` only
if it is still there). If that commit fails, or crash recovery failed and refunded the request
first, the client gets a 503 instead of the end of its answer. A request that fails at the
engine is recorded `failed` together with its refund, in one transaction.

A request sent to the engine ahead of its batch's commit (`server.speculation`) is streamed
the same way, but its follower writes nothing about it (`served`, a refund, its end) before
that commit settled the batch; if it did not, the follower lets the request go untouched, and
it is cleared again (`server.batch_closing`).

Two deadlines: the stall deadline (no token for `engine_stall_timeout_seconds`) fails the
request, refunded; the operator's total cap (`engine_max_seconds`) ends it *served*, with the
output so far and `finish_reason` `abort`, as SGLang reports an aborted request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from inference_auctions.billing import Ledger, RequestNotScheduled, ServedInput
from inference_auctions.server.admission import unavailable
from inference_auctions.server.clearing import ClearedBatch
from inference_auctions.server.engine.base import EngineChunk
from inference_auctions.server.engine.errors import EngineError, EngineTimeout
from inference_auctions.server.engine.generation import Generation
from inference_auctions.server.errors import EngineFailed, EngineTimedOut, ServiceError
from inference_auctions.server.ledger_writer import LedgerWriter
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.settings import ServerSettings
from inference_auctions.server.stream_deadlines import StreamDeadlines
from inference_auctions.server.tickets import Chunk, Ticket

log = logging.getLogger(__name__)

_REASON_CHARS = 400  # the ledger keeps reasons of up to 500 characters


class _Stalled(Exception):
    """No chunk came within the stall deadline."""


@dataclass(frozen=True, slots=True)
class _Streamed:
    final: Chunk | None  # the finishing chunk, withheld from the ticket until recorded
    ttft: float | None  # seconds from dispatch to the first chunk
    streamed: bool = False  # whether the engine sent anything at all


@dataclass
class Serving:
    """Follows dispatched requests to their end (one `serve` task per request)."""

    settings: ServerSettings
    ledger: Ledger
    writer: LedgerWriter
    metrics: Metrics
    freed: Callable[[str], None]  # called with its engine rid once a request leaves the engine
    started: Callable[[str], None] = lambda _: None  # called at its first token (deferral)
    # Every stream's stall and total deadlines, on one timer (`server.stream_deadlines`).
    _deadlines: StreamDeadlines = field(init=False)

    def __post_init__(self) -> None:
        settings = self.settings
        self._deadlines = StreamDeadlines(
            settings.engine_stall_timeout_seconds, settings.engine_max_seconds
        )

    async def serve(
        self,
        ticket: Ticket,
        generation: Generation,
        batch: ClearedBatch,
        settled: asyncio.Future[bool] | None = None,
    ) -> None:
        """Stream the generation into the ticket; record the outcome before the last byte.
        `settled`: the commit's verdict on a batch sent ahead of it (`server.speculation`);
        nothing is recorded or finished before it, nothing at all if it is False."""
        error: ServiceError | None = None
        streamed = _Streamed(None, None)
        try:
            streamed = await self._stream(ticket, generation)
        except _Stalled:
            generation.cancel("the auction server's stall deadline passed")
            seconds = self.settings.engine_stall_timeout_seconds
            error = EngineTimedOut(
                f"the engine produced nothing for request {ticket.rid!r} within its deadline "
                f"({seconds:g} s without a token)"
            )
        except EngineTimeout as failure:
            detail = _client_words(failure, ticket)
            error = EngineTimedOut(f"the engine timed out on request {ticket.rid!r}: {detail}")
        except EngineError as failure:
            detail = _client_words(failure, ticket)
            error = EngineFailed(f"the engine failed request {ticket.rid!r}: {detail}")
        finally:
            self.freed(ticket.engine_rid)
        if settled is not None and not await settled:
            return  # the batch is void: it is cleared again (`server.batch_closing`)
        if ticket.left:
            await ticket.finish(await self._departed(ticket, batch))
            return
        if error is None and not streamed.streamed:
            error = EngineFailed(f"the engine returned nothing for request {ticket.rid!r}")
        if error is not None:
            await self._fail(ticket, batch, error)
            await ticket.finish(error)
            return
        refused = await self._record_served(ticket, streamed)
        if refused is None and streamed.final is not None:
            await ticket.push(streamed.final)
        await ticket.finish(refused)

    async def _stream(self, ticket: Ticket, generation: Generation) -> _Streamed:
        assert ticket.dispatched is not None
        chunks: AsyncIterator[EngineChunk] = generation.chunks().__aiter__()
        last: Chunk | None = None
        ttft: float | None = None
        try:
            # One scope for the whole stream, expired by the server's `StreamDeadlines`: no
            # scope per chunk, no timer per stream.
            async with asyncio.timeout(None) as scope:
                deadlines = self._deadlines.watch(scope)
                try:
                    while True:
                        deadlines.waiting()
                        try:
                            engine_chunk = await anext(chunks)
                        except StopAsyncIteration:
                            return _Streamed(None, ttft, streamed=last is not None)
                        if ttft is None:
                            ttft = ticket.first_token = time.monotonic() - ticket.dispatched
                            self.metrics.engine_ttft.observe(ttft)
                            self.started(ticket.engine_rid)
                        # The engine's own objects, not copies: each chunk is made afresh,
                        # and copying its cumulative ids would cost time quadratic in them.
                        chunk = Chunk(
                            engine_chunk.text, engine_chunk.output_ids, engine_chunk.meta_info
                        )
                        if engine_chunk.finished:
                            return _Streamed(chunk, ttft, streamed=True)  # withheld until recorded
                        await ticket.push(chunk)
                        last = chunk
                finally:
                    deadlines.cancel()
        except TimeoutError:
            if not deadlines.capped or last is None:
                raise _Stalled from None
            generation.cancel("the operator's total-time cap passed")
            cap = self.settings.engine_max_seconds
            assert cap is not None
            return _Streamed(_capped(last, cap), ttft, streamed=True)

    async def _record_served(self, ticket: Ticket, streamed: _Streamed) -> ServiceError | None:
        """Commit `served`; the error to answer instead if that fails (None: committed)."""
        final = streamed.final or ticket.last_chunk
        meta = {} if final is None else final.meta_info
        cached = meta.get("cached_tokens")
        cached_tokens = (
            min(max(cached, 0), len(ticket.tokens))
            if isinstance(cached, int) and not isinstance(cached, bool)
            else None
        )
        ttft_ms = None if streamed.ttft is None else streamed.ttft * 1000
        try:
            recorded = await self.writer.served(
                ServedInput(ticket.ledger_rid, cached_tokens, ttft_ms)
            )
        except Exception as failure:
            self.metrics.ledger_errors.labels(operation="record").inc()
            self.metrics.count_request("failed")
            log.error("recording request %r served failed: %s", ticket.rid, failure)
            return unavailable(
                f"the answer to request {ticket.rid!r} could not be recorded; it counts as "
                "unserved and will be refunded; send it again with a new rid"
            )
        if not recorded:
            self.metrics.count_request("failed")
            log.warning("request %r was recorded unserved (recovery) before its answer", ticket.rid)
            return unavailable(
                f"request {ticket.rid!r} was counted unserved and refunded before its answer "
                "could be recorded; send it again with a new rid"
            )
        self.metrics.count_request("served")
        self.metrics.record_cache(
            int(meta.get("prompt_tokens", len(ticket.tokens))), cached_tokens or 0
        )
        return None

    async def _departed(self, ticket: Ticket, batch: ClearedBatch) -> ServiceError:
        """Record a request whose client left (`server.departure`) by the rule of
        docs/SPEC.md, "A client that leaves"; the error its ticket ends with."""
        if ticket.first_token is None:
            error = unavailable(
                f"the client of request {ticket.rid!r} left before its first token; it was "
                "stopped and refunded"
            )
            await self._fail(ticket, batch, error, cause="client")
            return error
        self.metrics.count_request("abandoned")
        try:
            await self.writer.call(
                self.ledger.record_abandoned, ticket.ledger_rid, None, ticket.first_token * 1000
            )
        except RequestNotScheduled:  # recovery failed and refunded it first
            log.info("request %r was already recorded unserved", ticket.rid)
        except Exception as failure:  # it stays scheduled: `refund-unserved` refunds it
            self.metrics.ledger_errors.labels(operation="record").inc()
            log.error("recording request %r abandoned failed: %s", ticket.rid, failure)
        return unavailable(
            f"the client of request {ticket.rid!r} left before its answer was complete; it "
            "was stopped and keeps its charge"
        )

    async def _fail(
        self, ticket: Ticket, batch: ClearedBatch, error: ServiceError, cause: str = "engine"
    ) -> None:
        """Record the request failed and refund what its failure is worth, at once."""
        self.metrics.count_request("failed")
        target = batch.refund_after_failure(ticket.user, ticket.ledger_rid)
        try:
            await self.writer.call(
                self.ledger.record_failed,
                ticket.ledger_rid,
                batch.batch_id,
                ticket.user,
                target_micros=target,
                reason=f"{cause}: {error.message}"[:_REASON_CHARS],
            )
        except RequestNotScheduled:  # recovery failed and refunded it first
            log.info("request %r was already recorded unserved", ticket.rid)
        except Exception as failure:  # it stays scheduled: `refund-unserved` refunds it
            self.metrics.ledger_errors.labels(operation="refund").inc()
            log.error(
                "recording request %r failed (refund owed, run refund-unserved): %s",
                ticket.rid,
                failure,
            )


def _client_words(failure: EngineError, ticket: Ticket) -> str:
    """The engine's message, naming the request by the client's rid, not the ledger's id."""
    return (
        str(failure).replace(ticket.engine_rid, ticket.rid).replace(ticket.ledger_rid, ticket.rid)
    )


def _capped(last: Chunk, cap: float | None) -> Chunk:
    """The last chunk, finished as SGLang finishes an aborted request."""
    reason = {"type": "abort", "message": f"the server's total-time cap of {cap:g} s passed"}
    return Chunk(last.text, last.output_ids, {**last.meta_info, "finish_reason": reason})
