"""`GET /docs`: Swagger UI for the OpenAPI schema, from files shipped in this package.

FastAPI's own page loads Swagger UI from a CDN, so without internet it is blank, and FastAPI
writes OpenAPI 3.1, which Swagger UI reads from version 5 on. The scripts and styles are a
Swagger UI 5 build kept in `swagger_ui/` (its README says which and where from), and the page
names no other origin.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

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
    return (files("inference_auctions.server.api") / "swagger_ui" / name).read_bytes()


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
        # Swagger UI would otherwise send the schema to an online validator for a badge.
        swagger_ui_parameters={"validatorUrl": None},
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
