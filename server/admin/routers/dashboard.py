"""The dashboard: static HTML, JS and CSS (no build step) that poll the stats routes."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from server.admin import schemas as s
from server.admin.deps import Auth

STATIC = Path(__file__).parents[1] / "static"
router = APIRouter(dependencies=Auth, tags=["dashboard"], responses={401: s.ERRORS[401]})


@router.get("/", response_class=FileResponse, summary="The dashboard (HTML)",
            responses={200: {"content": {"text/html": {"schema": {"type": "string"}}},
                             "description": "the page"}})
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html",
                        headers={"Cache-Control": "no-store"})


@router.get("/dashboard.js", response_class=FileResponse, include_in_schema=False)
def script() -> FileResponse:
    return FileResponse(STATIC / "dashboard.js", media_type="text/javascript")


@router.get("/dashboard.css", response_class=FileResponse, include_in_schema=False)
def style() -> FileResponse:
    return FileResponse(STATIC / "dashboard.css", media_type="text/css")
