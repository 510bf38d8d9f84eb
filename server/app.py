"""The FastAPI application: services built at startup, drained at shutdown."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from billing import Ledger
from billing.jobs import start_scheduler
from billing.migrate import upgrade
from server.api import (
    admin_routes,
    engine_routes,
    ledger_routes,
    openai_routes,
    ops_routes,
    sglang_routes,
)
from server.api.deps import AppState, AuthenticationCache, RateLimiter
from server.api.error_handlers import install_error_handlers
from server.engine.base import Engine
from server.engine.factory import make_engine
from server.service import AuctionService
from server.settings import ServerSettings

log = logging.getLogger(__name__)


def create_app(settings: ServerSettings, engine: Engine | None = None) -> FastAPI:
    """The auction server. Without `engine`, one is made from the settings at startup."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        upgrade(settings.database_url)  # an empty database gets the schema; a current one is kept
        ledger = Ledger.from_url(settings.database_url)
        backend = engine or make_engine_from(settings)
        await backend.start()
        service = AuctionService(settings, ledger, backend)
        limiter = RateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst)
        app.state.services = AppState(
            service=service, ledger=ledger, limiter=limiter, keys=AuthenticationCache()
        )
        scheduler = start_scheduler(ledger, settings) if settings.run_jobs else None
        await service.start()
        log.info(
            "auction server ready: engine %s, ledger %s", backend.name, _safe(settings.database_url)
        )
        try:
            yield
        finally:
            await service.stop()  # drain: waiting requests are cleared and served first
            if scheduler is not None:
                scheduler.shutdown(wait=False)
            await backend.close()
            ledger.close()

    app = FastAPI(
        title="inference-auctions",
        summary="A truthful priority auction for LLM serving, in front of SGLang.",
        version="0.1.0",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    routes = (sglang_routes, engine_routes, openai_routes, ledger_routes, admin_routes, ops_routes)
    for module in routes:
        app.include_router(module.router)
    return app


def make_engine_from(settings: ServerSettings) -> Engine:
    """The SGLang backend when a URL is set, otherwise the embedded emulator."""
    if settings.engine_url is None:
        log.warning(
            "no --engine-url: serving with the embedded SGLang EMULATOR (cost model of an H100 "
            "serving a 32B model), not a real model"
        )
    return make_engine(
        settings.engine_url,
        mode=settings.engine_mode,
        cache_tokens=settings.emulator_cache_tokens,
        time_scale=settings.emulator_time_scale,
        # The server applies the stall deadline and the total cap itself, chunk by chunk.
        timeout=None,
        model_name=settings.model_name,
    )


def _safe(url: str) -> str:
    """The URL without its password, for logs."""
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    return f"{scheme}{sep}{credentials.split(':')[0]}:***@{host}"
