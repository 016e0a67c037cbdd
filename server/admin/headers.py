"""Security headers on every response of the admin app: the browser neither guesses a type
other than the declared one (``X-Content-Type-Options: nosniff``) nor shows a page of the app
in another site's frame (``X-Frame-Options: DENY``; the dashboard's CSP also says
``frame-ancestors 'none'``). A response that sets one of them itself keeps its own.

The app wraps its whole middleware stack in this (:mod:`.main`), Starlette's
ServerErrorMiddleware included, so that its 500s carry the headers too."""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADERS = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY"}


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)
