"""`GET /health` and `GET /metrics` (Prometheus); no key needed."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from server.api.deps import State

router = APIRouter(tags=["operations"])
# A health check must answer quickly even when the database does not.
_LEDGER_PING_SECONDS = 2.0


@router.get("/health")
async def health(state: State) -> Response:
    """200 while both the engine and the ledger answer, 503 (naming which) otherwise."""
    service = state.service
    engine_ok = await service.engine.health()
    ledger_ok = await _ledger_answers(state)
    problems = [name for name, ok in (("engine", engine_ok), ("ledger", ledger_ok)) if not ok]
    body: dict[str, Any] = {
        "status": "ok" if not problems else " and ".join(problems) + " unavailable",
        "engine": service.engine.name,
        "ledger": "ok" if ledger_ok else "unavailable",
        "queue": len(service.pool),
        "inflight": service.inflight,
    }
    return JSONResponse(body, status_code=503 if problems else 200)


async def _ledger_answers(state: State) -> bool:
    try:
        await asyncio.wait_for(asyncio.to_thread(state.ledger.ping), _LEDGER_PING_SECONDS)
    except Exception:  # unreachable, locked past the deadline, or refusing: all unhealthy
        return False
    return True


@router.get("/metrics")
async def metrics(state: State) -> Response:
    """Prometheus text format."""
    return Response(state.service.metrics.render(), media_type=CONTENT_TYPE_LATEST)
