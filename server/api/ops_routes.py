"""`GET /health`, `GET /health/live`, `GET /metrics` (Prometheus) and `GET /version`; no key
needed.

`/health` is the readiness check: it fails while the engine or the ledger does, so that a load
balancer sends this replica nothing it cannot serve. `/health/live` is the liveness check: it
answers while the process's event loop does, whatever the engine and the ledger do, so that a
supervisor restarts a hung process but not one waiting for SGLang to come back (a restart
would not bring SGLang back, and would drop the requests this one holds).

All of them answer for this replica alone. `/health` names it, and when it has a configured
name (`INFERENCE_AUCTION_REPLICA_NAME`) every metric sample carries it as the label `replica`,
so that a scraper of several replicas can tell them apart.
"""

from __future__ import annotations

import asyncio
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inference_auctions.server.api.deps import State
from inference_auctions.server.cluster.replica import ReplicaLabelled, replica_name

router = APIRouter(tags=["operations"])
# A health check must answer quickly even when the database does not.
_LEDGER_PING_SECONDS = 2.0


@router.get("/health")
async def health(state: State) -> Response:
    """200 while both the engine and the ledger answer, and neither the ledger's last commit
    nor this server's last heartbeat write failed; 503 (naming which) otherwise."""
    service = state.service
    engine_ok = await service.engine_healthy()
    answers = await _ledger_answers(state)
    # Unreachable says more than unable to write; a write failure counts only while it reads.
    # The heartbeat writes on a schedule, so an idle server sees it too.
    cannot_write = (
        (service.writer.cannot_write() or state.agreement.cannot_write()) if answers else None
    )
    ledger_ok = answers and cannot_write is None
    problems = [name for name, ok in (("engine", engine_ok), ("ledger", ledger_ok)) if not ok]
    load = service.load()
    body: dict[str, Any] = {
        "status": "ok" if not problems else " and ".join(problems) + " unavailable",
        "engine": service.engine_name,
        "ledger": "ok"
        if ledger_ok
        else "unavailable"
        if cannot_write is None
        else f"cannot write: {cannot_write}",
        "queue": load.queue,
        "inflight": load.inflight,
        "replica": replica_name(state.settings),
    }
    return JSONResponse(body, status_code=503 if problems else 200)


@router.get("/health/live")
async def liveness(state: State) -> dict[str, str]:
    """200 while the server's event loop answers, whatever the engine and the ledger do: for
    a liveness probe (`/health` is the readiness probe)."""
    return {"status": "alive", "replica": replica_name(state.settings)}


async def _ledger_answers(state: State) -> bool:
    try:
        await asyncio.wait_for(asyncio.to_thread(state.ledger.ping), _LEDGER_PING_SECONDS)
    except Exception:  # unreachable, locked past the deadline, or refusing: all unhealthy
        return False
    return True


@router.get("/metrics")
async def metrics(state: State) -> Response:
    """Prometheus text format; with `replica_name` set, every sample carries it as `replica`."""
    served = state.service.metrics
    name = state.settings.replica_name
    if name is None:  # one server alone: its samples stay as they always were
        return Response(served.render(), media_type=CONTENT_TYPE_LATEST)
    labelled = ReplicaLabelled(served.registry, name)
    return Response(generate_latest(labelled), media_type=CONTENT_TYPE_LATEST)


@router.get("/version")
async def server_version() -> dict[str, str]:
    """This server's version, as SGLang's `/version` answers it (routers probe it)."""
    try:
        number = version("inference-auctions")
    except PackageNotFoundError:  # run from a source tree that was never installed
        number = "unknown"
    return {"version": number}
