"""`GET /health` and `GET /metrics` (Prometheus); no key needed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from server.api.deps import State

router = APIRouter(tags=["operations"])


@router.get("/health")
async def health(state: State) -> Response:
    """200 while the engine answers, 503 otherwise."""
    service = state.service
    healthy = await service.engine.health()
    body: dict[str, Any] = {
        "status": "ok" if healthy else "engine unavailable",
        "engine": service.engine.name,
        "queue": len(service.pool),
        "inflight": service.inflight,
    }
    return JSONResponse(body, status_code=200 if healthy else 503)


@router.get("/metrics")
async def metrics(state: State) -> Response:
    """Prometheus text format."""
    return Response(state.service.metrics.render(), media_type=CONTENT_TYPE_LATEST)
