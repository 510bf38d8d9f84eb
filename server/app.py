"""The FastAPI application: services built at startup, drained at shutdown."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from inference_auctions.billing import Ledger, RuleDisagreement, start_ledger_jobs, upgrade_schema
from inference_auctions.server.api import (
    admin_access_routes,
    admin_money_routes,
    admin_routes,
    dashboard_page,
    dashboard_routes,
    docs_page,
    engine_routes,
    ledger_routes,
    market_rule_routes,
    openai_routes,
    ops_routes,
    pacing_routes,
    sglang_routes,
)
from inference_auctions.server.api.bodies import BodyDecoder
from inference_auctions.server.api.deps import AppState, AuthenticationCache, RateLimiter
from inference_auctions.server.api.error_handlers import install_error_handlers
from inference_auctions.server.api.market_prices import MarketPrices
from inference_auctions.server.api.middleware import DirectRoutes, RequestIdMiddleware, find_routes
from inference_auctions.server.api.pacing_routes import prices_json
from inference_auctions.server.cluster.replica import rate_limit_share, replica_header
from inference_auctions.server.cluster.rule_agreement import RuleAgreement
from inference_auctions.server.engine.local_tokenizer import AUTO, ENGINE, load_tokenizer
from inference_auctions.server.engine.protocol import Engine
from inference_auctions.server.engine_choice import make_engine
from inference_auctions.server.gc_tuning import tune_collector
from inference_auctions.server.serving.service import AuctionService
from inference_auctions.server.settings import (
    EMULATED_MODEL_NAME,
    ServerSettings,
    without_password,
)
from inference_auctions.server.start_refusal import StartRefused, one_line_refusals

log = logging.getLogger(__name__)

# The routes that skip FastAPI's routing and dependency resolution (see
# `api.middleware.DirectRoutes`).
GENERATION_ENDPOINTS = (
    sglang_routes.generate,
    openai_routes.completions,
    openai_routes.chat_completions,
)


def create_app(settings: ServerSettings, engine: Engine | None = None) -> FastAPI:
    """The auction server. Without `engine`, one is made from the settings at startup."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # An empty database gets the schema; a current one is kept.
        upgrade_schema(settings.database_url)
        # The WAL checkpoints of a SQLite file run beside this process's ledger thread
        # (`billing.wal_checkpoints`).
        ledger = Ledger.from_url(
            settings.database_url,
            checkpoint_in_background=True,
            pool_size=settings.database_pool_size,
            max_overflow=settings.database_max_overflow,
        )
        agreement = await _agreed_rule(app, ledger, settings)
        backend = engine or make_engine_from(settings)
        await backend.start()
        service = AuctionService(settings, ledger, backend)
        limiter = RateLimiter(*rate_limit_share(settings))
        app.state.services = AppState(
            settings=settings,
            service=service,
            ledger=ledger,
            limiter=limiter,
            keys=AuthenticationCache(),
            market_prices=MarketPrices(ledger, prices_json),
            agreement=agreement,
        )
        scheduler = None
        if settings.run_jobs:
            election = settings.jobs_leader_election
            scheduler = start_ledger_jobs(ledger, settings, leader_election=election)
        await service.start()
        tune_collector()
        ledger_url = without_password(settings.database_url)
        log.info("auction server ready: engine %s, ledger %s", backend.name, ledger_url)
        try:
            yield
        finally:
            await service.stop()  # drain: waiting requests are cleared and served first
            if scheduler is not None:
                scheduler.shutdown(wait=False)
            await backend.close()
            await agreement.stop()
            ledger.close()
            decoder.close()

    app = FastAPI(
        title="inference-auctions",
        summary="A truthful priority auction for LLM serving, in front of SGLang.",
        version="0.1.0",
        lifespan=lifespan,
        # FastAPI's own OpenTelemetry instrumentation looks up the global providers on every
        # request (about 4% of the serving path's CPU); the server exports Prometheus metrics.
        telemetry={"tracing": False, "metrics": False, "logs": False},
        # /docs is served from installed files (api/docs_page.py); FastAPI's pages use a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.start_refused = False
    # A refusal at start (another rule on the ledger) reaches uvicorn without its traceback.
    # The router calls its lifespan through the instance, so the wrapped one takes its place
    # without a middleware on every request's path.
    wrapped = one_line_refusals(app.router.lifespan)
    app.router.lifespan = wrapped  # type: ignore[method-assign,assignment]  # see above
    decoder = app.state.body_decoder = BodyDecoder()
    install_error_handlers(app)
    routers = [
        module.router
        for module in (
            sglang_routes,
            engine_routes,
            openai_routes,
            ledger_routes,
            pacing_routes,
            market_rule_routes,
            admin_routes,
            admin_access_routes,
            admin_money_routes,
            ops_routes,
            dashboard_routes,
            dashboard_page,
            docs_page,
        )
    ]
    for router in routers:
        app.include_router(router)
    # Added first, so innermost: the generation routes are most of the traffic.
    generation = find_routes(routers, GENERATION_ENDPOINTS)
    app.add_middleware(DirectRoutes, routes=generation, exception_handlers=app.exception_handlers)
    app.add_middleware(RequestIdMiddleware, extra_headers=[replica_header(settings)])
    return app


async def _agreed_rule(app: FastAPI, ledger: Ledger, settings: ServerSettings) -> RuleAgreement:
    """This process's pricing rule, recorded in the ledger beside those of the other replicas;
    the ledger closed and the error raised if it cannot be."""
    agreement = RuleAgreement(ledger, settings)
    try:
        ledger.warn_if_autovacuum_off()
        await agreement.start()  # replicas sharing the ledger clear under one rule
    except RuleDisagreement as refusal:  # its message says all: one line, no traceback
        log.error("not starting: %s", refusal)
        ledger.close()
        app.state.start_refused = True
        raise StartRefused(str(refusal)) from None
    except Exception as error:
        log.error("not starting: %s", error)
        ledger.close()
        raise
    return agreement


def make_engine_from(settings: ServerSettings) -> Engine:
    """The SGLang backend when a URL is set, otherwise the embedded emulator."""
    if settings.engine_url is None:
        log.warning(
            "no --engine-url: serving with the embedded SGLang EMULATOR (cost model of an H100 "
            "serving a 32B model), not a real model"
        )
        if settings.tokenizer not in (ENGINE, AUTO):
            log.warning("--tokenizer is ignored: the embedded emulator tokenizes in process")
    tokenizer = load_tokenizer(settings.tokenizer) if settings.engine_url is not None else None
    key = settings.engine_api_key
    return make_engine(
        settings.engine_url,
        mode=settings.engine_mode,
        cache_tokens=settings.emulator_cache_tokens,
        max_running_requests=settings.emulator_max_running_requests,
        time_scale=settings.emulator_time_scale,
        # The server applies the stall deadline and the total cap itself, chunk by chunk.
        timeout=None,
        model_name=settings.model_name or EMULATED_MODEL_NAME,
        api_key=key.get_secret_value() if key is not None else None,
        ca_bundle=settings.engine_ca_bundle,
        tokenizer=tokenizer,
        learn_tokenizer=settings.tokenizer == AUTO,
        vocab_size=settings.engine_vocab_size,
    )
