"""`GET /dashboard`: the dashboard's page and its scripts and styles, from the package.

Every response carries a Content-Security-Policy that lets the page load and call only this
server: no inline script, no third-party origin, no framing.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

from inference_auctions.server.errors import NotFound

router = APIRouter(include_in_schema=False)

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "format.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


@cache
def _read(name: str) -> bytes:
    return (files("inference_auctions.server.dashboard") / "static" / name).read_bytes()


def _headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        "Cache-Control": "no-cache",
    }


@router.get("/dashboard")
async def page() -> Response:
    """The dashboard (sign-in, then the operator or the user view)."""
    return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=_headers())


@router.get("/dashboard/{asset}")
async def asset(asset: str) -> Response:
    """One of the page's own scripts or stylesheets."""
    media_type = _ASSETS.get(asset)
    if media_type is None:
        raise NotFound(f"the dashboard has no file {asset[:64]!r}")
    return Response(_read(asset), media_type=media_type, headers=_headers())
