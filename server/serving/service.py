"""The path of one request, as one walk: hold, wait in the pool, clear, settle, dispatch.

    admit()   refuse what the engine would refuse (context length), queue the bid's hold for
              the ledger writer, join the pool, answer 402 if the hold is refused
              (`server.serving.admission`)
    closing   a batch closed: claim its holds, run the auction and settle it in ONE ledger
              transaction, the writer's next group commit, which places any of its holds
              still queued first; when its users can afford their queued bids as of the last
              commit, it is cleared at once and sent to the engine while that commit runs,
              no answer leaving before the commit settles it (`server.serving.clearing`)
    dispatch  hand the cleared batch to the engine in the auction's order, and count what is
              outstanding there, which tells the pool when to close the next batch
              (`server.serving.dispatch`); stream each request into its ticket and record its
              outcome before its last byte, refunding an engine failure (`server.serving.following`)

A request id is the client's idempotency key: a retry with the same payload joins the same
ticket (and is never charged twice); the same id with another payload is a 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, NamedTuple

from inference_auctions.billing import Ledger
from inference_auctions.server.auction.price_floor import PostedFloor
from inference_auctions.server.auction.rolling import HeadPricing
from inference_auctions.server.engine.errors import EngineError, EngineTimeout
from inference_auctions.server.engine.protocol import (
    ContextTooLong,
    Engine,
    TokenArray,
    TokenIds,
    check_context_length,
)
from inference_auctions.server.errors import (
    EngineFailed,
    EngineTimedOut,
    InvalidRequest,
    ServiceError,
    Unavailable,
)
from inference_auctions.server.ledger_writer.writer import LedgerWriter
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.request_context import (
    current_request_id,
    current_trace_headers,
    ticket_var,
)
from inference_auctions.server.serving.admission import (
    Admission,
    Admissions,
    AnswerMemory,
    conflict,
    held,
    hold_was_placed,
    ledger_rid,
    payload_fingerprint,
    queue_hold,
    unavailable,
)
from inference_auctions.server.serving.clearing import BatchClosing
from inference_auctions.server.serving.clearing_log import ClearingLog
from inference_auctions.server.serving.dispatch import BatchDispatch
from inference_auctions.server.serving.dispatch_ahead import Distrust
from inference_auctions.server.serving.pool import (
    BatchingPolicy,
    BatchPool,
    EngineShares,
    PoolClosed,
    QueueFull,
    Wakeup,
)
from inference_auctions.server.serving.resident_prefixes import ResidentPrefixes
from inference_auctions.server.serving.selection import PoolSelector
from inference_auctions.server.serving.tickets import Ticket
from inference_auctions.server.serving.tiers import TierFigures
from inference_auctions.server.settings import ServerSettings

__all__ = ["AuctionService", "Load", "new_batch_id", "payload_fingerprint"]


class Load(NamedTuple):
    """How busy the server is: requests waiting in its pool, and outstanding at the engine."""

    queue: int
    inflight: int


def new_batch_id() -> str:
    """Sortable by time, unique across replicas."""
    return f"b{time.time_ns():x}{secrets.token_hex(4)}"


class AuctionService:
    """Owns the tickets, the pool, the ledger writer and the engine of one server process;
    admits requests itself and lends the rest of their walk to `BatchClosing` and
    `BatchDispatch` (see the module docstring)."""

    def __init__(
        self,
        settings: ServerSettings,
        ledger: Ledger,
        engine: Engine,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self._engine = engine
        self.metrics = Metrics(
            queue_length=lambda: len(self._pool), inflight=lambda: self._dispatch.inflight
        )
        # Every ledger write of the serving path, grouped into one lane (group commit).
        self.writer = LedgerWriter(
            ledger,
            observe_group=self.metrics.ledger_group_writes.observe,
        )
        self._admissions = Admissions(self.writer, ledger, self.metrics)
        # Set by whatever changes the engine's load; the pool waits on it.
        wakeup = Wakeup()
        self._dispatch = BatchDispatch(
            settings, engine, ledger, self.writer, self.metrics, wakeup=wakeup
        )
        self._distrust = Distrust()
        # The tiers sold under `pricing tiers`, and what each recently bought.
        self.tier_menu = settings.tier_menu() if settings.pricing == "tiers" else None
        self.tier_figures = TierFigures(self.tier_menu)
        self.metrics.pricing_mode.labels(mode=settings.pricing).set(1)
        closing = BatchClosing(
            settings,
            self.writer,
            self.metrics,
            self._dispatch,
            self._distrust,
            admissions=self._admissions,
            new_batch_id=new_batch_id,
            clock=clock,
            tier_figures=self.tier_figures,
            still_waiting=lambda: len(self._pool),
        )
        policy = BatchingPolicy(
            batch_size=settings.batch_size,
            max_wait=settings.max_wait_ms / 1000,
            max_inflight=settings.max_inflight,
            max_queue=settings.max_queue,
        )
        self._shares = EngineShares(
            settings,
            wakeup=wakeup,
            learnt_tokens=lambda: self._dispatch.capacity.limits.max_total_num_tokens,
        )
        rolling = settings.scheduling == "rolling"
        self.price_floor = self._posted_floor(settings)
        if self.price_floor is not None:
            floor = self.price_floor
            self.metrics.price_floor.set_function(lambda: floor.micros)
        self._clearing_log = (
            ClearingLog(settings.clearing_log) if rolling and settings.clearing_log else None
        )
        self._pool: BatchPool[Ticket, HeadPricing] = BatchPool(
            policy,
            closing,
            lambda: self._dispatch.inflight,
            saturated=self._dispatch.saturated,
            select=PoolSelector(
                settings,
                self._shares,
                lambda: self._dispatch.startable()[1],
                paying_at_engine=self._dispatch.paying,
                log=self._clearing_log,
                resident=ResidentPrefixes(lambda: self._shares.engine_tokens),
                floor=self.price_floor,
            ),
            wakeup=wakeup,
            startable=(lambda: self._dispatch.startable()[0]) if rolling else None,
            yielding=self._dispatch,
            pays=lambda ticket: ticket.bid_micros > 0,
        )
        self._answers = AnswerMemory(
            settings.answer_memory_mib * 2**20, self._admissions.forget_if_current
        )
        self._tasks: set[asyncio.Task[None]] = set()  # releases of abandoned requests
        self._runner: asyncio.Task[None] | None = None

    def _posted_floor(self, settings: ServerSettings) -> PostedFloor | None:
        """The posted price floor under `price_floor posted`; its target, unless set, is what
        the engine can start at its next step (its running-request limit, as learnt)."""
        if not settings.posts_price_floor:
            return None
        target = settings.price_floor_target
        if target is not None:
            fixed = target
            return PostedFloor(settings.price_floor_start, lambda: fixed)
        capacity, batch = self._dispatch.capacity, settings.batch_size
        return PostedFloor(
            settings.price_floor_start, lambda: min(capacity.request_budget(0), batch)
        )

    # What the routes ask of the service

    def waiting(self) -> list[Ticket]:
        """The requests waiting in the pool now, in arrival order."""
        return self._pool.waiting()

    def starts_per_second(self) -> float:
        """The engine's recent start rate: first tokens of this server's requests per second."""
        return self._dispatch.start_rate()

    @property
    def engine_name(self) -> str:
        """The engine's name, as `/health` and `/server_info` report it."""
        return self._engine.name

    @property
    def engine_model_name(self) -> str | None:
        """The model the engine says it serves (None until it has said)."""
        return self._engine.model_name

    async def engine_healthy(self) -> bool:
        """Whether the engine answers its health check."""
        return await self._engine.health()

    async def flush_engine_cache(self) -> bool:
        """Ask the engine to empty its prefix cache; False while requests run or wait there."""
        return await self._engine.flush_cache()

    async def tokenize(self, text: str) -> TokenArray:
        """The engine's token ids for a prompt (cached, read-only)."""
        return await self._engine.tokenize_array(text)

    async def vocab_size(self) -> int | None:
        """How many token ids the engine's model has (None: nothing tells)."""
        try:
            return await self._engine.vocab_size()
        except EngineTimeout as error:
            raise EngineTimedOut(f"asking the engine for its vocabulary: {error}") from None
        except EngineError as error:
            raise EngineFailed(f"the engine did not tell its vocabulary: {error}") from None

    async def tokenize_chat(self, messages: list[tuple[str, str]]) -> TokenArray:
        """A conversation's prompt ids, rendered with the engine's chat template."""
        return await self._engine.tokenize_chat(messages)

    async def tokenize_tool_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> TokenArray:
        """A chat with tools' prompt ids, rendered with the engine's chat template."""
        return await self._engine.tokenize_tool_chat(messages, tools)

    def load(self) -> Load:
        """Requests waiting in the pool, and outstanding at the engine, now."""
        return Load(queue=len(self._pool), inflight=self._dispatch.inflight)

    def engine_capacity(self) -> dict[str, Any]:
        """The saturation limits in force and the engine facts they come from."""
        return self._dispatch.capacity.describe()

    def recent_timings(self) -> list[tuple[float, float]]:
        """(overhead, batching wait) in seconds of the most recent requests, oldest first."""
        return self._dispatch.recent_timings()

    async def start(self) -> None:
        """Start the ledger writer, learn the engine's limits, then close batches."""
        await self.writer.start()
        await self._dispatch.capacity.start()
        self._runner = asyncio.create_task(self._pool.run(), name="batch-pool")

    async def stop(self) -> None:
        """Drain: clear every waiting request, let every dispatched one finish, then stop."""
        await self._pool.drain()
        await self._dispatch.drain()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        self._dispatch.close()
        if self._clearing_log is not None:
            self._clearing_log.close()
        await self._dispatch.capacity.close()
        await self.writer.close()

    # Admission

    async def admit(self, request: Admission) -> Ticket:
        """Hold the bid and queue the request; a retry of a known rid joins its ticket. A
        refused request's prompt leaves the engine's caches (refused requests feed none)."""
        try:
            return await self._admit(request)
        except ServiceError:
            self._engine.forget_prompt(request.tokens)
            raise

    async def _admit(self, request: Admission) -> Ticket:
        user, rid, tokens = request.user, request.rid, request.tokens
        bid_micros, sampling_params = request.bid_micros, request.sampling_params
        fingerprint, streamed = request.fingerprint, request.streamed
        known = self._admissions.known(user, rid)
        if known is not None:
            if known.fingerprint != fingerprint:
                raise conflict(rid)
            ticket_var.set(known)
            return known
        await self._check_context(tokens, sampling_params)
        ticket = Ticket(
            user=user,
            rid=rid,
            ledger_rid=ledger_rid(user, rid),
            tokens=tokens,
            bid_micros=bid_micros,
            sampling_params=sampling_params,
            fingerprint=fingerprint,
            fee_micros=self.settings.request_fee_micros,
            streamed=streamed,
            request_id=current_request_id(),
            trace_headers=current_trace_headers(),
        )
        ticket_var.set(ticket)  # the batch on this request's log lines, once it is cleared
        self._shares.check(ticket)  # 400 for a free request bigger than free traffic's share
        self._answers.reserve(ticket, self.settings.max_new_tokens_limit)  # 503 if over
        # Claimed before the first await, so a concurrent retry joins instead of racing.
        self._admissions.remember(ticket)
        try:
            # Queued before the ticket can join a batch, so the batch's claim finds the hold:
            # in the same group commit when the batch closes at once (a lone request costs one
            # ledger transaction before dispatch, not two).
            ticket.hold = queue_hold(self.writer, ticket)
            ticket.queued = time.monotonic()
            try:
                self._pool.submit(ticket)
            except (QueueFull, PoolClosed) as error:
                if await hold_was_placed(ticket):
                    await self._admissions.release(ticket, "not queued: " + str(error))
                raise unavailable(str(error)) from None
            await held(ticket.hold, self.metrics, ticket)
        except ServiceError as error:
            # Refused: if its batch has not closed, it leaves the pool; a batch that took it
            # meanwhile finds no hold to claim (or one of another payload) and leaves it out.
            self._pool.withdraw(ticket)
            if not isinstance(
                error, Unavailable
            ):  # its hold was refused: `server.serving.dispatch_ahead`
                self._distrust.add(user)
            self._admissions.forget(ticket)
            await ticket.finish(error)  # a concurrent retry that joined gets the same answer
            raise
        except asyncio.CancelledError:
            # Never leave a ticket behind that nothing will finish: a retry would wait on it
            # forever. One still in the pool leaves it, its hold released once placed; one
            # whose batch closed is served and settled like a client that left after that.
            if self._pool.withdraw(ticket):
                self._admissions.forget(ticket)
                self._spawn(
                    self._admissions.release_when_placed(ticket, "cancelled before dispatch")
                )
                await ticket.finish(unavailable("the request was cancelled before it was queued"))
            raise
        return ticket

    async def _check_context(self, tokens: TokenIds, sampling_params: dict[str, Any]) -> None:
        """Refuse, before any money moves, what the engine would refuse for its length."""
        try:
            context = await self._engine.context_length()
        except EngineTimeout as error:
            raise EngineTimedOut(f"asking the engine for its context length: {error}") from None
        except EngineError as error:
            raise EngineFailed(f"the engine did not tell its context length: {error}") from None
        if context is None:
            return
        max_new_tokens = sampling_params.get("max_new_tokens")
        try:
            check_context_length(len(tokens), max_new_tokens, context)
        except ContextTooLong as error:
            raise InvalidRequest(str(error), param=error.field) from None

    async def abandon(self, ticket: Ticket) -> None:
        """The client went away: if its batch has not closed, take it back and free its hold."""
        if self._pool.withdraw(ticket):
            await self._admissions.release_when_placed(
                ticket, "client disconnected before dispatch"
            )
            await ticket.finish(unavailable("the client disconnected"))
            self._admissions.forget(ticket)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
