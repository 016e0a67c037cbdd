"""Every route of the admin app but /healthz and /readyz refuses a missing or wrong token, on
the live port of a real daemon, and so does a path the app does not have; the two open ones tell
a client without the token nothing but up / ready. The token is never echoed or logged."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Iterator
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.routing import APIRoute

from kvstore import KVLayout, Metrics, TieredStore
from kvstore.tiers.host import HostTier
from server.admin import app_for
from tests.admin.conftest import TOKEN, AdminDaemon

PATH_VALUES = {"namespace_id": "00" * 16, "job_id": "1", "name": "host", "pin_id": "1",
               "tier": "host"}


def every_route() -> list[tuple[str, str]]:
    """(method, path) of every route the admin app has, its path parameters filled in."""
    layout = KVLayout(1, 1, 8, 4, "float16")
    store = TieredStore(layout, [HostTier.build("host", layout, 4, Metrics())])
    app = app_for(store, "unused")
    out = []
    for route in flatten(app.routes):
        path = re.sub(r"\{(\w+)\}", lambda m: PATH_VALUES[m[1]], route.path)
        for method in sorted(route.methods - {"HEAD"}):
            out.append((method, path))
    store.close()
    return out


def flatten(routes: list[Any], prefix: str = "") -> Iterator[APIRoute]:
    """The app's routes, those of included routers too (newer FastAPI keeps an included router
    as one entry that holds the original router)."""
    for r in routes:
        inner = getattr(r, "original_router", None)
        if inner is not None:
            yield from flatten(inner.routes, prefix + r.include_context.prefix)
        elif hasattr(r, "methods"):
            yield r if not prefix else APIRoute(prefix + r.path, r.endpoint, methods=r.methods)
        else:
            raise AssertionError(f"a route the test cannot list: {r!r}")


ROUTES = every_route()


def test_the_route_list_covers_the_api() -> None:
    paths = {p for _, p in ROUTES}
    assert {"/healthz", "/readyz", "/v1/stats", "/metrics", "/v1/lookup", "/v1/events", "/",
            f"/v1/namespaces/{'00' * 16}", "/v1/tiers/host/policy", "/openapi.json",
            "/docs"} <= paths


def basic(password: str) -> str:
    return "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()


WRONG = [None, "Bearer wrong", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", basic("wrong"),
         f"Token {TOKEN}", "Basic !!!notbase64"]


OPEN = {"/healthz": {"status": "ok"}, "/readyz": {"ready": True}}


def test_every_route_but_healthz_and_readyz_refuses_a_missing_or_wrong_token(
        admin_daemon: AdminDaemon) -> None:
    with httpx.Client(base_url=admin_daemon.url, timeout=30) as c:
        for method, path in [*ROUTES, ("GET", "/no/such/route"), ("PUT", "/v1/stats")]:
            for auth in WRONG:
                headers = {"Authorization": auth} if auth else {}
                r = c.request(method, path, headers=headers, json={"policy": "lru"})
                if path in OPEN:  # up / ready, and nothing more (no tier, no server address)
                    assert r.status_code == 200, (method, path)
                    assert r.json() == OPEN[path], (method, path, r.text)
                    continue
                assert r.status_code == 401, (method, path, auth, r.status_code)
                assert "missing or wrong token" in r.json()["detail"]
                assert TOKEN not in r.text
                assert r.headers["www-authenticate"].startswith("Basic")
        # the right token, as a bearer token or as HTTP Basic's password (a browser), opens them
        for auth in (f"Bearer {TOKEN}", basic(TOKEN)):
            assert c.get("/v1/stats", headers={"Authorization": auth}).status_code == 200
            # with it, readiness names each tier's state too
            ready = c.get("/readyz", headers={"Authorization": auth}).json()
            assert ready["ready"] is True
            assert [(t["name"], t["ready"]) for t in ready["tiers"]] == [("host", True),
                                                                          ("disk", True)]
        # the token is checked before the body is parsed: malformed JSON without it is a 401
        r = c.post("/v1/lookup", content=b"{not json",
                   headers={"Content-Type": "application/json"})
        assert r.status_code == 401 and "missing or wrong token" in r.json()["detail"]
    assert TOKEN not in admin_daemon.log()


def test_under_a_prefix_the_open_paths_stay_open_and_the_rest_stay_shut() -> None:
    """A library user may mount the app in a bigger one: the token check sees the app's own
    paths, not the prefix."""
    layout = KVLayout(1, 1, 8, 4, "float16")
    store = TieredStore(layout, [HostTier.build("host", layout, 4, Metrics())])
    outer = FastAPI()
    outer.mount("/admin", app_for(store, TOKEN))

    async def get(path: str, **headers: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=outer)
        async with httpx.AsyncClient(transport=transport, base_url="http://host") as c:
            return await c.get(path, headers=headers)

    try:
        assert asyncio.run(get("/admin/healthz")).json() == OPEN["/healthz"]
        assert asyncio.run(get("/admin/readyz")).json() == OPEN["/readyz"]
        assert asyncio.run(get("/admin/v1/stats")).status_code == 401
        authed = asyncio.run(get("/admin/v1/stats", Authorization=f"Bearer {TOKEN}"))
        assert authed.status_code == 200 and authed.json()["tiers"][0]["name"] == "host"
    finally:
        store.close()
