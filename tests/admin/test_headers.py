"""Security headers on a live daemon's admin API: every kind of response (200s of JSON, text,
HTML, JS and CSS; 401, 404, 422) says ``X-Content-Type-Options: nosniff`` and
``X-Frame-Options: DENY``; the dashboard page sends a Content-Security-Policy that allows only
its own script, stylesheet and API (no inline code, no other origin, no framing), and the page
itself has no inline script or style for that policy to block. In process: a 500 from an
unhandled error carries the headers too. (That the dashboard works under its policy is
tests/admin/test_dashboard.py's: Chromium reports no violation.)"""

from __future__ import annotations

import asyncio
import re
from html.parser import HTMLParser

import httpx

from kvstore import KVLayout, Metrics, TieredStore
from kvstore.tiers.host import HostTier
from server.admin import app_for
from tests.admin.conftest import TOKEN, AdminDaemon

SECURITY = {"x-content-type-options": "nosniff", "x-frame-options": "DENY"}


def assert_secure(r: httpx.Response) -> None:
    got = {k: r.headers.get(k) for k in SECURITY}
    assert got == SECURITY, (r.request.method, r.request.url.path, r.status_code, got)


def test_every_kind_of_response_says_nosniff_and_no_framing(admin_daemon: AdminDaemon) -> None:
    with admin_daemon.client() as api, admin_daemon.client(token=None) as anon:
        responses = [
            anon.get("/healthz"), anon.get("/readyz"), api.get("/readyz"),
            api.get("/v1/stats"), api.get("/v1/stats/history"), api.get("/metrics"),
            api.get("/"), api.get("/dashboard.js"), api.get("/dashboard.css"),
            api.get("/openapi.json"), api.get("/docs"),
            api.post("/v1/lookup", json={"block_keys": ["00" * 16]}),
            anon.get("/v1/stats"), anon.post("/v1/lookup", content=b"{"),  # 401
            api.get("/no/such/route"), api.get("/v1/flushes/7"),  # 404
            api.post("/v1/tiers/nvme/policy", json={"policy": "lru"}),  # 404
            api.post("/v1/lookup", json={"block_keys": ["xyz"]}),  # 422
        ]
    assert {r.status_code for r in responses} == {200, 401, 404, 422}
    for r in responses:
        assert_secure(r)


class _Inline(HTMLParser):
    """Whatever in a page a CSP without 'unsafe-inline' would block."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {k for k, _ in attrs}
        if tag == "script" and "src" not in names:
            self.found.append("inline <script>")
        if tag == "style":
            self.found.append("<style>")
        self.found += [f"{k}= on <{tag}>" for k in names if k == "style" or k.startswith("on")]


def test_the_dashboard_sends_a_csp_that_its_page_lives_within(admin_daemon: AdminDaemon) -> None:
    with admin_daemon.client() as api:
        page = api.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = dict(d.strip().split(" ", 1) for d in page.headers["content-security-policy"].split(";"))
    assert csp["default-src"] == "'none'"  # anything not named below: nothing
    assert csp["script-src"] == csp["style-src"] == csp["connect-src"] == "'self'"
    assert csp["frame-ancestors"] == "'none'" and csp["base-uri"] == "'none'"
    assert not re.search(r"unsafe-|\*|https?:|data:", page.headers["content-security-policy"])
    inline = _Inline()
    inline.feed(page.text)
    assert inline.found == []
    # the page loads only what the policy allows: its own script and stylesheet
    assert re.findall(r'<script src="([^"]+)"', page.text) == ["/dashboard.js"]
    assert re.findall(r'<link rel="stylesheet" href="([^"]+)"', page.text) == ["/dashboard.css"]


def test_a_server_error_carries_the_headers_too() -> None:
    layout = KVLayout(1, 1, 8, 4, "float16")
    store = TieredStore(layout, [HostTier.build("host", layout, 4, Metrics())])
    try:
        app = app_for(store, TOKEN)

        @app.get("/boom")
        def boom() -> None:
            raise RuntimeError("a bug")

        async def get() -> httpx.Response:
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://admin") as c:
                return await c.get("/boom", headers={"Authorization": f"Bearer {TOKEN}"})

        r = asyncio.run(get())
    finally:
        store.close()
    assert r.status_code == 500
    assert_secure(r)
