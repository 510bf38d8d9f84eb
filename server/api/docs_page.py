"""`GET /docs`: Swagger UI for the OpenAPI schema, from files installed with the server.

FastAPI's own page loads Swagger UI from a CDN, so without internet it is blank. The scripts
and styles come here from the `swagger-ui-bundle` distribution instead, a dependency of the
server, and the page names no other origin.
"""

from __future__ import annotations

from functools import cache

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from swagger_ui_bundle import swagger_ui_path

from inference_auctions.server.errors import NotFound

router = APIRouter(include_in_schema=False)

ASSETS_PATH = "/docs/assets"
_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}


@cache
def _read(name: str) -> bytes:
    content: bytes = (swagger_ui_path / name).read_bytes()
    return content


@router.get("/docs")
async def docs() -> HTMLResponse:
    """The API's reference, interactive."""
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="inference-auctions: API",
        swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS_PATH}/favicon-32x32.png",
        oauth2_redirect_url=None,
    )


@router.get(ASSETS_PATH + "/{name}")
async def asset(name: str) -> Response:
    """One of Swagger UI's files."""
    media_type = _ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"the API docs have no file {name[:64]!r}")
    return Response(
        _read(name), media_type=media_type, headers={"Cache-Control": "public, max-age=86400"}
    )
