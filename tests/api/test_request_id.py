"""`x-request-id` on every response, including the ones for unexpected errors."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from inference_auctions.server.api.error_handlers import install_error_handlers
from inference_auctions.server.api.middleware import RequestIdMiddleware


def _app(extra_headers: list[tuple[bytes, bytes]] | None = None) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    if extra_headers is None:
        app.add_middleware(RequestIdMiddleware)
    else:
        app.add_middleware(RequestIdMiddleware, extra_headers=extra_headers)

    @app.get("/ok")
    async def ok() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/boom")
    async def boom() -> dict[str, str]:
        raise RuntimeError("a bug")

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        return StreamingResponse(iter([b"data: 1\n\n"]), media_type="text/event-stream")

    return app


async def _get(path: str, **headers: str) -> httpx.Response:
    return await _get_from(_app(), path, headers)


async def _get_from(app: FastAPI, path: str, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.get(path, headers=headers)


@pytest.mark.anyio
async def test_every_response_carries_one_request_id() -> None:
    for path in ("/ok", "/stream", "/missing"):
        response = await _get(path)
        assert response.headers["x-request-id"].startswith("req_"), path
        assert len(response.headers.get_list("x-request-id")) == 1


@pytest.mark.anyio
async def test_an_unexpected_error_is_the_apps_json_500_with_a_request_id() -> None:
    response = await _get("/boom")
    assert response.status_code == 500
    assert response.json()["error"]["message"].startswith("internal error")
    assert response.headers["x-request-id"].startswith("req_")


@pytest.mark.anyio
async def test_a_well_formed_id_is_kept_and_anything_else_replaced() -> None:
    assert (await _get("/ok", **{"x-request-id": "trace-7"})).headers["x-request-id"] == "trace-7"
    long = "x" * 200
    assert (await _get("/ok", **{"x-request-id": long})).headers["x-request-id"].startswith("req_")


@pytest.mark.anyio
async def test_the_extra_headers_follow_the_id_on_every_response() -> None:
    app = _app(extra_headers=[(b"x-replica", b"gpu-3")])
    for path in ("/ok", "/stream", "/missing", "/boom"):
        names = [name for name, _ in (await _get_from(app, path, {})).headers.multi_items()]
        assert names[-2:] == ["x-request-id", "x-replica"], path
        assert names.count("x-replica") == 1
