"""The dashboard: static HTML, JS and CSS (no build step) that poll the stats routes.

The page loads only its own script and stylesheet (no inline script or style, no other
origin) and fetches only this origin, so its Content-Security-Policy allows exactly that; no
site may frame it (``frame-ancestors``; every response also says ``X-Frame-Options: DENY``,
:mod:`server.admin.headers`)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from server.admin import schemas as s

STATIC = Path(__file__).parents[1] / "static"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
router = APIRouter(tags=["dashboard"], responses={401: s.ERRORS[401]})


@router.get("/", response_class=FileResponse, summary="The dashboard (HTML)",
            responses={200: {"content": {"text/html": {"schema": {"type": "string"}}},
                             "description": "the page"}})
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html",
                        headers={"Cache-Control": "no-store", "Content-Security-Policy": CSP})


@router.get("/dashboard.js", response_class=FileResponse, include_in_schema=False)
def script() -> FileResponse:
    return FileResponse(STATIC / "dashboard.js", media_type="text/javascript")


@router.get("/dashboard.css", response_class=FileResponse, include_in_schema=False)
def style() -> FileResponse:
    return FileResponse(STATIC / "dashboard.css", media_type="text/css")
