"""SGLang's management endpoints, as clients of SGLang expect them on this server.

`/model_info` and `/server_info` describe this server (and the engine behind it), also under
the deprecated names SGLang still serves (`sgl.RuntimeEndpoint` calls `/get_model_info`
first); flushing the engine's prefix cache slows every user's next requests, so `/flush_cache`
needs the admin key (SGLang's `bench_serving --flush-cache` must then run with it).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from inference_auctions.server.api.deps import AdminUser, CurrentUser, State
from inference_auctions.server.api.model_name import served_model
from inference_auctions.server.cluster.replica import replica_name
from inference_auctions.server.engine.errors import EngineError
from inference_auctions.server.errors import EngineFailed

router = APIRouter(tags=["sglang"])


@router.get("/model_info", summary="Model information (SGLang-compatible)")
@router.get(
    "/get_model_info",
    summary="Model information (SGLang's deprecated alias)",
    operation_id="get_model_info_alias",
    deprecated=True,
)
async def model_info(_: CurrentUser, state: State) -> dict[str, Any]:
    """The served model's name, as SGLang's `/model_info` gives it."""
    name = served_model(state)
    return {"model_path": name, "tokenizer_path": None, "is_generation": True}


@router.get("/server_info", summary="Server information (SGLang-compatible)")
@router.get(
    "/get_server_info",
    summary="Server information (SGLang's deprecated alias)",
    operation_id="get_server_info_alias",
    deprecated=True,
)
async def server_info(state: State) -> dict[str, Any]:
    """This server's scheduling settings, in the spirit of SGLang's `/server_info`; no key
    needed (routers such as SMG probe it, as SGLang's)."""
    settings = state.settings
    return {
        "model_path": served_model(state),
        "engine": state.service.engine_name,
        "engine_mode": settings.engine_mode,
        "batch_size": settings.batch_size,
        "max_wait_ms": settings.max_wait_ms,
        "max_inflight": settings.max_inflight,
        **state.service.engine_capacity(),
        "schedule_policy": "average-bid-dfs auction",
        "replica": replica_name(settings),
    }


# One route per method: a route with both would publish one operationId twice, which makes
# the OpenAPI document invalid (FastAPI warns when it builds it).
@router.get("/flush_cache", summary="Flush the engine's cache", operation_id="flush_cache_get")
@router.post("/flush_cache", summary="Flush the engine's cache", operation_id="flush_cache_post")
async def flush_cache(_: AdminUser, state: State) -> PlainTextResponse:
    """Empty the engine's prefix cache: 200, or 400 while requests run or wait (as SGLang)."""
    try:
        flushed = await state.service.flush_engine_cache()
    except EngineError as error:
        raise EngineFailed(f"the engine could not flush its cache: {error}") from None
    if flushed:
        return PlainTextResponse("Cache flushed.\n")
    return PlainTextResponse(
        "Cache not flushed: requests are running or waiting. Retry when the engine is idle.\n",
        status_code=400,
    )
